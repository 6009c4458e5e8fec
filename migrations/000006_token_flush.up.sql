-- 000006: a token drawn by pgfence_next_token() is durable before its
-- transaction's commit returns, whatever else the transaction did.
--
-- pgfence_next_token() (000003) assigned a transaction id and raised
-- synchronous_commit to on, expecting the commit to wait for the WAL flush.
-- PostgreSQL waits at commit only when the transaction itself wrote WAL
-- before its commit record (RecordTransactionCommit's wrote_xlog), and
-- nextval() writes WAL only once per 32 values: it logs a value 32 ahead and
-- hands out the values below it without a record. A transaction that drew
-- such a value and wrote nothing else (a session advisory lock's grant, or a
-- transaction lock's in a transaction that writes nothing) therefore
-- committed without waiting for the flush, nor for a synchronous standby.
-- When the record covering the value had been written by another
-- transaction not yet flushed, a crash, or a failover to a standby that had
-- not received it, could hand the same token out again: two holders with
-- equal tokens, which the fence's <= form lets both write.
--
-- pgfence_next_token() now also sets pgfence_token_flush_seq (a sequence of
-- its own, used for nothing else): setval() writes a WAL record on every
-- call, so the transaction has written WAL and its commit flushes it, up to
-- and past the record that covers the token, and waits for synchronous
-- standbys where they are configured. setval() holds the sequence's buffer
-- lock only while it writes the record, so concurrent draws do not queue on
-- each other until commit.
--
-- Everything is created in current_schema() of the migrating connection, as
-- in 000004 and 000005; the functions get search_path pinned to pg_catalog,
-- that schema, pg_temp at the end of this file.
DO $$
BEGIN
    IF pg_catalog.current_schema() IS NULL OR pg_catalog.current_schema() = 'pg_catalog' THEN
        RAISE EXCEPTION 'pgfence: migration 000006 needs the schema to install into first in search_path (current schema: %)',
            pg_catalog.current_schema();
    END IF;
END;
$$;

CREATE SEQUENCE pgfence_token_flush_seq MINVALUE 0 MAXVALUE 1 START 0 CACHE 1 NO CYCLE;

REVOKE ALL ON SEQUENCE pgfence_token_flush_seq FROM PUBLIC;

COMMENT ON SEQUENCE pgfence_token_flush_seq IS
    'pgfence: set by pgfence_next_token() on every draw, only to write WAL so that the drawing transaction commits durably; its value means nothing.';

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
AS $$ SELECT 6 $$;

COMMENT ON FUNCTION pgfence_schema_version() IS
    'The version of the pgfence schema installed here (the number of its last migration).';

SELECT pg_catalog.set_config('search_path',
    'pg_catalog, ' || pg_catalog.quote_ident(pg_catalog.current_schema()) || ', pg_temp', true);

ALTER FUNCTION pgfence_schema_version() SET search_path FROM CURRENT;
ALTER FUNCTION pgfence_next_token() SET search_path FROM CURRENT;
