-- 000013: one way to present a fencing token in both trigger modes, owner
-- maintenance of strict tables, and an installer that checks placement.
--
--   pgfence_present(token)          sets pgfence.token for the rest of the
--                                   transaction: the token a hand-written or
--                                   sqlc write presents to either trigger.
--   pgfence_guard_strict()          a write that presents no token is now
--                                   SQLSTATE PF004 (not PF001, a stale token),
--                                   with a HINT naming pgfence_present; the
--                                   DELETE half of a row moved to another
--                                   partition presents the token its UPDATE
--                                   half presented; writes of the owner in
--                                   maintenance are not checked.
--   pgfence_guard_truncate()        lets the owner in maintenance truncate.
--   pgfence_maintenance(table)      for the table's owner only: turns the
--                                   strict checks off on that table and its
--                                   descendants until the transaction ends.
--   pgfence_protect(table, column, strict)
--                                   creates the triggers on the table and on
--                                   every inheritance descendant, after
--                                   checking that no other BEFORE trigger
--                                   decides the guard column before them.
--
-- Everything is created in current_schema() of the migrating connection, as
-- in 000004 to 000012.
DO $$
BEGIN
    IF pg_catalog.current_schema() IS NULL OR pg_catalog.current_schema() = 'pg_catalog' THEN
        RAISE EXCEPTION 'pgfence: migration 000013 needs the schema to install into first in search_path (current schema: %)',
            pg_catalog.current_schema();
    END IF;
END;
$$;

-- pgfence_present sets pgfence.token to token until the transaction ends.
-- Outside a transaction block it lasts for its own statement only.
CREATE FUNCTION pgfence_present(token bigint) RETURNS void
    LANGUAGE plpgsql VOLATILE
    SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF token IS NULL OR token OPERATOR(pg_catalog.<=) 0 THEN
        RAISE EXCEPTION 'pgfence: fencing token % is not positive; tokens come from pgfence_next_token()', token
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    PERFORM pg_catalog.set_config('pgfence.token', token::pg_catalog.text, true);
END;
$$;
COMMENT ON FUNCTION pgfence_present(bigint) IS
    'Presents a fencing token to the pgfence_guard triggers: sets pgfence.token until the transaction ends.';
REVOKE ALL ON FUNCTION pgfence_present(bigint) FROM PUBLIC;

-- pgfence_maintenance lets the owner of table (a role with the privileges
-- of its owner) write it and its partitions and inheritance descendants
-- without presenting tokens until the transaction ends: it adds their OIDs
-- to pgfence.maintenance, which the strict and TRUNCATE triggers honour
-- only for a writer with the privileges of the written table's owner.
-- Another role is refused (42501); setting pgfence.maintenance by hand
-- gives it nothing.
CREATE FUNCTION pgfence_maintenance(tbl regclass) RETURNS void
    LANGUAGE plpgsql VOLATILE
    SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    owner_oid pg_catalog.oid;
    rels      pg_catalog.text;
BEGIN
    SELECT c.relowner INTO owner_oid FROM pg_catalog.pg_class c WHERE c.oid OPERATOR(pg_catalog.=) tbl;
    IF owner_oid IS NULL THEN
        RAISE EXCEPTION 'pgfence: no table %', tbl USING ERRCODE = 'undefined_table';
    END IF;
    IF NOT pg_catalog.pg_has_role(owner_oid, 'USAGE') THEN
        RAISE EXCEPTION 'pgfence: only the owner of % may write it without fencing tokens', tbl
            USING ERRCODE = 'insufficient_privilege',
                  HINT = 'Run the maintenance as the table''s owner; application roles present tokens.';
    END IF;
    WITH RECURSIVE tree(rel) AS (
        SELECT tbl::pg_catalog.oid
        UNION
        SELECT i.inhrelid FROM pg_catalog.pg_inherits i JOIN tree t ON i.inhparent OPERATOR(pg_catalog.=) t.rel
    )
    SELECT pg_catalog.string_agg(t.rel::pg_catalog.text, ' ') INTO rels FROM tree t;
    PERFORM pg_catalog.set_config('pgfence.maintenance', pg_catalog.concat_ws(' ',
        NULLIF(pg_catalog.current_setting('pgfence.maintenance', true), ''), rels), true);
    RAISE LOG 'pgfence: % writes % without fencing tokens until its transaction ends', current_user, tbl;
END;
$$;
COMMENT ON FUNCTION pgfence_maintenance(regclass) IS
    'For the table''s owner only: its writes to the table and its descendants skip the strict guard until the transaction ends.';
REVOKE ALL ON FUNCTION pgfence_maintenance(regclass) FROM PUBLIC;

-- pgfence_guard_strict as in 000004, with these changes:
--   - A write that presents no token raises PF004, not PF001, with a HINT
--     naming pgfence_present.
--   - An UPDATE that presents its token by raising the column, without
--     pgfence.token, on a partition, leaves a note (pgfence.moving) that
--     the DELETE half of the same row's move to another partition, in the
--     same statement, presents that token. The note is only a way to
--     present a token: the DELETE's checks are the usual ones.
--   - A writer with the privileges of the table's owner, after
--     pgfence_maintenance on the table in the transaction, is not checked.
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
    from_col  boolean := false;
    move_key  text;
BEGIN
    IF TG_WHEN <> 'BEFORE' OR TG_LEVEL <> 'ROW' OR TG_OP NOT IN ('UPDATE', 'DELETE') THEN
        RAISE EXCEPTION 'pgfence_guard_strict: attach it BEFORE UPDATE OR DELETE ... FOR EACH ROW, not % % FOR EACH %',
                TG_WHEN, TG_OP, TG_LEVEL
            USING ERRCODE = 'trigger_protocol_violated';
    END IF;
    setting := pg_catalog.current_setting('pgfence.maintenance'::text, true);
    IF setting IS NOT NULL AND setting <> ''::text
       AND TG_RELID::text = ANY (pg_catalog.string_to_array(setting, ' '))
       AND pg_catalog.pg_has_role((SELECT c.relowner FROM pg_catalog.pg_class c WHERE c.oid = TG_RELID), 'USAGE') THEN
        IF TG_OP = 'DELETE' THEN
            RETURN OLD;
        END IF;
        RETURN NEW;
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
        from_col := true;
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
        ELSIF TG_OP = 'DELETE' THEN
            -- The DELETE half of a move to another partition presents what
            -- its UPDATE half presented.
            setting := pg_catalog.current_setting('pgfence.moving'::text, true);
            move_key := pg_catalog.format('%s/%s/%s/', TG_RELID, pg_catalog.statement_timestamp(), pg_catalog.md5(OLD::text));
            IF setting IS NOT NULL AND pg_catalog.starts_with(setting, move_key)
               AND pg_catalog.substr(setting, pg_catalog.length(move_key) + 1) ~ '^[0-9]{1,18}$'::text THEN
                presented := pg_catalog.substr(setting, pg_catalog.length(move_key) + 1)::bigint;
                PERFORM pg_catalog.set_config('pgfence.moving', '', true);
            END IF;
        END IF;
    END IF;

    IF from_col AND presented IS NULL THEN
        RAISE EXCEPTION 'pgfence: UPDATE on %.% sets the fencing token to NULL (current %)',
                TG_TABLE_SCHEMA, TG_TABLE_NAME, old_token
            USING ERRCODE = 'PF001',
                  DETAIL = pg_catalog.format('presented= current=%s', old_token),
                  HINT = 'Present a token at least the row''s; the guard column may not move backwards or to NULL.';
    END IF;
    IF presented IS NULL THEN
        RAISE EXCEPTION 'pgfence: % on %.% presents no fencing token (strict mode; current %)',
                TG_OP, TG_TABLE_SCHEMA, TG_TABLE_NAME, old_token
            USING ERRCODE = 'PF004',
                  DETAIL = pg_catalog.format('presented= current=%s', old_token),
                  HINT = pg_catalog.format('Call %s.pgfence_present(token) (in Go: fence.Present) in the transaction before writing.',
                      pg_catalog.quote_ident((pg_catalog.current_schemas(false))[2]));
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
    IF from_col AND (SELECT c.relispartition FROM pg_catalog.pg_class c WHERE c.oid = TG_RELID) THEN
        PERFORM pg_catalog.set_config('pgfence.moving', pg_catalog.format('%s/%s/%s/%s',
            TG_RELID, pg_catalog.statement_timestamp(), pg_catalog.md5(OLD::text), presented), true);
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

-- pgfence_guard_truncate as in 000004, letting the owner in maintenance
-- truncate.
CREATE OR REPLACE FUNCTION pgfence_guard_truncate() RETURNS trigger
    LANGUAGE plpgsql
AS $$
DECLARE
    setting text;
BEGIN
    IF TG_OP <> 'TRUNCATE' THEN
        RAISE EXCEPTION 'pgfence_guard_truncate: attach it BEFORE TRUNCATE ... FOR EACH STATEMENT, not % % FOR EACH %',
                TG_WHEN, TG_OP, TG_LEVEL
            USING ERRCODE = 'trigger_protocol_violated';
    END IF;
    setting := pg_catalog.current_setting('pgfence.maintenance'::text, true);
    IF setting IS NOT NULL AND setting <> ''::text
       AND TG_RELID::text = ANY (pg_catalog.string_to_array(setting, ' '))
       AND pg_catalog.pg_has_role((SELECT c.relowner FROM pg_catalog.pg_class c WHERE c.oid = TG_RELID), 'USAGE') THEN
        RETURN NULL;
    END IF;
    RAISE EXCEPTION 'pgfence: TRUNCATE of fenced table %.% is not allowed', TG_TABLE_SCHEMA, TG_TABLE_NAME
        USING ERRCODE = 'PF001',
              DETAIL = 'presented= current=',
              HINT = 'Delete rows with a fencing token, or, as the table''s owner, call pgfence_maintenance(table) first.';
END;
$$;

-- pgfence_protect attaches the guard to tbl's column col (bigint), in
-- strict mode (pgfence_guard_strict and pgfence_guard_truncate) or the
-- default one (pgfence_guard), as triggers named pgfence_guard and
-- pgfence_guard_truncate, replacing earlier ones of those names. Row
-- triggers of a partitioned table reach its partitions by themselves; the
-- TRUNCATE trigger and, for inheritance, every trigger is also created on
-- each descendant existing now. It refuses (PF005) a view or foreign table,
-- a column that is not bigint, and another BEFORE UPDATE row trigger that
-- fires first (triggers fire in name order) and may write the column: its
-- function names the column, rewrites NEW generically (populate_record,
-- #=) or is not in SQL or PL/pgSQL. It warns of such a trigger firing
-- after. It runs as the caller, who must be able to create triggers on
-- the tables.
CREATE FUNCTION pgfence_protect(tbl regclass, col name, strict boolean) RETURNS void
    LANGUAGE plpgsql VOLATILE
    SET search_path = pg_catalog, pg_temp -- re-pinned below with the install schema
AS $$
DECLARE
    kind   "char";
    typ    pg_catalog.oid;
    rel    pg_catalog.regclass;
    bad    record;
    schema pg_catalog.text := (pg_catalog.current_schemas(false))[2];
BEGIN
    SELECT c.relkind INTO kind FROM pg_catalog.pg_class c WHERE c.oid OPERATOR(pg_catalog.=) tbl;
    IF kind IS NULL OR kind NOT IN ('r', 'p') THEN
        RAISE EXCEPTION 'pgfence: % is not a table: the guard protects tables and partitioned tables only', tbl
            USING ERRCODE = 'PF005';
    END IF;
    SELECT a.atttypid INTO typ FROM pg_catalog.pg_attribute a
    WHERE a.attrelid OPERATOR(pg_catalog.=) tbl AND a.attname OPERATOR(pg_catalog.=) col AND a.attnum OPERATOR(pg_catalog.>) 0 AND NOT a.attisdropped;
    IF typ IS DISTINCT FROM 'pg_catalog.int8'::pg_catalog.regtype THEN
        RAISE EXCEPTION 'pgfence: % has no bigint column %', tbl, pg_catalog.quote_ident(col)
            USING ERRCODE = 'PF005';
    END IF;
    FOR bad IN
        WITH RECURSIVE tree(rel) AS (
            SELECT tbl::pg_catalog.oid
            UNION
            SELECT i.inhrelid FROM pg_catalog.pg_inherits i JOIN tree t ON i.inhparent OPERATOR(pg_catalog.=) t.rel
        )
        SELECT t.tgrelid::pg_catalog.regclass AS rel, t.tgname,
               t.tgname::pg_catalog.text COLLATE "C" OPERATOR(pg_catalog.<) 'pgfence_guard' AS first
        FROM pg_catalog.pg_trigger t
        JOIN tree r ON r.rel OPERATOR(pg_catalog.=) t.tgrelid
        JOIN pg_catalog.pg_proc p ON p.oid OPERATOR(pg_catalog.=) t.tgfoid
        JOIN pg_catalog.pg_language l ON l.oid OPERATOR(pg_catalog.=) p.prolang
        WHERE NOT t.tgisinternal AND t.tgname OPERATOR(pg_catalog.<>) 'pgfence_guard'
          AND (t.tgtype::pg_catalog.int4 OPERATOR(pg_catalog.&) 1) OPERATOR(pg_catalog.=) 1     -- ROW
          AND (t.tgtype::pg_catalog.int4 OPERATOR(pg_catalog.&) 2) OPERATOR(pg_catalog.=) 2     -- BEFORE
          AND (t.tgtype::pg_catalog.int4 OPERATOR(pg_catalog.&) 16) OPERATOR(pg_catalog.=) 16   -- UPDATE
          AND p.proname::pg_catalog.text NOT IN ('pgfence_guard', 'pgfence_guard_strict')
          AND (l.lanname NOT IN ('plpgsql', 'sql')
               OR p.prosrc OPERATOR(pg_catalog.~*) ('\m' OPERATOR(pg_catalog.||) pg_catalog.regexp_replace(col::pg_catalog.text, '([^[:alnum:]_])', '\\\1', 'g') OPERATOR(pg_catalog.||) '\M')
               OR p.prosrc OPERATOR(pg_catalog.~*) 'populate_record|#='::pg_catalog.text)
        ORDER BY 3 DESC, 1, 2
    LOOP
        IF bad.first THEN
            RAISE EXCEPTION 'pgfence: trigger % on % fires before pgfence_guard and may write column %', pg_catalog.quote_ident(bad.tgname), bad.rel, pg_catalog.quote_ident(col)
                USING ERRCODE = 'PF005',
                      HINT = 'A BEFORE trigger that writes the guard column before the guard checks it decides the token a write presents: rename it to sort after pgfence_guard, or change it not to write the column.';
        END IF;
        RAISE WARNING 'pgfence: trigger % on % fires after pgfence_guard and may write column %: the row may not keep the token the guard checked', pg_catalog.quote_ident(bad.tgname), bad.rel, pg_catalog.quote_ident(col);
    END LOOP;
    FOR rel IN
        WITH RECURSIVE tree(rel, depth) AS (
            SELECT tbl::pg_catalog.oid, 0
            UNION
            SELECT i.inhrelid, t.depth OPERATOR(pg_catalog.+) 1 FROM pg_catalog.pg_inherits i JOIN tree t ON i.inhparent OPERATOR(pg_catalog.=) t.rel
        )
        SELECT t.rel::pg_catalog.regclass FROM tree t ORDER BY t.depth
    LOOP
        IF rel OPERATOR(pg_catalog.=) tbl OR kind OPERATOR(pg_catalog.=) 'r' THEN
            IF EXISTS (SELECT FROM pg_catalog.pg_trigger t WHERE t.tgrelid OPERATOR(pg_catalog.=) rel AND t.tgname OPERATOR(pg_catalog.=) 'pgfence_guard') THEN
                EXECUTE pg_catalog.format('DROP TRIGGER pgfence_guard ON %s', rel);
            END IF;
            EXECUTE pg_catalog.format('CREATE TRIGGER pgfence_guard BEFORE UPDATE OR DELETE ON %s FOR EACH ROW EXECUTE FUNCTION %I.%I(%L)',
                rel, schema, CASE WHEN strict THEN 'pgfence_guard_strict' ELSE 'pgfence_guard' END, col);
        END IF;
        IF EXISTS (SELECT FROM pg_catalog.pg_trigger t WHERE t.tgrelid OPERATOR(pg_catalog.=) rel AND t.tgname OPERATOR(pg_catalog.=) 'pgfence_guard_truncate') THEN
            EXECUTE pg_catalog.format('DROP TRIGGER pgfence_guard_truncate ON %s', rel);
        END IF;
        IF strict THEN
            EXECUTE pg_catalog.format('CREATE TRIGGER pgfence_guard_truncate BEFORE TRUNCATE ON %s FOR EACH STATEMENT EXECUTE FUNCTION %I.pgfence_guard_truncate()',
                rel, schema);
        END IF;
        IF rel OPERATOR(pg_catalog.<>) tbl THEN
            RAISE NOTICE 'pgfence: % protected too (a descendant of %); run pgfence_protect again after adding one', rel, tbl;
        END IF;
    END LOOP;
END;
$$;
COMMENT ON FUNCTION pgfence_protect(regclass, name, boolean) IS
    'Attaches pgfence''s guard (strict or default mode) to a table and its descendants, refusing (PF005) a placement where it cannot protect.';
REVOKE ALL ON FUNCTION pgfence_protect(regclass, name, boolean) FROM PUBLIC;

CREATE OR REPLACE FUNCTION pgfence_schema_version() RETURNS integer
    LANGUAGE sql IMMUTABLE
AS $$ SELECT 13 $$;

SELECT pg_catalog.set_config('search_path',
    'pg_catalog, ' || pg_catalog.quote_ident(pg_catalog.current_schema()) || ', pg_temp', true);

ALTER FUNCTION pgfence_schema_version() SET search_path FROM CURRENT;
ALTER FUNCTION pgfence_guard_strict() SET search_path FROM CURRENT;
ALTER FUNCTION pgfence_guard_truncate() SET search_path FROM CURRENT;
ALTER FUNCTION pgfence_protect(regclass, name, boolean) SET search_path FROM CURRENT;
ALTER FUNCTION pgfence_present(bigint) SET search_path FROM CURRENT;
ALTER FUNCTION pgfence_maintenance(regclass) SET search_path FROM CURRENT;
