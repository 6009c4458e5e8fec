-- 000011: pgfence_release frees a single lease with one UPDATE.
--
-- Most release statements carry one lease (a lone holder, and every
-- hand-over from a holder to a waiter), and a hand-over waits for the
-- release's answer. 000003's statement handled them like any batch: an
-- UPDATE ... FROM unnest() under a CTE, read twice, joined laterally to
-- pg_notify and by a hash join to an aggregate that chose the durability.
-- On a hand-over of one lease between two Lockers (PostgreSQL 15, 2 cores,
-- fsync off so that only CPU counts) that statement took 0.085 ms of server
-- time (pg_stat_statements) against 0.014 ms for the same UPDATE and
-- pg_notify in plain SQL, and the hand-over took 0.53 ms at p50; with the
-- one-lease path below, 0.065 ms and 0.48 ms.
--
-- For one lease (each of the three arrays has one element) the function now
-- runs the UPDATE on the row alone, then, when it released the lease, sends
-- the notification and, when the row is freed (not kept held by at_least),
-- makes the commit skip the WAL flush, exactly as 000003's statement does:
-- same rows returned (the token, and 'off' or NULL), same notification, same
-- durability, same row lock and the same test of expiry
-- (clock_timestamp()). Every batch of more than one lease, and arrays of
-- unequal length, run 000003's statement unchanged. The signature, the
-- comment, the privileges and the settings (search_path pinned,
-- plan_cache_mode = force_generic_plan) are those of 000003.
--
-- Everything is created in current_schema() of the migrating connection, as
-- in 000004 to 000010.
DO $$
BEGIN
    IF pg_catalog.current_schema() IS NULL OR pg_catalog.current_schema() = 'pg_catalog' THEN
        RAISE EXCEPTION 'pgfence: migration 000011 needs the schema to install into first in search_path (current schema: %)',
            pg_catalog.current_schema();
    END IF;
END;
$$;

CREATE OR REPLACE FUNCTION pgfence_release(names text[], tokens bigint[], at_least_us bigint[], owner text)
    RETURNS TABLE(fence bigint, durability text)
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp -- re-pinned below with the install schema
AS $$
#variable_conflict use_column
DECLARE
    freed boolean;
BEGIN
    IF pg_catalog.cardinality($1) = 1 AND pg_catalog.cardinality($2) = 1 AND pg_catalog.cardinality($3) = 1 THEN
        -- One lease: the UPDATE alone, then its notification and its
        -- durability, as the batch statement below does for each row.
        UPDATE pgfence_leases AS l
        SET expires_at = greatest(pg_catalog.now(), l.acquired_at + $3[1] * interval '1 microsecond')
        WHERE l.name = $1[1] AND l.owner = $4 AND l.fence = $2[1] AND l.expires_at > pg_catalog.clock_timestamp()
        RETURNING l.fence, l.expires_at <= pg_catalog.now() INTO fence, freed;
        IF NOT FOUND THEN
            RETURN;
        END IF;
        PERFORM pg_catalog.pg_notify('pgfence_lease_released', $1[1]);
        IF freed THEN
            durability := pg_catalog.set_config('synchronous_commit', 'off', true);
        END IF;
        RETURN NEXT;
        RETURN;
    END IF;
    RETURN QUERY
    WITH released AS (
        UPDATE pgfence_leases AS l
        SET expires_at = greatest(pg_catalog.now(), l.acquired_at + r.at_least_us * interval '1 microsecond')
        FROM ROWS FROM (pg_catalog.unnest($1), pg_catalog.unnest($2), pg_catalog.unnest($3)) AS r(name, fence, at_least_us)
        WHERE l.name = r.name AND l.owner = $4 AND l.fence = r.fence AND l.expires_at > pg_catalog.clock_timestamp()
        RETURNING l.name, l.fence, l.expires_at <= pg_catalog.now() AS freed
    )
    SELECT r.fence, a.durability FROM released r
    LEFT JOIN LATERAL (
        SELECT pg_catalog.pg_notify('pgfence_lease_released', r.name)
    ) n ON true
    LEFT JOIN (
        SELECT pg_catalog.set_config('synchronous_commit', 'off', true) FROM released HAVING bool_and(freed)
    ) a(durability) ON true;
END;
$$;

CREATE OR REPLACE FUNCTION pgfence_schema_version() RETURNS integer
    LANGUAGE sql IMMUTABLE
AS $$ SELECT 11 $$;

COMMENT ON FUNCTION pgfence_schema_version() IS
    'The version of the pgfence schema installed here (the number of its last migration).';

SELECT pg_catalog.set_config('search_path',
    'pg_catalog, ' || pg_catalog.quote_ident(pg_catalog.current_schema()) || ', pg_temp', true);

ALTER FUNCTION pgfence_schema_version() SET search_path FROM CURRENT;
ALTER FUNCTION pgfence_release(text[], bigint[], bigint[], text) SET search_path FROM CURRENT;
ALTER FUNCTION pgfence_release(text[], bigint[], bigint[], text) SET plan_cache_mode = force_generic_plan;
