-- Reverts 000008: every token draw writes its WAL record, so that its
-- commit waits for the flush, as 000006 defined it; pgfence_schema_version
-- goes back to 7.
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
    -- A WAL record of this transaction's own (and, through setval, a
    -- transaction id), so that its commit waits for the flush.
    PERFORM pg_catalog.setval('pgfence_token_flush_seq'::pg_catalog.regclass, 1, true);
    RETURN token;
END;
$$;

COMMENT ON FUNCTION pgfence_next_token() IS
    'Draws a fencing token from pgfence_leases_fence_seq (which must be INCREMENT 1 CACHE 1 NO CYCLE, else PF002) and makes the calling transaction commit durably (it writes WAL and raises synchronous_commit to on).';

CREATE OR REPLACE FUNCTION pgfence_schema_version() RETURNS integer
    LANGUAGE sql IMMUTABLE
AS $$ SELECT 7 $$;

COMMENT ON FUNCTION pgfence_schema_version() IS
    'The version of the pgfence schema installed here (the number of its last migration).';

SELECT pg_catalog.set_config('search_path',
    'pg_catalog, ' || pg_catalog.quote_ident(pg_catalog.current_schema()) || ', pg_temp', true);

ALTER FUNCTION pgfence_schema_version() SET search_path FROM CURRENT;
ALTER FUNCTION pgfence_next_token() SET search_path FROM CURRENT;
