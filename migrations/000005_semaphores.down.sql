-- Drops what 000005_semaphores.up.sql creates and gives back version 1's
-- pgfence_schema_version. Permit rows (names containing chr(31)) stay in
-- pgfence_leases as ordinary, unreachable leases until they are pruned.
DROP TRIGGER IF EXISTS pgfence_permit_released ON pgfence_leases;
DROP FUNCTION IF EXISTS
    pgfence_permit_released(),
    pgfence_acquire_set(text[], text, bigint[]),
    pgfence_acquire_permit(text, integer, text, bigint);
DROP TABLE IF EXISTS pgfence_semaphores;
DROP SEQUENCE IF EXISTS pgfence_permit_wake_seq;
CREATE OR REPLACE FUNCTION pgfence_schema_version() RETURNS integer
    LANGUAGE sql IMMUTABLE
    SET search_path = pg_catalog, pg_temp
AS $$ SELECT 4 $$;
DO $$
BEGIN
    EXECUTE pg_catalog.format('ALTER FUNCTION %s.pgfence_schema_version() SET search_path = pg_catalog, %s, pg_temp',
        pg_catalog.quote_ident(pg_catalog.current_schema()), pg_catalog.quote_ident(pg_catalog.current_schema()));
END;
$$;
