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
CREATE FUNCTION pgfence_guard() RETURNS trigger
    LANGUAGE plpgsql
AS $$
DECLARE
    col       text := COALESCE(TG_ARGV[0], 'fence_token');
    old_token bigint;
    new_token bigint;
    presented text;
BEGIN
    IF TG_OP = 'UPDATE' THEN
        EXECUTE format('SELECT ($1).%1$I::bigint, ($2).%1$I::bigint', col)
            INTO old_token, new_token USING OLD, NEW;
        IF new_token IS NULL OR (old_token IS NOT NULL AND new_token < old_token) THEN
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
            EXECUTE format('SELECT ($1).%1$I::bigint', col) INTO old_token USING OLD;
            IF old_token IS NOT NULL AND presented::bigint < old_token THEN
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
