-- Reverts 000012: the functions take back their 000011 signatures and
-- bodies (ownership proven by name, token and owner), notifications carry
-- the lease name again, and the secret column, the notification key and the
-- helpers go. Leases acquired under 000012 keep their rows; their secrets
-- are forgotten.
DROP FUNCTION pgfence_acquire(text[], text, bigint[]);
DROP FUNCTION pgfence_renew(text[], bigint[], text[], bigint[]);
DROP FUNCTION pgfence_release(text[], bigint[], text[], bigint[]);
DROP FUNCTION pgfence_lease_held(text, bigint, text);
DROP FUNCTION pgfence_leader_proclaim(text, bigint, text, text);

CREATE OR REPLACE FUNCTION pgfence_acquire(names text[], new_owner text, ttl_us bigint[]) RETURNS TABLE(acquired boolean, name text, owner text, fence bigint, acquired_at timestamp with time zone, expires_at timestamp with time zone, db_now timestamp with time zone)
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp -- re-pinned below
    AS $_$
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
$_$;
COMMENT ON FUNCTION pgfence_acquire(names text[], new_owner text, ttl_us bigint[]) IS 'Takes each free or expired lease of a batch with a fresh token; returns one row per name: the new lease, or the current holder.';

CREATE OR REPLACE FUNCTION pgfence_renew(names text[], tokens bigint[], ttl_us bigint[]) RETURNS SETOF bigint
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp -- re-pinned below
    AS $_$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    UPDATE pgfence_leases AS l
    SET expires_at = greatest(l.expires_at, pg_catalog.now() + r.ttl_us * interval '1 microsecond')
    FROM ROWS FROM (pg_catalog.unnest($1), pg_catalog.unnest($2), pg_catalog.unnest($3)) AS r(name, fence, ttl_us)
    WHERE l.name = r.name AND l.fence = r.fence AND l.expires_at > pg_catalog.clock_timestamp()
    RETURNING l.fence;
END;
$_$;
COMMENT ON FUNCTION pgfence_renew(names text[], tokens bigint[], ttl_us bigint[]) IS 'Extends each lease of a batch still held with its token; never revives an expired lease.';

CREATE OR REPLACE FUNCTION pgfence_release(names text[], tokens bigint[], at_least_us bigint[], owner text) RETURNS TABLE(fence bigint, durability text)
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp -- re-pinned below
    AS $_$
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
$_$;
COMMENT ON FUNCTION pgfence_release(names text[], tokens bigint[], at_least_us bigint[], owner text) IS 'Releases each lease of a batch still held with its owner and token; notifies pgfence_lease_released for each one (freed, or expiring at its at_least end).';

CREATE OR REPLACE FUNCTION pgfence_lease_held(name text, token bigint) RETURNS boolean
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp -- re-pinned below
    AS $_$
#variable_conflict use_column
BEGIN
    PERFORM 1 FROM pgfence_leases l
    WHERE l.name = $1 AND l.fence = $2 AND l.expires_at > pg_catalog.clock_timestamp()
    FOR SHARE;
    RETURN FOUND;
END;
$_$;
COMMENT ON FUNCTION pgfence_lease_held(name text, token bigint) IS 'True iff the lease is held with the token (database clock); locks its row FOR SHARE for the calling transaction.';

CREATE OR REPLACE FUNCTION pgfence_leader_proclaim(name text, token bigint, owner text, value text) RETURNS boolean
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp -- re-pinned below
    AS $_$
#variable_conflict use_column
DECLARE
    began   timestamptz;
    fresh   boolean := pg_catalog.pg_current_xact_id_if_assigned() IS NULL;
BEGIN
    SELECT l.acquired_at INTO began FROM pgfence_leases l
    WHERE l.name = $1 AND l.fence = $2 AND l.owner = $3 AND l.expires_at > pg_catalog.clock_timestamp()
    FOR SHARE;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    INSERT INTO pgfence_leaders AS d (name, token, owner, value, began_at, proclaimed_at)
    VALUES ($1, $2, $3, $4, began, pg_catalog.now())
    ON CONFLICT (name, token) DO UPDATE SET value = excluded.value, proclaimed_at = excluded.proclaimed_at;
    DELETE FROM pgfence_leaders d
    WHERE d.name = $1 AND d.token < (
        SELECT k.token FROM pgfence_leaders k WHERE k.name = $1 ORDER BY k.token DESC OFFSET 9 LIMIT 1);
    IF fresh THEN
        PERFORM pg_catalog.set_config('synchronous_commit', 'off', true);
    END IF;
    PERFORM pg_catalog.pg_notify('pgfence_leader', $1);
    RETURN true;
END;
$_$;
COMMENT ON FUNCTION pgfence_leader_proclaim(name text, token bigint, owner text, value text) IS 'Records the value a term proclaims if its lease is held (name, token, owner), keeps the newest ten terms, notifies pgfence_leader.';

CREATE OR REPLACE FUNCTION pgfence_force_release(name text, reason text) RETURNS TABLE(old_owner text, old_token bigint, was_held boolean, token bigint)
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp -- re-pinned below
    AS $_$
#variable_conflict use_column
BEGIN
    UPDATE pgfence_leases AS l
    SET fence = pgfence_next_token(), expires_at = pg_catalog.now(),
        owner = 'released-by:' || session_user
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
    PERFORM pg_catalog.pg_notify('pgfence_lease_released', $1);
    RETURN NEXT;
END;
$_$;
COMMENT ON FUNCTION pgfence_force_release(name text, reason text) IS 'Ends a lease whoever holds it (fresh token, expired now), records it in pgfence_forced_releases and notifies waiters.';

CREATE OR REPLACE FUNCTION pgfence_prune_scan(after text, page integer, older_than interval) RETURNS TABLE(last_name text, page_rows bigint, names text[], tokens bigint[], vxids text[])
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp -- re-pinned below
    AS $_$
#variable_conflict use_column
BEGIN
    IF $3 < interval '0' THEN
        RAISE EXCEPTION 'pgfence: prune: older_than must not be negative (got %)', $3
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    RETURN QUERY
    WITH page AS (
        SELECT p.name, p.fence, p.expires_at FROM pgfence_leases p
        WHERE p.name > $1
        ORDER BY p.name
        LIMIT $2
    ), old AS (
        SELECT g.name, g.fence FROM page g WHERE g.expires_at < pg_catalog.now() - $3
    )
    SELECT (SELECT max(g.name) FROM page g),
           (SELECT count(*) FROM page),
           ARRAY(SELECT o.name FROM old o ORDER BY o.name),
           ARRAY(SELECT o.fence FROM old o ORDER BY o.name),
           CASE WHEN EXISTS (SELECT FROM old) THEN ARRAY(
               SELECT DISTINCT k.virtualtransaction FROM pg_catalog.pg_locks k
               WHERE k.locktype = 'relation'
                 AND k.database = (SELECT d.oid FROM pg_catalog.pg_database d WHERE d.datname = pg_catalog.current_database())
                 AND k.relation = 'pgfence_leases'::pg_catalog.regclass
                 AND k.mode = 'RowExclusiveLock' AND k.granted
                 AND k.pid IS DISTINCT FROM pg_catalog.pg_backend_pid())
           END;
END;
$_$;
COMMENT ON FUNCTION pgfence_prune_scan(after text, page integer, older_than interval) IS 'Prune: reads one page of pgfence_leases and lists its long-expired rows and the transactions writing the table.';

CREATE OR REPLACE FUNCTION pgfence_prune_delete(names text[], tokens bigint[], older_than interval) RETURNS bigint
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp -- re-pinned below
    AS $_$
#variable_conflict use_column
DECLARE
    deleted bigint;
BEGIN
    IF $3 < interval '0' THEN
        RAISE EXCEPTION 'pgfence: prune: older_than must not be negative (got %)', $3
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    DELETE FROM pgfence_leases d
    WHERE d.name = ANY(ARRAY(
        SELECT p.name FROM pgfence_leases p
        JOIN ROWS FROM (pg_catalog.unnest($1), pg_catalog.unnest($2)) AS c(name, fence) ON c.name = p.name
        WHERE p.fence = c.fence AND p.expires_at < pg_catalog.now() - $3
        FOR UPDATE OF p SKIP LOCKED
    ));
    GET DIAGNOSTICS deleted = ROW_COUNT;
    RETURN deleted;
END;
$_$;
COMMENT ON FUNCTION pgfence_prune_delete(names text[], tokens bigint[], older_than interval) IS 'Prune: deletes the listed long-expired rows whose token is unchanged, skipping rows another transaction has locked.';

DROP FUNCTION pgfence_notify_payload(text, bigint);
DROP FUNCTION pgfence_check_us(bigint[], bigint, text);
DROP TABLE pgfence_notify_key;
ALTER TABLE pgfence_leases DROP COLUMN secret_hash;

REVOKE ALL ON FUNCTION pgfence_acquire(text[], text, bigint[]) FROM PUBLIC;
REVOKE ALL ON FUNCTION pgfence_renew(text[], bigint[], bigint[]) FROM PUBLIC;
REVOKE ALL ON FUNCTION pgfence_release(text[], bigint[], bigint[], text) FROM PUBLIC;
REVOKE ALL ON FUNCTION pgfence_lease_held(text, bigint) FROM PUBLIC;
REVOKE ALL ON FUNCTION pgfence_leader_proclaim(text, bigint, text, text) FROM PUBLIC;

CREATE OR REPLACE FUNCTION pgfence_schema_version() RETURNS integer
    LANGUAGE sql IMMUTABLE
AS $$ SELECT 11 $$;

SELECT pg_catalog.set_config('search_path',
    'pg_catalog, ' || pg_catalog.quote_ident(pg_catalog.current_schema()) || ', pg_temp', true);

ALTER FUNCTION pgfence_schema_version() SET search_path FROM CURRENT;
ALTER FUNCTION pgfence_acquire(text[], text, bigint[]) SET search_path FROM CURRENT;
ALTER FUNCTION pgfence_acquire(text[], text, bigint[]) SET plan_cache_mode = force_generic_plan;
ALTER FUNCTION pgfence_renew(text[], bigint[], bigint[]) SET search_path FROM CURRENT;
ALTER FUNCTION pgfence_renew(text[], bigint[], bigint[]) SET plan_cache_mode = force_generic_plan;
ALTER FUNCTION pgfence_release(text[], bigint[], bigint[], text) SET search_path FROM CURRENT;
ALTER FUNCTION pgfence_release(text[], bigint[], bigint[], text) SET plan_cache_mode = force_generic_plan;
ALTER FUNCTION pgfence_lease_held(text, bigint) SET search_path FROM CURRENT;
ALTER FUNCTION pgfence_leader_proclaim(text, bigint, text, text) SET search_path FROM CURRENT;
ALTER FUNCTION pgfence_force_release(text, text) SET search_path FROM CURRENT;
ALTER FUNCTION pgfence_prune_scan(text, integer, interval) SET search_path FROM CURRENT;
ALTER FUNCTION pgfence_prune_delete(text[], bigint[], interval) SET search_path FROM CURRENT;
ALTER FUNCTION pgfence_prune_delete(text[], bigint[], interval) SET plan_cache_mode = force_generic_plan;
