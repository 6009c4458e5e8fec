-- Reverts 000011: pgfence_release is 000003's statement for every batch,
-- and pgfence_schema_version goes back to 10.
CREATE OR REPLACE FUNCTION pgfence_release(names text[], tokens bigint[], at_least_us bigint[], owner text)
    RETURNS TABLE(fence bigint, durability text)
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp -- re-pinned below with the install schema
AS $$
#variable_conflict use_column
BEGIN
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
AS $$ SELECT 10 $$;

COMMENT ON FUNCTION pgfence_schema_version() IS
    'The version of the pgfence schema installed here (the number of its last migration).';

SELECT pg_catalog.set_config('search_path',
    'pg_catalog, ' || pg_catalog.quote_ident(pg_catalog.current_schema()) || ', pg_temp', true);

ALTER FUNCTION pgfence_schema_version() SET search_path FROM CURRENT;
ALTER FUNCTION pgfence_release(text[], bigint[], bigint[], text) SET search_path FROM CURRENT;
ALTER FUNCTION pgfence_release(text[], bigint[], bigint[], text) SET plan_cache_mode = force_generic_plan;
