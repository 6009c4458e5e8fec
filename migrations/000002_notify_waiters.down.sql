-- Back to schema version 1: releases notify whether or not anyone waits.
CREATE OR REPLACE FUNCTION pgfence_schema_version() RETURNS integer
    LANGUAGE sql IMMUTABLE
    SET search_path = pg_catalog, pg_temp
AS $$ SELECT 1 $$;

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
        PERFORM pg_catalog.pg_notify('pgfence_lease_released', pgfence_notify_payload($1[1], $2[1]));
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
        SELECT pg_catalog.pg_notify('pgfence_lease_released', pgfence_notify_payload(r.name, r.fence))
    ) n ON true
    LEFT JOIN (
        SELECT pg_catalog.set_config('synchronous_commit', 'off', true) FROM released HAVING bool_and(freed)
    ) a(durability) ON true;
END;
$$;
COMMENT ON FUNCTION pgfence_release(names text[], tokens bigint[], secrets text[], at_least_us bigint[]) IS
    'Releases each lease of a batch still held with its token and secret; notifies pgfence_lease_released (tag:token:mac) for each one.';

CREATE OR REPLACE FUNCTION pgfence_force_release(name text, reason text)
    RETURNS TABLE(old_owner text, old_token bigint, was_held boolean, token bigint)
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
BEGIN
    UPDATE pgfence_leases AS l
    SET fence = pgfence_next_token(), expires_at = pg_catalog.now(),
        owner = 'released-by:' || session_user, secret_hash = NULL
    FROM (SELECT p.name, p.owner, p.fence, p.expires_at FROM pgfence_leases p WHERE p.name = $1 FOR UPDATE) AS old
    WHERE l.name = old.name
    RETURNING old.owner, old.fence, old.expires_at > pg_catalog.now(), l.fence
    INTO old_owner, old_token, was_held, token;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    INSERT INTO pgfence_forced_releases (name, old_owner, old_token, new_token, was_held, reason)
    VALUES ($1, old_owner, old_token, token, was_held, $2);
    RAISE LOG 'pgfence: lease % force-released by % from %: token % -> %, old owner %, was held %, reason %',
        pg_catalog.to_json($1)::text, pg_catalog.to_json(session_user::text)::text,
        coalesce(pg_catalog.host(pg_catalog.inet_client_addr()), 'local'),
        old_token, token, pg_catalog.to_json(old_owner)::text, was_held, pg_catalog.to_json($2)::text;
    PERFORM pg_catalog.pg_notify('pgfence_lease_released', pgfence_notify_payload($1, old_token));
    RETURN NEXT;
END;
$$;
COMMENT ON FUNCTION pgfence_force_release(name text, reason text) IS
    'Ends a lease whoever holds it (fresh token, expired now), records it in pgfence_forced_releases and notifies waiters.';

DROP FUNCTION IF EXISTS pgfence_notify_waiters(text, bigint);

DO $$
DECLARE
    s text := pg_catalog.quote_ident(pg_catalog.current_schema());
    f text;
BEGIN
    FOREACH f IN ARRAY ARRAY['pgfence_release(text[], bigint[], text[], bigint[])',
                             'pgfence_force_release(text, text)',
                             'pgfence_schema_version()']
    LOOP
        EXECUTE pg_catalog.format('ALTER FUNCTION %s.%s SET search_path = pg_catalog, %s, pg_temp', s, f, s);
    END LOOP;
END;
$$;
