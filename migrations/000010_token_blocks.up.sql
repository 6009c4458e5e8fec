-- 000010: one sequence value covers a block of 1024 tokens, so that a
-- combined statement's tokens share one value and its WAL.
--
-- nextval() writes a WAL record once per 32 values, and a token draw waits
-- for the flush of the record that covers its token (000006, 000008). With
-- one value per token, an advisory Locker's combined statement of 16 grants
-- waited for a flush every second statement: on a disk whose flush takes
-- about 0.4 ms, more than half the server time of a statement that takes 16
-- locks and releases them (measured with pgbench: 0.40 ms per lock and
-- unlock statement pair, 0.17 ms with fsync off, 0.12 ms with no tokens).
--
-- The sequence now steps by 1024 (INCREMENT 1024). pgfence_next_token()
-- returns the value it draws, as before: tokens still only grow, and each
-- draw's token is larger than every token drawn before it. pgfence_next_tokens
-- draws one value for each 1024 tokens it hands out and gives the tokens of
-- one value consecutively from it (value, value + 1, ...): every token of a
-- value lies below the next value drawn, so every token drawn later, by any
-- call, is larger. The WAL record that covers a value covers its block, so
-- the test of 000008 still covers every token; a 16-grant statement now
-- draws one value, and 32 such statements share one flush.
--
-- pgfence_last_token(), the bound pgfence_guard_strict puts on presented
-- tokens, now returns the top of the last value's block (value + 1023): a
-- token drawn from that block may have been handed out. A presented token
-- at or below that bound is also below every token drawn after it, so it
-- can never outrank a later holder.
--
-- Tokens already handed out stay below every new one: the next value is the
-- last one plus 1024. The sequence's checks (PF002) now require INCREMENT
-- 1024 CACHE 1 NO CYCLE. The down migration moves the sequence to the top
-- of its last block before it steps by 1 again.
--
-- Everything is created in current_schema() of the migrating connection, as
-- in 000004 to 000009.
DO $$
BEGIN
    IF pg_catalog.current_schema() IS NULL OR pg_catalog.current_schema() = 'pg_catalog' THEN
        RAISE EXCEPTION 'pgfence: migration 000010 needs the schema to install into first in search_path (current schema: %)',
            pg_catalog.current_schema();
    END IF;
END;
$$;

ALTER SEQUENCE pgfence_leases_fence_seq INCREMENT 1024 CACHE 1 NO CYCLE;

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
          AND s.seqincrement = 1024 AND s.seqcache = 1 AND NOT s.seqcycle
    ) THEN
        RAISE EXCEPTION 'pgfence: sequence pgfence_leases_fence_seq must be INCREMENT 1024 CACHE 1 NO CYCLE'
            USING ERRCODE = 'PF002',
                  HINT = 'As its owner: ALTER SEQUENCE pgfence_leases_fence_seq INCREMENT 1024 CACHE 1 NO CYCLE.';
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
    'Draws a fencing token from pgfence_leases_fence_seq (which must be INCREMENT 1024 CACHE 1 NO CYCLE, else PF002); the token is durable once the calling transaction commits (it writes WAL, so that the commit waits for the flush and for synchronous standbys, unless the WAL that covers the token is flushed already and no synchronous standby is named).';

CREATE OR REPLACE FUNCTION pgfence_next_tokens(wanted boolean[]) RETURNS bigint[]
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp -- re-pinned below with the install schema
AS $$
DECLARE
    tokens bigint[] := '{}';
    want boolean;
    base bigint;
    used integer := 1024; -- tokens handed out from base's block
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
          AND s.seqincrement = 1024 AND s.seqcache = 1 AND NOT s.seqcycle
    ) THEN
        RAISE EXCEPTION 'pgfence: sequence pgfence_leases_fence_seq must be INCREMENT 1024 CACHE 1 NO CYCLE'
            USING ERRCODE = 'PF002',
                  HINT = 'As its owner: ALTER SEQUENCE pgfence_leases_fence_seq INCREMENT 1024 CACHE 1 NO CYCLE.';
    END IF;
    -- One token per true position, in the order of the positions (every
    -- element, as unnest takes them): the tokens of one value's block in
    -- turn, a new value for each 1024.
    FOREACH want IN ARRAY wanted LOOP
        IF want THEN
            IF used OPERATOR(pg_catalog.=) 1024 THEN
                base := pg_catalog.nextval('pgfence_leases_fence_seq'::pg_catalog.regclass);
                used := 0;
            END IF;
            tokens := tokens OPERATOR(pg_catalog.||) (base OPERATOR(pg_catalog.+) used);
            used := used OPERATOR(pg_catalog.+) 1;
        ELSE
            tokens := tokens OPERATOR(pg_catalog.||) NULL::bigint;
        END IF;
    END LOOP;
    -- Both positions are read after the last draw: the record covering any
    -- of the tokens ends at or before the insert position.
    IF pg_catalog.current_setting('synchronous_standby_names') <> ''
       OR pg_catalog.pg_current_wal_flush_lsn() OPERATOR(pg_catalog.<) pg_catalog.pg_current_wal_insert_lsn() THEN
        PERFORM pg_catalog.setval('pgfence_token_flush_seq'::pg_catalog.regclass, 1, true);
    END IF;
    RETURN tokens;
END;
$$;

COMMENT ON FUNCTION pgfence_next_tokens(boolean[]) IS
    'Draws a fencing token for each true element of its argument (at most 65536 elements), in order, NULL elsewhere: consecutive tokens from one value of pgfence_leases_fence_seq per 1024; the checks and durability of pgfence_next_token, paid once per call.';

CREATE OR REPLACE FUNCTION pgfence_last_token() RETURNS bigint
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER
AS $$
BEGIN
    RETURN (SELECT CASE WHEN s.is_called THEN s.last_value OPERATOR(pg_catalog.+) 1023 ELSE s.last_value OPERATOR(pg_catalog.-) 1 END
            FROM pgfence_leases_fence_seq AS s);
END;
$$;

COMMENT ON FUNCTION pgfence_last_token() IS
    'The largest fencing token pgfence_leases_fence_seq may have handed out: the top of the last value''s block of 1024 (0 before the first); read by pgfence_guard_strict.';

CREATE OR REPLACE FUNCTION pgfence_schema_version() RETURNS integer
    LANGUAGE sql IMMUTABLE
AS $$ SELECT 10 $$;

COMMENT ON FUNCTION pgfence_schema_version() IS
    'The version of the pgfence schema installed here (the number of its last migration).';

SELECT pg_catalog.set_config('search_path',
    'pg_catalog, ' || pg_catalog.quote_ident(pg_catalog.current_schema()) || ', pg_temp', true);

ALTER FUNCTION pgfence_schema_version() SET search_path FROM CURRENT;
ALTER FUNCTION pgfence_next_token() SET search_path FROM CURRENT;
ALTER FUNCTION pgfence_next_tokens(boolean[]) SET search_path FROM CURRENT;
ALTER FUNCTION pgfence_last_token() SET search_path FROM CURRENT;
