-- 000008: a token draw waits for the WAL flush only when the WAL that makes
-- its token durable is not flushed yet.
--
-- 000006 made every transaction that draws a token write a WAL record of
-- its own (setval on pgfence_token_flush_seq), so that its commit waits for
-- the flush: nextval() writes a record only once per 32 values (it logs a
-- value 32 ahead and hands out the values below it without one), and the
-- record that covers a value handed out without one may belong to another
-- transaction, not yet flushed. But most of the time that record was
-- flushed long ago, and every draw still cost a transaction id and a wait
-- for the disk: a session advisory lock's grant, which writes nothing else,
-- waited for a flush that protected nothing.
--
-- The record that covers the drawn value was inserted into the WAL before
-- nextval() returned (nextval writes it, under the sequence's buffer lock,
-- before it updates the value that later draws read), so it ends at or
-- before pg_current_wal_insert_lsn() read after the draw. When
-- pg_current_wal_flush_lsn() has reached that position, the record is on
-- disk, and so is every value it covers: a crash cannot hand the token out
-- again, and the draw writes nothing. Otherwise (the record is this draw's
-- own, or another transaction's not flushed yet, or other WAL was written
-- since) it sets pgfence_token_flush_seq as in 000006, and the commit
-- flushes everything written before it. The comparison errs only one way:
-- a position at a page boundary, or WAL written by others, can only make a
-- draw flush when it need not.
--
-- A flush on this server is not enough where synchronous standbys are
-- named: the token must reach them before the commit returns, or a failover
-- could hand it out again. So whenever synchronous_standby_names is not
-- empty every draw writes its record, as in 000006, and its commit waits
-- for the standbys. With asynchronous replication a failover can lose any
-- commit, flushed or not (docs/ha.md), so skipping the flush loses nothing
-- there that was kept before.
--
-- synchronous_commit is still raised to on, so that a transaction that
-- draws and writes WAL (a lease table grant) commits durably.
--
-- Everything is created in current_schema() of the migrating connection, as
-- in 000004 to 000007.
DO $$
BEGIN
    IF pg_catalog.current_schema() IS NULL OR pg_catalog.current_schema() = 'pg_catalog' THEN
        RAISE EXCEPTION 'pgfence: migration 000008 needs the schema to install into first in search_path (current schema: %)',
            pg_catalog.current_schema();
    END IF;
END;
$$;

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

CREATE OR REPLACE FUNCTION pgfence_schema_version() RETURNS integer
    LANGUAGE sql IMMUTABLE
AS $$ SELECT 8 $$;

COMMENT ON FUNCTION pgfence_schema_version() IS
    'The version of the pgfence schema installed here (the number of its last migration).';

SELECT pg_catalog.set_config('search_path',
    'pg_catalog, ' || pg_catalog.quote_ident(pg_catalog.current_schema()) || ', pg_temp', true);

ALTER FUNCTION pgfence_schema_version() SET search_path FROM CURRENT;
ALTER FUNCTION pgfence_next_token() SET search_path FROM CURRENT;
