-- Reverts 000004: drops the strict and TRUNCATE trigger functions and
-- pgfence_last_token, restores pgfence_guard's body as 000002 created it, and
-- sets pgfence_schema_version back to 3.
--
-- Dropping a trigger function fails while a user table still has a trigger
-- using it: drop those triggers in your own migrations first, so no
-- protected table is silently unguarded.
DROP FUNCTION IF EXISTS pgfence_guard_truncate();
DROP FUNCTION IF EXISTS pgfence_guard_strict();
DROP FUNCTION IF EXISTS pgfence_last_token();

CREATE OR REPLACE FUNCTION pgfence_schema_version() RETURNS integer
    LANGUAGE sql IMMUTABLE
AS $$ SELECT 3 $$;

-- pgfence_guard as 000003 left it: 000002's body, with the search_path
-- 000003 pinned (restored below: CREATE OR REPLACE drops it).
CREATE OR REPLACE FUNCTION pgfence_guard() RETURNS trigger
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


-- pgfence_schema_version and pgfence_guard keep a pinned search_path, as
-- 000003 left them.
SELECT pg_catalog.set_config('search_path',
    'pg_catalog, ' || pg_catalog.quote_ident(pg_catalog.current_schema()) || ', pg_temp', true);
ALTER FUNCTION pgfence_schema_version() SET search_path FROM CURRENT;
ALTER FUNCTION pgfence_guard() SET search_path FROM CURRENT;
