-- Gives back version 7: releases notify the waiters of a freed permit and
-- grant it to no one; the claims and their functions go.

DROP FUNCTION pgfence_claim_permit(text, integer, text, bigint, text, bytea, bigint, bigint, text);
DROP FUNCTION pgfence_unclaim_permit(text, text, boolean);

-- pgfence_release as versions 2 to 7 had it.
CREATE OR REPLACE FUNCTION pgfence_release(names text[], tokens bigint[], secrets text[], at_least_us bigint[])
    RETURNS TABLE(fence bigint, durability text)
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
    SET plan_cache_mode = force_generic_plan
AS $$
#variable_conflict use_column
DECLARE
    freed boolean;
BEGIN
    PERFORM pgfence_check_us($4, 0, 'AtLeast');
    IF pg_catalog.cardinality($1) = 1 AND pg_catalog.cardinality($2) = 1 AND pg_catalog.cardinality($3) = 1
       AND pg_catalog.cardinality($4) = 1 THEN
        UPDATE pgfence_leases AS l
        SET expires_at = greatest(pg_catalog.now(), l.acquired_at + $4[1] * interval '1 microsecond')
        WHERE l.name = $1[1] AND l.fence = $2[1]
          AND l.secret_hash = pg_catalog.sha256(pg_catalog.convert_to($3[1], 'UTF8'))
          AND l.expires_at > pg_catalog.clock_timestamp()
        RETURNING l.fence, l.expires_at <= pg_catalog.now() INTO fence, freed;
        IF NOT FOUND THEN
            RETURN;
        END IF;
        PERFORM pgfence_notify_waiters($1[1], $2[1]);
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
        FROM ROWS FROM (pg_catalog.unnest($1), pg_catalog.unnest($2), pg_catalog.unnest($3), pg_catalog.unnest($4))
            AS r(name, fence, secret, at_least_us)
        WHERE l.name = r.name AND l.fence = r.fence
          AND l.secret_hash = pg_catalog.sha256(pg_catalog.convert_to(r.secret, 'UTF8'))
          AND l.expires_at > pg_catalog.clock_timestamp()
        RETURNING l.name, l.fence, l.expires_at <= pg_catalog.now() AS freed
    )
    SELECT r.fence, a.durability FROM released r
    LEFT JOIN LATERAL (
        SELECT pgfence_notify_waiters(r.name, r.fence)
    ) n ON true
    LEFT JOIN (
        SELECT pg_catalog.set_config('synchronous_commit', 'off', true) FROM released HAVING bool_and(freed)
    ) a(durability) ON true;
END;
$$;
COMMENT ON FUNCTION pgfence_release(names text[], tokens bigint[], secrets text[], at_least_us bigint[]) IS
    'Releases each lease of a batch still held with its token and secret; notifies pgfence_lease_released (tag:token:mac) for each one that a waiter registered for (pgfence_notify_waiters).';

DROP FUNCTION pgfence_hand_permit(text, bigint, text, bigint);
DROP TABLE pgfence_permit_claims;

CREATE OR REPLACE FUNCTION pgfence_schema_version() RETURNS integer
    LANGUAGE sql IMMUTABLE
    SET search_path = pg_catalog, pg_temp
AS $$ SELECT 7 $$;

-- CREATE OR REPLACE keeps owners and grants but replaces the SET clauses:
-- pin the search_path of the functions above again, as version 7 did.
DO $$
DECLARE
    s text := pg_catalog.quote_ident(pg_catalog.current_schema());
    f text;
BEGIN
    FOREACH f IN ARRAY ARRAY['pgfence_release(text[], bigint[], text[], bigint[])',
                             'pgfence_schema_version()']
    LOOP
        EXECUTE pg_catalog.format('ALTER FUNCTION %s.%s SET search_path = pg_catalog, %s, pg_temp', s, f, s);
    END LOOP;
END;
$$;
