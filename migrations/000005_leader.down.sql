-- Reverts 000005: drops pgfence_leader_proclaim and the pgfence_leaders
-- table (the values leaders proclaimed, and the history of terms), and sets
-- pgfence_schema_version back to 4. The election leases themselves are rows
-- of pgfence_leases and stay.
DROP FUNCTION IF EXISTS pgfence_leader_proclaim(text, bigint, text, text);
DROP TABLE IF EXISTS pgfence_leaders;

CREATE OR REPLACE FUNCTION pgfence_schema_version() RETURNS integer
    LANGUAGE sql IMMUTABLE
AS $$ SELECT 4 $$;

COMMENT ON FUNCTION pgfence_schema_version() IS
    'The version of the pgfence schema installed here (the number of its last migration).';

-- pgfence_schema_version keeps a pinned search_path, as 000004 left it.
SELECT pg_catalog.set_config('search_path',
    'pg_catalog, ' || pg_catalog.quote_ident(pg_catalog.current_schema()) || ', pg_temp', true);
ALTER FUNCTION pgfence_schema_version() SET search_path FROM CURRENT;
