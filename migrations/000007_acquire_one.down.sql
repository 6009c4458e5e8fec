-- Reverts 000007: pgfence_acquire is 000003's statement for every batch,
-- and pgfence_schema_version goes back to 6.
CREATE OR REPLACE FUNCTION pgfence_acquire(names text[], new_owner text, ttl_us bigint[])
    RETURNS TABLE(acquired boolean, name text, owner text, fence bigint,
                  acquired_at timestamptz, expires_at timestamptz, db_now timestamptz)
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp -- the DO block below adds the install schema
AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    WITH req AS (
        SELECT r.name, r.ttl_us FROM ROWS FROM (pg_catalog.unnest($1), pg_catalog.unnest($3)) AS r(name, ttl_us)
    ), acquired AS (
        INSERT INTO pgfence_leases AS l (name, owner, fence, acquired_at, expires_at)
        SELECT r.name, $2, pgfence_next_token(), pg_catalog.now(),
               pg_catalog.now() + r.ttl_us * interval '1 microsecond'
        FROM req r
        WHERE NOT EXISTS (SELECT FROM pgfence_leases h WHERE h.name = r.name AND h.expires_at > pg_catalog.now())
        ORDER BY r.name
        ON CONFLICT (name) DO UPDATE
            SET owner = excluded.owner,
                fence = pgfence_next_token(),
                acquired_at = excluded.acquired_at,
                expires_at = excluded.expires_at
            WHERE l.expires_at <= pg_catalog.now()
        RETURNING l.name, l.owner, l.fence, l.acquired_at, l.expires_at
    )
    SELECT true, a.name, a.owner, a.fence, a.acquired_at, a.expires_at, pg_catalog.now() FROM acquired a
    UNION ALL
    SELECT false, p.name, p.owner, p.fence, p.acquired_at, p.expires_at, pg_catalog.now()
    FROM pgfence_leases p
    WHERE p.name IN (SELECT q.name FROM req q) AND p.name NOT IN (SELECT a.name FROM acquired a);
END;
$$;

COMMENT ON FUNCTION pgfence_acquire(text[], text, bigint[]) IS
    'Takes each free or expired lease of a batch with a fresh token; returns one row per name: the new lease, or the current holder.';
CREATE OR REPLACE FUNCTION pgfence_schema_version() RETURNS integer
    LANGUAGE sql IMMUTABLE
AS $$ SELECT 6 $$;

COMMENT ON FUNCTION pgfence_schema_version() IS
    'The version of the pgfence schema installed here (the number of its last migration).';

SELECT pg_catalog.set_config('search_path',
    'pg_catalog, ' || pg_catalog.quote_ident(pg_catalog.current_schema()) || ', pg_temp', true);

ALTER FUNCTION pgfence_schema_version() SET search_path FROM CURRENT;
ALTER FUNCTION pgfence_acquire(text[], text, bigint[]) SET search_path FROM CURRENT;
ALTER FUNCTION pgfence_acquire(text[], text, bigint[]) SET plan_cache_mode = force_generic_plan;
