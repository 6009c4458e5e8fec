-- pgfence_guard is a trigger function that protects a user table against
-- writes from stale lock holders, whatever SQL path the write comes from.
--
-- Attach it to a table that has a bigint fencing column (fence_token unless
-- another name is given as the trigger argument):
--
--   CREATE TRIGGER accounts_fence
--       BEFORE UPDATE OR DELETE ON accounts
--       FOR EACH ROW EXECUTE FUNCTION pgfence_guard('fence_token');
--
-- An UPDATE that would move the column backwards (NEW < OLD) is rejected with
-- SQLSTATE PF001, which the fence package reports as pgfence.ErrFenced.
-- An UPDATE that leaves the column unchanged is allowed (the non-strict form);
-- one that sets it to NULL is rejected too. DELETE cannot carry a token, so a
-- DELETE is only guarded when the session has set pgfence.token (the fence
-- package's guarded deletes do, with set_config('pgfence.token', ..., true));
-- a DELETE with a token older than the row's is rejected with PF001.
--
-- Cost: for the default column (no argument, or 'fence_token') the check
-- reads NEW.fence_token and OLD.fence_token directly, which PL/pgSQL plans
-- once per table and session; any other column is read through to_jsonb of
-- the row, which costs more per row but never parses SQL at run time. To
-- skip the call for rows it would accept, attach it behind WHEN conditions
-- (see the fence package documentation):
--
--   CREATE TRIGGER accounts_fence_update BEFORE UPDATE ON accounts FOR EACH ROW
--       WHEN (NEW.fence_token IS NULL OR NEW.fence_token < OLD.fence_token)
--       EXECUTE FUNCTION pgfence_guard('fence_token');
--   CREATE TRIGGER accounts_fence_delete BEFORE DELETE ON accounts FOR EACH ROW
--       WHEN (current_setting('pgfence.token', true) <> '')
--       EXECUTE FUNCTION pgfence_guard('fence_token');
CREATE FUNCTION pgfence_guard() RETURNS trigger
    LANGUAGE plpgsql
AS $$
DECLARE
    old_token bigint;
    new_token bigint;
    presented text;
    old_row   jsonb;
    new_row   jsonb;
BEGIN
    IF TG_OP = 'UPDATE' THEN
        IF TG_NARGS = 0 OR TG_ARGV[0] = 'fence_token' THEN
            new_token := NEW.fence_token;
            old_token := OLD.fence_token;
        ELSE
            new_row := to_jsonb(NEW);
            IF NOT new_row ? TG_ARGV[0] THEN
                RAISE EXCEPTION 'pgfence_guard: table %.% has no column %', TG_TABLE_SCHEMA, TG_TABLE_NAME, TG_ARGV[0]
                    USING ERRCODE = 'undefined_column';
            END IF;
            new_token := (new_row ->> TG_ARGV[0])::bigint;
            old_token := (to_jsonb(OLD) ->> TG_ARGV[0])::bigint;
        END IF;
        IF new_token IS NULL OR new_token < old_token THEN
            RAISE EXCEPTION 'pgfence: stale fencing token % on %.% (current %)',
                    new_token, TG_TABLE_SCHEMA, TG_TABLE_NAME, old_token
                USING ERRCODE = 'PF001',
                      DETAIL = format('presented=%s current=%s', new_token, old_token),
                      HINT = 'A newer lock holder has written this row; this holder''s lock was lost.';
        END IF;
        RETURN NEW;
    ELSIF TG_OP = 'DELETE' THEN
        presented := current_setting('pgfence.token', true);
        IF presented IS NOT NULL AND presented <> '' THEN
            IF TG_NARGS = 0 OR TG_ARGV[0] = 'fence_token' THEN
                old_token := OLD.fence_token;
            ELSE
                old_row := to_jsonb(OLD);
                IF NOT old_row ? TG_ARGV[0] THEN
                    RAISE EXCEPTION 'pgfence_guard: table %.% has no column %', TG_TABLE_SCHEMA, TG_TABLE_NAME, TG_ARGV[0]
                        USING ERRCODE = 'undefined_column';
                END IF;
                old_token := (old_row ->> TG_ARGV[0])::bigint;
            END IF;
            IF presented::bigint < old_token THEN
                RAISE EXCEPTION 'pgfence: stale fencing token % on %.% (current %)',
                        presented, TG_TABLE_SCHEMA, TG_TABLE_NAME, old_token
                    USING ERRCODE = 'PF001',
                          DETAIL = format('presented=%s current=%s', presented, old_token),
                          HINT = 'A newer lock holder has written this row; this holder''s lock was lost.';
            END IF;
        END IF;
        RETURN OLD;
    END IF;
    RETURN NEW;
END;
$$;

COMMENT ON FUNCTION pgfence_guard() IS
    'Trigger: rejects (SQLSTATE PF001) writes that move a fencing column backwards.';
