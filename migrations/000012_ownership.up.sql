-- 000012: ownership that no other role can prove, bounded inputs, and
-- notifications that only pgfence's roles can read or forge.
--
-- Until 000011 a lease was renewed, released, checked (pgfence_lease_held)
-- and proclaimed (pgfence_leader_proclaim) with its name, token and owner,
-- which every role granted SELECT on pgfence_leases reads. From here on:
--
--   - Each acquisition draws a secret (256 random bits from
--     gen_random_uuid, as 64 hex digits), returns it only to the acquiring
--     call and stores only its SHA-256 (secret_hash). Renew, release,
--     lease-held checks and proclaims require it. Rows held before this
--     migration have no secret_hash: nobody can act on them, and they end
--     at their expiry.
--   - TTLs, AtLeast and prune ages are checked on their actual length: a TTL
--     is at least 1 microsecond and at most 7 days (MaxTTL), AtLeast at most
--     7 days, a prune age at least one minute however the interval is
--     written. Expiries already further out are brought back to 7 days.
--   - pgfence_acquire answers at once for a name that another transaction is
--     claiming (a transaction-scoped try-lock on the name, taken by every
--     acquire) or whose expired row another transaction has locked: busy,
--     not acquired, no holder. Unrelated names in the batch go ahead.
--   - pgfence_renew skips rows another transaction has locked and reports
--     them as busy instead of waiting, so one locked row never delays the
--     rest of a renewal batch.
--   - Notifications on pgfence_lease_released and pgfence_leader carry
--     tag:token:mac instead of the name: tag and mac are keyed SHA-256 of
--     the name (and token) under a per-install key in pgfence_notify_key,
--     which only pgfence's owner and granted roles read. A role without
--     pgfence's grant learns nothing from them and cannot forge one; a
--     replayed one carries a token its receivers have already seen.
--
-- Everything is created in current_schema() of the migrating connection, as
-- in 000004 to 000011.
DO $$
BEGIN
    IF pg_catalog.current_schema() IS NULL OR pg_catalog.current_schema() = 'pg_catalog' THEN
        RAISE EXCEPTION 'pgfence: migration 000012 needs the schema to install into first in search_path (current schema: %)',
            pg_catalog.current_schema();
    END IF;
END;
$$;

ALTER TABLE pgfence_leases ADD COLUMN secret_hash bytea;
COMMENT ON COLUMN pgfence_leases.secret_hash IS
    'SHA-256 of the secret returned to the acquiring call; renew, release, lease-held checks and proclaims must present the secret.';

UPDATE pgfence_leases SET expires_at = pg_catalog.now() + interval '7 days'
WHERE expires_at > pg_catalog.now() + interval '7 days';

CREATE TABLE pgfence_notify_key (
    one boolean PRIMARY KEY DEFAULT true CHECK (one),
    key bytea   NOT NULL CHECK (pg_catalog.octet_length(key) = 32)
);
INSERT INTO pgfence_notify_key (key)
SELECT pg_catalog.decode(pg_catalog.replace(
    pg_catalog.gen_random_uuid()::text || pg_catalog.gen_random_uuid()::text, '-', ''), 'hex');
COMMENT ON TABLE pgfence_notify_key IS
    'pgfence: the key of the tags and MACs in notification payloads (tag:token:mac); readable by pgfence''s roles only.';

-- pgfence_notify_payload is the payload announcing that the lease name with
-- token was released (or, on pgfence_leader, proclaimed):
--   tag   = hex of the first 16 bytes of sha256(key || 0x01 || name)
--   mac   = hex of the first 16 bytes of sha256(key || sha256(key || 0x02 || tag ':' token))
CREATE FUNCTION pgfence_notify_payload(name text, token bigint) RETURNS text
    LANGUAGE plpgsql STABLE
    SET search_path = pg_catalog, pg_temp -- re-pinned below with the install schema
AS $$
DECLARE
    k   bytea;
    tag text;
    msg text;
BEGIN
    SELECT n.key INTO STRICT k FROM pgfence_notify_key n;
    tag := pg_catalog.encode(pg_catalog.substr(pg_catalog.sha256(
        k OPERATOR(pg_catalog.||) '\x01'::bytea OPERATOR(pg_catalog.||) pg_catalog.convert_to(name, 'UTF8')), 1, 16), 'hex');
    msg := tag OPERATOR(pg_catalog.||) ':' OPERATOR(pg_catalog.||) token::text;
    RETURN msg OPERATOR(pg_catalog.||) ':' OPERATOR(pg_catalog.||) pg_catalog.encode(pg_catalog.substr(pg_catalog.sha256(
        k OPERATOR(pg_catalog.||) pg_catalog.sha256(k OPERATOR(pg_catalog.||) '\x02'::bytea OPERATOR(pg_catalog.||) pg_catalog.convert_to(msg, 'UTF8'))),
        1, 16), 'hex');
END;
$$;
REVOKE ALL ON FUNCTION pgfence_notify_payload(text, bigint) FROM PUBLIC;

-- pgfence_check_us raises invalid_parameter_value unless every element of
-- us is a duration in microseconds within [lo, 7 days].
CREATE FUNCTION pgfence_check_us(us bigint[], lo bigint, what text) RETURNS void
    LANGUAGE plpgsql IMMUTABLE
    SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF us IS NULL OR EXISTS (SELECT FROM pg_catalog.unnest(us) AS u(v)
                             WHERE u.v IS NULL OR u.v OPERATOR(pg_catalog.<) lo OR u.v OPERATOR(pg_catalog.>) 604800000000) THEN
        RAISE EXCEPTION 'pgfence: % must be between % microseconds and 7 days (604800000000 microseconds)', what, lo
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
END;
$$;
REVOKE ALL ON FUNCTION pgfence_check_us(bigint[], bigint, text) FROM PUBLIC;

DROP FUNCTION pgfence_acquire(text[], text, bigint[]);
CREATE FUNCTION pgfence_acquire(names text[], new_owner text, ttl_us bigint[])
    RETURNS TABLE(acquired boolean, name text, owner text, fence bigint, acquired_at timestamptz,
                  expires_at timestamptz, db_now timestamptz, secret text)
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp -- re-pinned below with the install schema
AS $$
#variable_conflict use_column
DECLARE
    sec text;
    got boolean;
BEGIN
    PERFORM pgfence_check_us($3, 1, 'a TTL');
    IF pg_catalog.cardinality($1) IS DISTINCT FROM pg_catalog.cardinality($3) THEN
        RAISE EXCEPTION 'pgfence: pgfence_acquire needs as many TTLs as names'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF pg_catalog.cardinality($1) = 1 THEN
        -- One name. Busy while another transaction claims it or holds its
        -- expired row locked; else take over the expired row or insert it,
        -- drawing one token; else report its holder.
        IF NOT pg_catalog.pg_try_advisory_xact_lock(pg_catalog.hashtextextended($1[1], 7378831)) THEN
            RETURN QUERY SELECT false, $1[1], NULL::text, NULL::bigint, NULL::timestamptz, NULL::timestamptz, pg_catalog.now(), NULL::text;
            RETURN;
        END IF;
        sec := pg_catalog.replace(pg_catalog.gen_random_uuid()::text || pg_catalog.gen_random_uuid()::text, '-', '');
        RETURN QUERY
        UPDATE pgfence_leases AS l
        SET owner = $2,
            fence = pgfence_next_token(),
            acquired_at = pg_catalog.now(),
            expires_at = pg_catalog.now() + $3[1] * interval '1 microsecond',
            secret_hash = pg_catalog.sha256(pg_catalog.convert_to(sec, 'UTF8'))
        WHERE l.name = $1[1] AND l.expires_at <= pg_catalog.now()
          AND l.name IN (SELECT p.name FROM pgfence_leases p
                         WHERE p.name = $1[1] AND p.expires_at <= pg_catalog.now()
                         FOR NO KEY UPDATE SKIP LOCKED)
        RETURNING true, l.name, l.owner, l.fence, l.acquired_at, l.expires_at, pg_catalog.now(), sec;
        IF FOUND THEN
            RETURN;
        END IF;
        RETURN QUERY
        SELECT false, h.name,
               CASE WHEN h.expires_at > pg_catalog.now() THEN h.owner END,
               CASE WHEN h.expires_at > pg_catalog.now() THEN h.fence END,
               CASE WHEN h.expires_at > pg_catalog.now() THEN h.acquired_at END,
               CASE WHEN h.expires_at > pg_catalog.now() THEN h.expires_at END,
               pg_catalog.now(), NULL::text
        FROM pgfence_leases h
        WHERE h.name = $1[1];
        IF FOUND THEN
            RETURN;
        END IF;
        RETURN QUERY
        INSERT INTO pgfence_leases AS l (name, owner, fence, acquired_at, expires_at, secret_hash)
        VALUES ($1[1], $2, pgfence_next_token(), pg_catalog.now(),
                pg_catalog.now() + $3[1] * interval '1 microsecond',
                pg_catalog.sha256(pg_catalog.convert_to(sec, 'UTF8')))
        ON CONFLICT (name) DO NOTHING
        RETURNING true, l.name, l.owner, l.fence, l.acquired_at, l.expires_at, pg_catalog.now(), sec;
        IF FOUND THEN
            RETURN;
        END IF;
        RETURN QUERY SELECT false, $1[1], NULL::text, NULL::bigint, NULL::timestamptz, NULL::timestamptz, pg_catalog.now(), NULL::text;
        RETURN;
    END IF;
    -- A batch: the same steps, set by set. claim: the names this call may
    -- claim (their try-lock taken); locked: their expired rows, locked here
    -- unless another transaction holds them.
    RETURN QUERY
    WITH req AS MATERIALIZED (
        SELECT r.name, r.ttl_us,
               pg_catalog.replace(pg_catalog.gen_random_uuid()::text || pg_catalog.gen_random_uuid()::text, '-', '') AS secret
        FROM ROWS FROM (pg_catalog.unnest($1), pg_catalog.unnest($3)) AS r(name, ttl_us)
    ), claim AS MATERIALIZED (
        SELECT r.name, r.ttl_us, r.secret FROM req r
        WHERE pg_catalog.pg_try_advisory_xact_lock(pg_catalog.hashtextextended(r.name, 7378831))
    ), locked AS MATERIALIZED (
        SELECT p.name FROM pgfence_leases p
        WHERE p.name IN (SELECT c.name FROM claim c) AND p.expires_at <= pg_catalog.now()
        ORDER BY p.name
        FOR NO KEY UPDATE SKIP LOCKED
    ), current AS MATERIALIZED (
        SELECT p.name, p.expires_at > pg_catalog.now() AS held FROM pgfence_leases p
        WHERE p.name IN (SELECT r.name FROM req r)
    ), acquired AS (
        INSERT INTO pgfence_leases AS l (name, owner, fence, acquired_at, expires_at, secret_hash)
        SELECT c.name, $2, pgfence_next_token(), pg_catalog.now(),
               pg_catalog.now() + c.ttl_us * interval '1 microsecond',
               pg_catalog.sha256(pg_catalog.convert_to(c.secret, 'UTF8'))
        FROM claim c
        WHERE c.name IN (SELECT k.name FROM locked k)
           OR NOT EXISTS (SELECT FROM current u WHERE u.name = c.name)
        ORDER BY c.name
        ON CONFLICT (name) DO UPDATE
            SET owner = excluded.owner,
                fence = pgfence_next_token(),
                acquired_at = excluded.acquired_at,
                expires_at = excluded.expires_at,
                secret_hash = excluded.secret_hash
            WHERE l.expires_at <= pg_catalog.now() AND l.name IN (SELECT k.name FROM locked k)
        RETURNING l.name, l.owner, l.fence, l.acquired_at, l.expires_at
    )
    SELECT true, a.name, a.owner, a.fence, a.acquired_at, a.expires_at, pg_catalog.now(), c.secret
    FROM acquired a JOIN claim c ON c.name = a.name
    UNION ALL
    SELECT false, p.name, p.owner, p.fence, p.acquired_at, p.expires_at, pg_catalog.now(), NULL::text
    FROM pgfence_leases p
    WHERE p.name IN (SELECT r.name FROM req r) AND p.expires_at > pg_catalog.now()
      AND p.name NOT IN (SELECT a.name FROM acquired a)
    UNION ALL
    SELECT false, r.name, NULL::text, NULL::bigint, NULL::timestamptz, NULL::timestamptz, pg_catalog.now(), NULL::text
    FROM req r
    WHERE r.name NOT IN (SELECT a.name FROM acquired a)
      AND NOT EXISTS (SELECT FROM pgfence_leases p WHERE p.name = r.name AND p.expires_at > pg_catalog.now());
END;
$$;
COMMENT ON FUNCTION pgfence_acquire(text[], text, bigint[]) IS
    'Takes each free or expired lease of a batch with a fresh token and secret; returns one row per name: the new lease with its secret, the current holder, or (owner NULL) busy: claimed or locked by another transaction.';
REVOKE ALL ON FUNCTION pgfence_acquire(text[], text, bigint[]) FROM PUBLIC;

DROP FUNCTION pgfence_renew(text[], bigint[], bigint[]);
CREATE FUNCTION pgfence_renew(names text[], tokens bigint[], secrets text[], ttl_us bigint[])
    RETURNS TABLE(fence bigint, renewed boolean)
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp -- re-pinned below with the install schema
AS $$
#variable_conflict use_column
BEGIN
    PERFORM pgfence_check_us($4, 1, 'a TTL');
    RETURN QUERY
    WITH req AS MATERIALIZED (
        SELECT r.name, r.fence, r.ttl_us, pg_catalog.sha256(pg_catalog.convert_to(r.secret, 'UTF8')) AS h
        FROM ROWS FROM (pg_catalog.unnest($1), pg_catalog.unnest($2), pg_catalog.unnest($3), pg_catalog.unnest($4))
            AS r(name, fence, secret, ttl_us)
    ), mine AS MATERIALIZED (
        SELECT p.name FROM pgfence_leases p JOIN req r ON r.name = p.name
        WHERE p.fence = r.fence AND p.secret_hash = r.h AND p.expires_at > pg_catalog.clock_timestamp()
        ORDER BY p.name
        FOR NO KEY UPDATE OF p SKIP LOCKED
    ), done AS (
        UPDATE pgfence_leases AS l
        SET expires_at = greatest(l.expires_at, pg_catalog.now() + r.ttl_us * interval '1 microsecond')
        FROM req r
        WHERE l.name = r.name AND l.name IN (SELECT m.name FROM mine m)
          AND l.fence = r.fence AND l.expires_at > pg_catalog.clock_timestamp()
        RETURNING l.fence
    )
    SELECT d.fence, true FROM done d
    UNION ALL
    SELECT r.fence, false FROM req r
    WHERE r.name NOT IN (SELECT m.name FROM mine m)
      AND EXISTS (SELECT FROM pgfence_leases p
                  WHERE p.name = r.name AND p.fence = r.fence AND p.secret_hash = r.h
                    AND p.expires_at > pg_catalog.clock_timestamp());
END;
$$;
COMMENT ON FUNCTION pgfence_renew(text[], bigint[], text[], bigint[]) IS
    'Extends each lease of a batch still held with its token and secret (never revives an expired one); a row locked by another transaction is skipped and returned with renewed = false.';
REVOKE ALL ON FUNCTION pgfence_renew(text[], bigint[], text[], bigint[]) FROM PUBLIC;

DROP FUNCTION pgfence_release(text[], bigint[], bigint[], text);
CREATE FUNCTION pgfence_release(names text[], tokens bigint[], secrets text[], at_least_us bigint[])
    RETURNS TABLE(fence bigint, durability text)
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp -- re-pinned below with the install schema
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
COMMENT ON FUNCTION pgfence_release(text[], bigint[], text[], bigint[]) IS
    'Releases each lease of a batch still held with its token and secret; notifies pgfence_lease_released (tag:token:mac) for each one.';
REVOKE ALL ON FUNCTION pgfence_release(text[], bigint[], text[], bigint[]) FROM PUBLIC;

DROP FUNCTION pgfence_lease_held(text, bigint);
CREATE FUNCTION pgfence_lease_held(name text, token bigint, secret text) RETURNS boolean
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp -- re-pinned below with the install schema
AS $$
#variable_conflict use_column
BEGIN
    PERFORM 1 FROM pgfence_leases l
    WHERE l.name = $1 AND l.fence = $2
      AND l.secret_hash = pg_catalog.sha256(pg_catalog.convert_to($3, 'UTF8'))
      AND l.expires_at > pg_catalog.clock_timestamp()
    FOR SHARE;
    RETURN FOUND;
END;
$$;
COMMENT ON FUNCTION pgfence_lease_held(text, bigint, text) IS
    'True iff the lease is held with the token and secret (database clock); locks its row FOR SHARE for the calling transaction.';
REVOKE ALL ON FUNCTION pgfence_lease_held(text, bigint, text) FROM PUBLIC;

DROP FUNCTION pgfence_leader_proclaim(text, bigint, text, text);
CREATE FUNCTION pgfence_leader_proclaim(name text, token bigint, secret text, value text) RETURNS boolean
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp -- re-pinned below with the install schema
AS $$
#variable_conflict use_column
DECLARE
    began timestamptz;
    who   text;
    fresh boolean := pg_catalog.pg_current_xact_id_if_assigned() IS NULL;
BEGIN
    SELECT l.acquired_at, l.owner INTO began, who FROM pgfence_leases l
    WHERE l.name = $1 AND l.fence = $2
      AND l.secret_hash = pg_catalog.sha256(pg_catalog.convert_to($3, 'UTF8'))
      AND l.expires_at > pg_catalog.clock_timestamp()
    FOR SHARE;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    INSERT INTO pgfence_leaders AS d (name, token, owner, value, began_at, proclaimed_at)
    VALUES ($1, $2, who, $4, began, pg_catalog.now())
    ON CONFLICT (name, token) DO UPDATE SET value = excluded.value, proclaimed_at = excluded.proclaimed_at;
    DELETE FROM pgfence_leaders d
    WHERE d.name = $1 AND d.token < (
        SELECT k.token FROM pgfence_leaders k WHERE k.name = $1 ORDER BY k.token DESC OFFSET 9 LIMIT 1);
    IF fresh THEN
        PERFORM pg_catalog.set_config('synchronous_commit', 'off', true);
    END IF;
    PERFORM pg_catalog.pg_notify('pgfence_leader', pgfence_notify_payload($1, $2));
    RETURN true;
END;
$$;
COMMENT ON FUNCTION pgfence_leader_proclaim(text, bigint, text, text) IS
    'Records the value a term proclaims if its lease is held (name, token, secret), keeps the newest ten terms, notifies pgfence_leader (tag:token:mac).';
REVOKE ALL ON FUNCTION pgfence_leader_proclaim(text, bigint, text, text) FROM PUBLIC;

CREATE OR REPLACE FUNCTION pgfence_force_release(name text, reason text)
    RETURNS TABLE(old_owner text, old_token bigint, was_held boolean, token bigint)
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp -- re-pinned below with the install schema
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

-- Prune: an age is refused unless now() - older_than lies at least a minute
-- in the past, however the interval is written ('-1 year 360 days' compares
-- as zero but moves the cutoff five days ahead).
CREATE OR REPLACE FUNCTION pgfence_prune_scan(after text, page integer, older_than interval)
    RETURNS TABLE(last_name text, page_rows bigint, names text[], tokens bigint[], vxids text[])
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp -- re-pinned below with the install schema
AS $$
#variable_conflict use_column
BEGIN
    IF $3 IS NULL OR pg_catalog.now() - $3 > pg_catalog.now() - interval '1 minute' THEN
        RAISE EXCEPTION 'pgfence: prune: older_than must reach at least a minute into the past (got %)', $3
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
$$;

CREATE OR REPLACE FUNCTION pgfence_prune_delete(names text[], tokens bigint[], older_than interval) RETURNS bigint
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp -- re-pinned below with the install schema
AS $$
#variable_conflict use_column
DECLARE
    deleted bigint;
BEGIN
    IF $3 IS NULL OR pg_catalog.now() - $3 > pg_catalog.now() - interval '1 minute' THEN
        RAISE EXCEPTION 'pgfence: prune: older_than must reach at least a minute into the past (got %)', $3
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
$$;

CREATE OR REPLACE FUNCTION pgfence_schema_version() RETURNS integer
    LANGUAGE sql IMMUTABLE
AS $$ SELECT 12 $$;

SELECT pg_catalog.set_config('search_path',
    'pg_catalog, ' || pg_catalog.quote_ident(pg_catalog.current_schema()) || ', pg_temp', true);

ALTER FUNCTION pgfence_schema_version() SET search_path FROM CURRENT;
ALTER FUNCTION pgfence_notify_payload(text, bigint) SET search_path FROM CURRENT;
ALTER FUNCTION pgfence_check_us(bigint[], bigint, text) SET search_path FROM CURRENT;
ALTER FUNCTION pgfence_acquire(text[], text, bigint[]) SET search_path FROM CURRENT;
ALTER FUNCTION pgfence_acquire(text[], text, bigint[]) SET plan_cache_mode = force_generic_plan;
ALTER FUNCTION pgfence_renew(text[], bigint[], text[], bigint[]) SET search_path FROM CURRENT;
ALTER FUNCTION pgfence_renew(text[], bigint[], text[], bigint[]) SET plan_cache_mode = force_generic_plan;
ALTER FUNCTION pgfence_release(text[], bigint[], text[], bigint[]) SET search_path FROM CURRENT;
ALTER FUNCTION pgfence_release(text[], bigint[], text[], bigint[]) SET plan_cache_mode = force_generic_plan;
ALTER FUNCTION pgfence_lease_held(text, bigint, text) SET search_path FROM CURRENT;
ALTER FUNCTION pgfence_leader_proclaim(text, bigint, text, text) SET search_path FROM CURRENT;
ALTER FUNCTION pgfence_force_release(text, text) SET search_path FROM CURRENT;
ALTER FUNCTION pgfence_prune_scan(text, integer, interval) SET search_path FROM CURRENT;
ALTER FUNCTION pgfence_prune_delete(text[], bigint[], interval) SET search_path FROM CURRENT;
ALTER FUNCTION pgfence_prune_delete(text[], bigint[], interval) SET plan_cache_mode = force_generic_plan;
