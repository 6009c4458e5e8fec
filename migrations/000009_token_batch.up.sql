-- 000009: one call draws the tokens of every lock a statement granted.
--
-- An advisory Locker takes the session locks of many callers in one
-- statement (advisory/batch.go) and, until now, called pgfence_next_token()
-- once for each lock granted. Each call paid again for what does not change
-- within a statement: entering a SECURITY DEFINER function with its own
-- search_path, the check of the sequence's settings in pg_sequence, the
-- synchronous_commit test and the WAL positions; about 10 microseconds of
-- server time per token here, against about 1 for the nextval itself (a
-- 16-lock statement: 170-190 us with a call per token, 40-60 us with
-- pgfence_next_tokens).
--
-- pgfence_next_tokens(wanted) returns an array as long as wanted holding, at
-- each position where wanted is true, a token drawn from
-- pgfence_leases_fence_seq, in the order of the positions (so they grow
-- along the array), and NULL elsewhere. It checks the sequence once, draws
-- every token, then reads the WAL positions once, after the last draw: the
-- record that covers any of the tokens ends at or before the insert
-- position read then, so the test of 000008 covers them all. When the WAL
-- they need is not flushed yet, or synchronous standbys are named, it
-- writes the one record (pgfence_token_flush_seq) whose commit waits for the
-- flush and the standbys: every token of the call becomes durable with the
-- calling transaction's commit, as one from pgfence_next_token() does.
--
-- An array of more than 65536 elements is refused (SQLSTATE 22023): no
-- statement of pgfence's draws that many, and one call must not run for
-- long while it holds the sequence's log position to itself.
--
-- Every role that may execute pgfence_next_token() is granted EXECUTE on the
-- new function, so that an application role granted before this migration
-- draws in batches without a new grant (migrations.Grant grants it too).
--
-- Everything is created in current_schema() of the migrating connection, as
-- in 000004 to 000008.
DO $$
BEGIN
    IF pg_catalog.current_schema() IS NULL OR pg_catalog.current_schema() = 'pg_catalog' THEN
        RAISE EXCEPTION 'pgfence: migration 000009 needs the schema to install into first in search_path (current schema: %)',
            pg_catalog.current_schema();
    END IF;
END;
$$;

CREATE FUNCTION pgfence_next_tokens(wanted boolean[]) RETURNS bigint[]
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp -- re-pinned below with the install schema
AS $$
DECLARE
    tokens bigint[];
BEGIN
    IF wanted IS NULL THEN
        RETURN NULL;
    END IF;
    IF pg_catalog.cardinality(wanted) OPERATOR(pg_catalog.>) 65536 THEN
        RAISE EXCEPTION 'pgfence: pgfence_next_tokens draws for at most 65536 positions, not %', pg_catalog.cardinality(wanted)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF pg_catalog.current_setting('synchronous_commit') NOT IN ('on', 'remote_apply') THEN
        PERFORM pg_catalog.set_config('synchronous_commit', 'on', true);
    END IF;
    IF NOT EXISTS (
        SELECT FROM pg_catalog.pg_sequence s
        WHERE s.seqrelid = 'pgfence_leases_fence_seq'::pg_catalog.regclass
          AND s.seqincrement = 1 AND s.seqcache = 1 AND NOT s.seqcycle
    ) THEN
        RAISE EXCEPTION 'pgfence: sequence pgfence_leases_fence_seq must be INCREMENT 1 CACHE 1 NO CYCLE'
            USING ERRCODE = 'PF002',
                  HINT = 'As its owner: ALTER SEQUENCE pgfence_leases_fence_seq INCREMENT 1 CACHE 1 NO CYCLE.';
    END IF;
    -- One token per true position, drawn in the order of the positions.
    SELECT pg_catalog.array_agg(CASE WHEN w.want THEN pg_catalog.nextval('pgfence_leases_fence_seq'::pg_catalog.regclass) END
                                ORDER BY w.pos)
        INTO tokens
        FROM pg_catalog.unnest(wanted) WITH ORDINALITY AS w(want, pos);
    -- Both positions are read after the last draw: the record covering any
    -- of the tokens ends at or before the insert position.
    IF pg_catalog.current_setting('synchronous_standby_names') <> ''
       OR pg_catalog.pg_current_wal_flush_lsn() OPERATOR(pg_catalog.<) pg_catalog.pg_current_wal_insert_lsn() THEN
        PERFORM pg_catalog.setval('pgfence_token_flush_seq'::pg_catalog.regclass, 1, true);
    END IF;
    RETURN COALESCE(tokens, '{}');
END;
$$;

REVOKE ALL ON FUNCTION pgfence_next_tokens(boolean[]) FROM PUBLIC;

COMMENT ON FUNCTION pgfence_next_tokens(boolean[]) IS
    'Draws a fencing token from pgfence_leases_fence_seq for each true element of its argument (at most 65536 elements), in order, NULL elsewhere; the checks and durability of pgfence_next_token, paid once per call.';

-- Whoever may draw one token at a time may draw several.
DO $$
DECLARE
    grantee pg_catalog.regrole;
BEGIN
    FOR grantee IN
        SELECT a.grantee::pg_catalog.regrole
        FROM pg_catalog.pg_proc p, pg_catalog.aclexplode(p.proacl) AS a
        WHERE p.oid = 'pgfence_next_token()'::pg_catalog.regprocedure
          AND a.privilege_type = 'EXECUTE'
          AND a.grantee OPERATOR(pg_catalog.<>) 0
          AND a.grantee OPERATOR(pg_catalog.<>) p.proowner
    LOOP
        EXECUTE pg_catalog.format('GRANT EXECUTE ON FUNCTION pgfence_next_tokens(boolean[]) TO %s', grantee);
    END LOOP;
END;
$$;

CREATE OR REPLACE FUNCTION pgfence_schema_version() RETURNS integer
    LANGUAGE sql IMMUTABLE
AS $$ SELECT 9 $$;

COMMENT ON FUNCTION pgfence_schema_version() IS
    'The version of the pgfence schema installed here (the number of its last migration).';

SELECT pg_catalog.set_config('search_path',
    'pg_catalog, ' || pg_catalog.quote_ident(pg_catalog.current_schema()) || ', pg_temp', true);

ALTER FUNCTION pgfence_schema_version() SET search_path FROM CURRENT;
ALTER FUNCTION pgfence_next_tokens(boolean[]) SET search_path FROM CURRENT;
