-- Reverts 000013: drops pgfence_present, pgfence_maintenance and
-- pgfence_protect (triggers it created stay, on 000004's functions),
-- restores pgfence_guard_strict and pgfence_guard_truncate as 000004 made
-- them, and sets pgfence_schema_version back to 12.
DROP FUNCTION IF EXISTS pgfence_protect(regclass, name, boolean);
DROP FUNCTION IF EXISTS pgfence_maintenance(regclass);
DROP FUNCTION IF EXISTS pgfence_present(bigint);

CREATE OR REPLACE FUNCTION pgfence_guard_strict() RETURNS trigger
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

CREATE OR REPLACE FUNCTION pgfence_guard_truncate() RETURNS trigger
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

CREATE OR REPLACE FUNCTION pgfence_schema_version() RETURNS integer
    LANGUAGE sql IMMUTABLE
AS $$ SELECT 12 $$;

SELECT pg_catalog.set_config('search_path',
    'pg_catalog, ' || pg_catalog.quote_ident(pg_catalog.current_schema()) || ', pg_temp', true);

ALTER FUNCTION pgfence_schema_version() SET search_path FROM CURRENT;
ALTER FUNCTION pgfence_guard_strict() SET search_path FROM CURRENT;
ALTER FUNCTION pgfence_guard_truncate() SET search_path FROM CURRENT;
