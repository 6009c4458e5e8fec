-- pgfence schema version 2: a lease-table release notifies only when a
-- waiter registered interest in the name (docs/leasetable.md, Waiting).
--
-- Every NOTIFY makes its transaction's commit take a cluster-wide lock, so
-- a release that notified unconditionally queued behind every other
-- notifying transaction of the server, and they behind it. A waiter (any
-- Locker, any process) holds a shared session advisory lock on the name's
-- interest key, on its LISTEN connection, from before the attempt after
-- which it waits; a release tries the exclusive transaction-level lock on
-- that key and notifies only when the try fails. Either the waiter's lock
-- came first (the release notifies) or the release's did (the waiter's
-- lock waits for its commit, and the waiter's next attempt sees the row
-- free). The key is (1885824620, the first 4 bytes of the name's tag as a
-- signed int4): 1885824620 is the bytes "pgfl", and the tag is keyed, so
-- the key does not reveal the name.

CREATE FUNCTION pgfence_notify_waiters(name text, token bigint) RETURNS boolean
    LANGUAGE plpgsql VOLATILE
    SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    h bytea;
BEGIN
    SELECT pg_catalog.sha256(n.key OPERATOR(pg_catalog.||) '\x01'::bytea OPERATOR(pg_catalog.||) pg_catalog.convert_to($1, 'UTF8'))
    INTO STRICT h FROM pgfence_notify_key n;
    IF pg_catalog.pg_try_advisory_xact_lock(1885824620,
           (pg_catalog.get_byte(h, 0) OPERATOR(pg_catalog.<<) 24) OPERATOR(pg_catalog.|)
           (pg_catalog.get_byte(h, 1) OPERATOR(pg_catalog.<<) 16) OPERATOR(pg_catalog.|)
           (pg_catalog.get_byte(h, 2) OPERATOR(pg_catalog.<<) 8) OPERATOR(pg_catalog.|)
           pg_catalog.get_byte(h, 3)) THEN
        RETURN false;
    END IF;
    PERFORM pg_catalog.pg_notify('pgfence_lease_released', pgfence_notify_payload($1, $2));
    RETURN true;
END;
$$;
COMMENT ON FUNCTION pgfence_notify_waiters(name text, token bigint) IS
    'Notifies pgfence_lease_released (tag:token:mac) that lease name was released with token, only if a session holds the name''s interest key (a waiter); returns whether it notified.';

-- As in version 1, but the notification goes through pgfence_notify_waiters.
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

-- As in version 1, but the notification goes through pgfence_notify_waiters.
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
    PERFORM pgfence_notify_waiters($1, old_token);
    RETURN NEXT;
END;
$$;
COMMENT ON FUNCTION pgfence_force_release(name text, reason text) IS
    'Ends a lease whoever holds it (fresh token, expired now), records it in pgfence_forced_releases and notifies its waiters, if any.';

CREATE OR REPLACE FUNCTION pgfence_schema_version() RETURNS integer
    LANGUAGE sql IMMUTABLE
    SET search_path = pg_catalog, pg_temp
AS $$ SELECT 2 $$;

-- Pin the search_path of the functions (re)defined above, as version 1
-- does, and take EXECUTE on the new one from PUBLIC (CREATE OR REPLACE
-- keeps the others' grants).
DO $$
DECLARE
    s text := pg_catalog.quote_ident(pg_catalog.current_schema());
    f text;
BEGIN
    FOREACH f IN ARRAY ARRAY['pgfence_notify_waiters(text, bigint)',
                             'pgfence_release(text[], bigint[], text[], bigint[])',
                             'pgfence_force_release(text, text)',
                             'pgfence_schema_version()']
    LOOP
        EXECUTE pg_catalog.format('ALTER FUNCTION %s.%s SET search_path = pg_catalog, %s, pg_temp', s, f, s);
    END LOOP;
    EXECUTE pg_catalog.format('REVOKE ALL ON FUNCTION %s.pgfence_notify_waiters(text, bigint) FROM PUBLIC', s);
END;
$$;
