-- Reverts 000010: the sequence steps by 1 again, and pgfence_next_token,
-- pgfence_next_tokens and pgfence_last_token are as 000008, 000009 and 000004
-- left them; pgfence_schema_version goes back to 9.
--
-- A token may have been handed out from anywhere in the last value's block
-- (value + 1023): the sequence is first set to the top of that block, so
-- that the next value drawn, one step above it, is larger than every token
-- handed out. setval writes WAL, and the migration's commit flushes it.
SELECT pg_catalog.setval('pgfence_leases_fence_seq'::pg_catalog.regclass, s.last_value OPERATOR(pg_catalog.+) 1023, true)
FROM pgfence_leases_fence_seq AS s
WHERE s.is_called;

ALTER SEQUENCE pgfence_leases_fence_seq INCREMENT 1 CACHE 1 NO CYCLE;

CREATE OR REPLACE FUNCTION pgfence_next_token() RETURNS bigint
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp -- re-pinned below with the install schema
AS $$
DECLARE
    token bigint;
BEGIN
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
    token := pg_catalog.nextval('pgfence_leases_fence_seq'::pg_catalog.regclass);
    -- Both positions are read after the draw: the record covering token
    -- ends at or before the insert position.
    IF pg_catalog.current_setting('synchronous_standby_names') <> ''
       OR pg_catalog.pg_current_wal_flush_lsn() OPERATOR(pg_catalog.<) pg_catalog.pg_current_wal_insert_lsn() THEN
        -- A WAL record of this transaction's own (and, through setval, a
        -- transaction id), so that its commit waits for the flush, and for
        -- synchronous standbys.
        PERFORM pg_catalog.setval('pgfence_token_flush_seq'::pg_catalog.regclass, 1, true);
    END IF;
    RETURN token;
END;
$$;

COMMENT ON FUNCTION pgfence_next_token() IS
    'Draws a fencing token from pgfence_leases_fence_seq (which must be INCREMENT 1 CACHE 1 NO CYCLE, else PF002); the token is durable once the calling transaction commits (it writes WAL, so that the commit waits for the flush and for synchronous standbys, unless the WAL that covers the token is flushed already and no synchronous standby is named).';

CREATE OR REPLACE FUNCTION pgfence_next_tokens(wanted boolean[]) RETURNS bigint[]
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

COMMENT ON FUNCTION pgfence_next_tokens(boolean[]) IS
    'Draws a fencing token from pgfence_leases_fence_seq for each true element of its argument (at most 65536 elements), in order, NULL elsewhere; the checks and durability of pgfence_next_token, paid once per call.';

CREATE OR REPLACE FUNCTION pgfence_last_token() RETURNS bigint
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER
AS $$
BEGIN
    RETURN (SELECT CASE WHEN s.is_called THEN s.last_value ELSE s.last_value OPERATOR(pg_catalog.-) 1 END
            FROM pgfence_leases_fence_seq AS s);
END;
$$;

COMMENT ON FUNCTION pgfence_last_token() IS
    'The last fencing token pgfence_leases_fence_seq handed out (0 before the first); read by pgfence_guard_strict.';

CREATE OR REPLACE FUNCTION pgfence_schema_version() RETURNS integer
    LANGUAGE sql IMMUTABLE
AS $$ SELECT 9 $$;

COMMENT ON FUNCTION pgfence_schema_version() IS
    'The version of the pgfence schema installed here (the number of its last migration).';

SELECT pg_catalog.set_config('search_path',
    'pg_catalog, ' || pg_catalog.quote_ident(pg_catalog.current_schema()) || ', pg_temp', true);

ALTER FUNCTION pgfence_schema_version() SET search_path FROM CURRENT;
ALTER FUNCTION pgfence_next_token() SET search_path FROM CURRENT;
ALTER FUNCTION pgfence_next_tokens(boolean[]) SET search_path FROM CURRENT;
ALTER FUNCTION pgfence_last_token() SET search_path FROM CURRENT;
