-- 000007: pgfence_acquire takes a single lease with one UPDATE.
--
-- Most acquire statements carry one name (a lone caller, and every
-- hand-over from a released holder to a waiter), and most of those names
-- have a row already, freed by a release or expired. 000003's statement
-- handled them like any batch: an INSERT ... ON CONFLICT DO UPDATE under a
-- CTE with a UNION, which drew a token for the row it tried to insert and
-- another under the row lock when the insert met the existing row (every
-- take-over of a freed row burnt one token), and planned and ran a dozen
-- nodes for one row.
--
-- For one name the function now runs the UPDATE that takes an existing free
-- row (expires_at <= now(), database clock, judged on the row's newest
-- version under its lock, so two concurrent takers cannot both win), which
-- draws exactly one token, and only for the row it takes; when the row is
-- held it returns the holder from a fresh snapshot (so a holder that
-- committed after the UPDATE started is reported, not missed), drawing no
-- token and locking nothing. A name with no row, and every batch of more
-- than one name, runs 000003's statement unchanged. The result rows, the
-- signature, the privileges and the settings (search_path pinned,
-- plan_cache_mode = force_generic_plan) are those of 000003.
--
-- Everything is created in current_schema() of the migrating connection, as
-- in 000004 to 000006.
DO $$
BEGIN
    IF pg_catalog.current_schema() IS NULL OR pg_catalog.current_schema() = 'pg_catalog' THEN
        RAISE EXCEPTION 'pgfence: migration 000007 needs the schema to install into first in search_path (current schema: %)',
            pg_catalog.current_schema();
    END IF;
END;
$$;

CREATE OR REPLACE FUNCTION pgfence_acquire(names text[], new_owner text, ttl_us bigint[])
    RETURNS TABLE(acquired boolean, name text, owner text, fence bigint,
                  acquired_at timestamptz, expires_at timestamptz, db_now timestamptz)
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp -- re-pinned below with the install schema
AS $$
#variable_conflict use_column
BEGIN
    IF pg_catalog.cardinality($1) = 1 AND pg_catalog.cardinality($3) = 1 THEN
        -- One name whose row exists: take it over if it is free, drawing
        -- one token under the row lock; else report its holder.
        RETURN QUERY
        UPDATE pgfence_leases AS l
        SET owner = $2,
            fence = pgfence_next_token(),
            acquired_at = pg_catalog.now(),
            expires_at = pg_catalog.now() + $3[1] * interval '1 microsecond'
        WHERE l.name = $1[1] AND l.expires_at <= pg_catalog.now()
        RETURNING true, l.name, l.owner, l.fence, l.acquired_at, l.expires_at, pg_catalog.now();
        IF FOUND THEN
            RETURN;
        END IF;
        RETURN QUERY
        SELECT false, h.name, h.owner, h.fence, h.acquired_at, h.expires_at, pg_catalog.now()
        FROM pgfence_leases h
        WHERE h.name = $1[1];
        IF FOUND THEN
            RETURN;
        END IF;
        -- No row: insert it below.
    END IF;
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
AS $$ SELECT 7 $$;

COMMENT ON FUNCTION pgfence_schema_version() IS
    'The version of the pgfence schema installed here (the number of its last migration).';

SELECT pg_catalog.set_config('search_path',
    'pg_catalog, ' || pg_catalog.quote_ident(pg_catalog.current_schema()) || ', pg_temp', true);

ALTER FUNCTION pgfence_schema_version() SET search_path FROM CURRENT;
ALTER FUNCTION pgfence_acquire(text[], text, bigint[]) SET search_path FROM CURRENT;
ALTER FUNCTION pgfence_acquire(text[], text, bigint[]) SET plan_cache_mode = force_generic_plan;
