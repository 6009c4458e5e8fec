-- 000004: trigger modes for fenced tables.
--
-- Replaces pgfence_guard (the default mode; existing triggers keep working)
-- with a body that resolves nothing through the writer's search_path and
-- reports a malformed pgfence.token setting (SQLSTATE PF003), and adds:
--
--   pgfence_guard_strict()   BEFORE UPDATE OR DELETE FOR EACH ROW: every
--                            UPDATE or DELETE must present a token >= the
--                            row's, in the guard column or in pgfence.token.
--   pgfence_guard_truncate() BEFORE TRUNCATE FOR EACH STATEMENT: rejects
--                            TRUNCATE (PF001).
--   pgfence_last_token()     the last token the sequence handed out
--                            (SECURITY DEFINER: writers have no privilege
--                            on the sequence).
--
-- Everything is created in current_schema() of the migrating connection
-- (the schema pgfence is installed in). Each function then gets its
-- search_path pinned to pg_catalog, that schema, pg_temp: at the end of this
-- file the session's path is set to that for the rest of the transaction and
-- captured with ALTER FUNCTION ... SET search_path FROM CURRENT. (Setting the
-- path first and creating the functions under it would create them in
-- pg_catalog, the first schema of that path.) The bodies also qualify every
-- built-in they call with pg_catalog, so no object another role creates can
-- change what they run.
DO $$
BEGIN
    IF pg_catalog.current_schema() IS NULL OR pg_catalog.current_schema() = 'pg_catalog' THEN
        RAISE EXCEPTION 'pgfence: migration 000004 needs the schema to install into first in search_path (current schema: %)',
            pg_catalog.current_schema();
    END IF;
END;
$$;

-- The version of the installed schema; the lock strategies check it.
CREATE OR REPLACE FUNCTION pgfence_schema_version() RETURNS integer
    LANGUAGE sql IMMUTABLE
AS $$ SELECT 4 $$;

COMMENT ON FUNCTION pgfence_schema_version() IS
    'The version of the pgfence schema installed here (the number of its last migration).';

-- pgfence_last_token returns the last fencing token pgfence_leases_fence_seq
-- handed out (0 before the first). nextval is not transactional, so this
-- counts tokens drawn by transactions that rolled back too: it is an upper
-- bound on every token any holder can present. It runs as its owner so that
-- writers need no privilege on the sequence, only EXECUTE on this function.
CREATE FUNCTION pgfence_last_token() RETURNS bigint
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER
AS $$
BEGIN
    RETURN (SELECT CASE WHEN s.is_called THEN s.last_value ELSE s.last_value OPERATOR(pg_catalog.-) 1 END
            FROM pgfence_leases_fence_seq AS s);
END;
$$;

REVOKE EXECUTE ON FUNCTION pgfence_last_token() FROM PUBLIC;

COMMENT ON FUNCTION pgfence_last_token() IS
    'The last fencing token pgfence_leases_fence_seq handed out (0 before the first); read by pgfence_guard_strict.';

-- pgfence_guard, the default (non-strict) mode, as in 000002 with the same
-- semantics:
--   UPDATE: rejects (PF001) NEW.col < OLD.col and NEW.col NULL; an UPDATE
--           that leaves the column unchanged passes unchecked.
--   DELETE: when pgfence.token is set (not empty), rejects (PF001) a row
--           whose token is newer; a DELETE without it passes unchecked.
-- New: a pgfence.token that is not a bigint raises PF003, and built-ins are
-- called through pg_catalog only.
CREATE OR REPLACE FUNCTION pgfence_guard() RETURNS trigger
    LANGUAGE plpgsql
AS $$
DECLARE
    old_token bigint;
    new_token bigint;
    setting   text;
    malformed boolean := false;
    presented bigint;
    new_row   jsonb;
    old_row   jsonb;
BEGIN
    IF TG_OP = 'UPDATE' THEN
        IF TG_NARGS = 0 OR TG_ARGV[0] = 'fence_token' THEN
            new_token := NEW.fence_token;
            old_token := OLD.fence_token;
        ELSE
            new_row := pg_catalog.to_jsonb(NEW);
            IF NOT new_row OPERATOR(pg_catalog.?) TG_ARGV[0] THEN
                RAISE EXCEPTION 'pgfence_guard: table %.% has no column %', TG_TABLE_SCHEMA, TG_TABLE_NAME, TG_ARGV[0]
                    USING ERRCODE = 'undefined_column';
            END IF;
            new_token := (new_row OPERATOR(pg_catalog.->>) TG_ARGV[0])::bigint;
            old_token := (pg_catalog.to_jsonb(OLD) OPERATOR(pg_catalog.->>) TG_ARGV[0])::bigint;
        END IF;
        IF new_token IS NULL OR new_token < old_token THEN
            RAISE EXCEPTION 'pgfence: stale fencing token % on %.% (current %)',
                    new_token, TG_TABLE_SCHEMA, TG_TABLE_NAME, old_token
                USING ERRCODE = 'PF001',
                      DETAIL = pg_catalog.format('presented=%s current=%s', new_token, old_token),
                      HINT = 'A newer lock holder has written this row; this holder''s lock was lost.';
        END IF;
        RETURN NEW;
    ELSIF TG_OP = 'DELETE' THEN
        setting := pg_catalog.current_setting('pgfence.token'::text, true);
        IF setting IS NOT NULL AND setting <> ''::text THEN
            -- Up to 18 digits (what set_config(..., token::text, true)
            -- writes) is a bigint; anything else is checked in full.
            IF setting !~ '^[0-9]{1,18}$'::text THEN
                IF setting !~ '^[[:space:]]*[-+]?[0-9]{1,19}[[:space:]]*$'::text THEN
                    malformed := true;
                ELSIF setting::numeric NOT BETWEEN -9223372036854775808::numeric AND 9223372036854775807::numeric THEN
                    malformed := true;
                END IF;
            END IF;
            IF malformed THEN
                RAISE EXCEPTION 'pgfence: malformed pgfence.token setting %: want a fencing token (a bigint) or an empty string',
                        pg_catalog.quote_literal(setting)
                    USING ERRCODE = 'PF003',
                          HINT = 'Set it with set_config(''pgfence.token'', token::text, true).';
            END IF;
            presented := setting::bigint;
            IF TG_NARGS = 0 OR TG_ARGV[0] = 'fence_token' THEN
                old_token := OLD.fence_token;
            ELSE
                old_row := pg_catalog.to_jsonb(OLD);
                IF NOT old_row OPERATOR(pg_catalog.?) TG_ARGV[0] THEN
                    RAISE EXCEPTION 'pgfence_guard: table %.% has no column %', TG_TABLE_SCHEMA, TG_TABLE_NAME, TG_ARGV[0]
                        USING ERRCODE = 'undefined_column';
                END IF;
                old_token := (old_row OPERATOR(pg_catalog.->>) TG_ARGV[0])::bigint;
            END IF;
            IF presented < old_token THEN
                RAISE EXCEPTION 'pgfence: stale fencing token % on %.% (current %)',
                        presented, TG_TABLE_SCHEMA, TG_TABLE_NAME, old_token
                    USING ERRCODE = 'PF001',
                          DETAIL = pg_catalog.format('presented=%s current=%s', presented, old_token),
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

-- pgfence_guard_strict: every UPDATE and DELETE must present a token at
-- least as new as the row's.
--
--   CREATE TRIGGER accounts_fence
--       BEFORE UPDATE OR DELETE ON accounts
--       FOR EACH ROW EXECUTE FUNCTION pgfence_guard_strict('fence_token');
--
-- UPDATE: NEW.col > OLD.col presents NEW.col. NEW.col = OLD.col (also what
--   an UPDATE that does not mention the column looks like) presents the
--   transaction's pgfence.token setting, which must be set and >= OLD.col;
--   when it is newer, the row's column is set to it, so the row always
--   records the newest token that wrote it. NEW.col < OLD.col, NEW.col NULL,
--   or a missing pgfence.token is rejected. INSERT ... ON CONFLICT DO UPDATE
--   takes this path for the conflicting row.
-- DELETE: presents pgfence.token, which must be set and >= OLD.col.
-- A presented token newer than the row's must also not be newer than the
-- last token the sequence handed out (pgfence_last_token()). A row whose
-- column is NULL accepts any presented token up to that.
-- Every rejection is PF001 with DETAIL 'presented=<token> current=<row's>'
-- (presented empty when no token was presented); a malformed pgfence.token
-- is PF003. INSERT is not checked: a new row carries the token it is
-- inserted with.
--
-- The function runs as the writer (it is not SECURITY DEFINER): writers need
-- USAGE on this schema and EXECUTE on pgfence_last_token(), and nothing on
-- the trigger function itself (EXECUTE on a trigger function is checked
-- when the trigger is created, not when it fires).
CREATE FUNCTION pgfence_guard_strict() RETURNS trigger
    LANGUAGE plpgsql
AS $$
DECLARE
    other     boolean := TG_NARGS > 0 AND TG_ARGV[0] <> 'fence_token';
    old_token bigint;
    new_token bigint;
    setting   text;
    malformed boolean := false;
    presented bigint;
    old_row   jsonb;
    new_row   jsonb;
BEGIN
    IF TG_WHEN <> 'BEFORE' OR TG_LEVEL <> 'ROW' OR TG_OP NOT IN ('UPDATE', 'DELETE') THEN
        RAISE EXCEPTION 'pgfence_guard_strict: attach it BEFORE UPDATE OR DELETE ... FOR EACH ROW, not % % FOR EACH %',
                TG_WHEN, TG_OP, TG_LEVEL
            USING ERRCODE = 'trigger_protocol_violated';
    END IF;
    IF NOT other THEN
        old_token := OLD.fence_token;
        IF TG_OP = 'UPDATE' THEN
            new_token := NEW.fence_token;
        END IF;
    ELSE
        old_row := pg_catalog.to_jsonb(OLD);
        IF NOT old_row OPERATOR(pg_catalog.?) TG_ARGV[0] THEN
            RAISE EXCEPTION 'pgfence_guard_strict: table %.% has no column %', TG_TABLE_SCHEMA, TG_TABLE_NAME, TG_ARGV[0]
                USING ERRCODE = 'undefined_column';
        END IF;
        old_token := (old_row OPERATOR(pg_catalog.->>) TG_ARGV[0])::bigint;
        IF TG_OP = 'UPDATE' THEN
            new_row := pg_catalog.to_jsonb(NEW);
            new_token := (new_row OPERATOR(pg_catalog.->>) TG_ARGV[0])::bigint;
        END IF;
    END IF;

    IF TG_OP = 'UPDATE' AND new_token IS DISTINCT FROM old_token THEN
        -- The UPDATE sets the column: it presents the new value.
        presented := new_token;
    ELSE
        -- A DELETE, or an UPDATE that leaves the column as it is: the
        -- transaction's pgfence.token is the token presented.
        setting := pg_catalog.current_setting('pgfence.token'::text, true);
        IF setting IS NOT NULL AND setting <> ''::text THEN
            -- Up to 18 digits (what set_config(..., token::text, true)
            -- writes) is a bigint; anything else is checked in full.
            IF setting !~ '^[0-9]{1,18}$'::text THEN
                IF setting !~ '^[[:space:]]*[-+]?[0-9]{1,19}[[:space:]]*$'::text THEN
                    malformed := true;
                ELSIF setting::numeric NOT BETWEEN -9223372036854775808::numeric AND 9223372036854775807::numeric THEN
                    malformed := true;
                END IF;
            END IF;
            IF malformed THEN
                RAISE EXCEPTION 'pgfence: malformed pgfence.token setting %: want a fencing token (a bigint) or an empty string',
                        pg_catalog.quote_literal(setting)
                    USING ERRCODE = 'PF003',
                          HINT = 'Set it with set_config(''pgfence.token'', token::text, true).';
            END IF;
            presented := setting::bigint;
        END IF;
    END IF;

    IF presented IS NULL THEN
        RAISE EXCEPTION 'pgfence: % on %.% presents no fencing token (strict mode; current %)',
                TG_OP, TG_TABLE_SCHEMA, TG_TABLE_NAME, old_token
            USING ERRCODE = 'PF001',
                  DETAIL = pg_catalog.format('presented=%s current=%s', presented, old_token),
                  HINT = 'Set the guard column to the token, or set pgfence.token with set_config(''pgfence.token'', token::text, true) in the transaction.';
    END IF;
    IF presented < old_token THEN
        RAISE EXCEPTION 'pgfence: stale fencing token % on %.% (current %)',
                presented, TG_TABLE_SCHEMA, TG_TABLE_NAME, old_token
            USING ERRCODE = 'PF001',
                  DETAIL = pg_catalog.format('presented=%s current=%s', presented, old_token),
                  HINT = 'A newer lock holder has written this row; this holder''s lock was lost.';
    END IF;
    -- A newer token must have been issued. (A separate IF: EXECUTE on
    -- pgfence_last_token is checked when the expression calling it is first
    -- prepared, so writers presenting the row's own token never need it.)
    IF old_token IS NULL OR presented > old_token THEN
        IF presented > pgfence_last_token() THEN
            RAISE EXCEPTION 'pgfence: fencing token % on %.% was never issued (current %)',
                    presented, TG_TABLE_SCHEMA, TG_TABLE_NAME, old_token
                USING ERRCODE = 'PF001',
                      DETAIL = pg_catalog.format('presented=%s current=%s', presented, old_token),
                      HINT = 'Tokens come from pgfence_next_token(); this one is newer than any it has handed out.';
        END IF;
    END IF;

    IF TG_OP = 'DELETE' THEN
        RETURN OLD;
    END IF;
    IF presented IS DISTINCT FROM new_token THEN
        -- A newer pgfence.token on an UPDATE that left the column alone:
        -- record it, so a holder with an older token cannot write next.
        IF NOT other THEN
            NEW.fence_token := presented;
        ELSE
            NEW := pg_catalog.jsonb_populate_record(NEW,
                pg_catalog.jsonb_build_object(TG_ARGV[0], presented));
        END IF;
    END IF;
    RETURN NEW;
END;
$$;

REVOKE EXECUTE ON FUNCTION pgfence_guard_strict() FROM PUBLIC;

COMMENT ON FUNCTION pgfence_guard_strict() IS
    'Trigger (strict mode): every UPDATE and DELETE must present a fencing token >= the row''s, else SQLSTATE PF001.';

-- pgfence_guard_truncate rejects TRUNCATE, which fires no row triggers and
-- so would bypass either mode:
--
--   CREATE TRIGGER accounts_fence_truncate
--       BEFORE TRUNCATE ON accounts
--       FOR EACH STATEMENT EXECUTE FUNCTION pgfence_guard_truncate();
--
-- To empty the table on purpose, the owner disables or drops the trigger.
CREATE FUNCTION pgfence_guard_truncate() RETURNS trigger
    LANGUAGE plpgsql
AS $$
BEGIN
    IF TG_OP <> 'TRUNCATE' THEN
        RAISE EXCEPTION 'pgfence_guard_truncate: attach it BEFORE TRUNCATE ... FOR EACH STATEMENT, not % % FOR EACH %',
                TG_WHEN, TG_OP, TG_LEVEL
            USING ERRCODE = 'trigger_protocol_violated';
    END IF;
    RAISE EXCEPTION 'pgfence: TRUNCATE of fenced table %.% is not allowed', TG_TABLE_SCHEMA, TG_TABLE_NAME
        USING ERRCODE = 'PF001',
              DETAIL = 'presented= current=',
              HINT = 'Delete rows with a fencing token, or have the table owner disable the trigger.';
END;
$$;

REVOKE EXECUTE ON FUNCTION pgfence_guard_truncate() FROM PUBLIC;

COMMENT ON FUNCTION pgfence_guard_truncate() IS
    'Trigger (BEFORE TRUNCATE): rejects TRUNCATE of a fenced table with SQLSTATE PF001.';

-- Pin every function's search_path: built-ins from pg_catalog first, this
-- schema's objects next, pg_temp last.
SELECT pg_catalog.set_config('search_path',
    'pg_catalog, ' || pg_catalog.quote_ident(pg_catalog.current_schema()) || ', pg_temp', true);

ALTER FUNCTION pgfence_schema_version() SET search_path FROM CURRENT;
ALTER FUNCTION pgfence_last_token() SET search_path FROM CURRENT;
ALTER FUNCTION pgfence_guard() SET search_path FROM CURRENT;
ALTER FUNCTION pgfence_guard_strict() SET search_path FROM CURRENT;
ALTER FUNCTION pgfence_guard_truncate() SET search_path FROM CURRENT;
