-- Gives back version 8: a claim reserves no tokens, and every hand-over
-- draws a token, grants a full TTL and waits for the flush.

CREATE OR REPLACE FUNCTION pgfence_claim_permit(sem text, n integer, new_owner text, ttl_us bigint, claim_secret text, grant_key bytea,
                                     version bigint, alive_key bigint, grant_channel text)
    RETURNS TABLE(acquired boolean, name text, owner text, fence bigint, acquired_at timestamptz, expires_at timestamptz,
                  db_now timestamptz, secret text, permits integer, busy boolean, claimed boolean)
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
    SET plan_cache_mode = force_generic_plan
AS $$
#variable_conflict use_column
DECLARE
    reg       boolean := false;
    r         record;
    h         bytea;
    g_name    text;
    g_fence   bigint;
    g_hash    bytea;
    g_permits integer;
BEGIN
    IF $5 IS NULL OR pg_catalog.octet_length($5) < 32 OR pg_catalog.octet_length($5) > 128 THEN
        RAISE EXCEPTION 'pgfence: a claim''s secret is 32 to 128 bytes'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF $6 IS NULL OR pg_catalog.octet_length($6) <> 32 THEN
        RAISE EXCEPTION 'pgfence: a claim''s grant key is 32 bytes'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF $3 IS NULL OR $3 = '' OR pg_catalog.octet_length($3) > 512 THEN
        RAISE EXCEPTION 'pgfence: an owner is 1 to 512 bytes'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF $7 IS NULL OR $7 < 1 OR $8 IS NULL THEN
        RAISE EXCEPTION 'pgfence: a claim has a positive version and an alive key'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF $9 IS NULL OR $9 = '' OR pg_catalog.octet_length($9) > 63 THEN
        RAISE EXCEPTION 'pgfence: a claim''s grant channel is 1 to 63 bytes'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    h := pg_catalog.sha256(pg_catalog.convert_to($5, 'UTF8'));
    -- A registered claim's row is locked (a cleared one no release grants).
    SELECT q.granted, q.granted_fence, q.secret_hash, q.permits INTO g_name, g_fence, g_hash, g_permits
    FROM pgfence_permit_claims q WHERE q.sem = $1 AND q.secret_hash IS NOT NULL FOR UPDATE;
    IF g_name IS NOT NULL AND g_hash = h THEN
        -- The grant was committed, with its flush, by the release.
        UPDATE pgfence_permit_claims q SET secret_hash = NULL, granted = NULL, granted_fence = NULL WHERE q.sem = $1;
        PERFORM pg_catalog.set_config('synchronous_commit', 'off', true);
        RETURN QUERY
        SELECT true, l.name, l.owner, l.fence, l.acquired_at, l.expires_at, pg_catalog.clock_timestamp(), NULL::text,
               g_permits, false, false
        FROM pgfence_leases l
        WHERE l.name = g_name AND l.fence = g_fence AND l.secret_hash = h
          AND l.expires_at > pg_catalog.clock_timestamp();
        IF FOUND THEN
            RETURN;
        END IF;
        -- Granted and already lost (expired, or released by force): take
        -- another below.
        g_hash := NULL; -- cleared above
    END IF;
    SELECT * INTO STRICT r FROM pgfence_acquire_permit($1, $2, $3, $4, true) a;
    -- No claim either when every permit held is this owner's: its own
    -- release wakes the caller in process, and a claim would only cost.
    reg := NOT r.acquired AND r.permits = $2 AND EXISTS (
        SELECT FROM pgfence_leases p
        WHERE p.name = ANY (ARRAY(SELECT $1 || pg_catalog.chr(31) || g.s FROM pg_catalog.generate_series(0, $2 - 1) g(s)))
          AND p.expires_at > pg_catalog.clock_timestamp() AND p.owner <> $3);
    IF NOT reg THEN
        IF g_hash IS NOT NULL THEN
            UPDATE pgfence_permit_claims q SET secret_hash = NULL, granted = NULL, granted_fence = NULL WHERE q.sem = $1;
        END IF;
    ELSE
        -- The tag is the semaphore's waiters' (pgfence_notify_payload's first
        -- field), so that the Locker finds the claim by it.
        INSERT INTO pgfence_permit_claims AS q (sem, permits, owner, ttl_us, secret_hash, grant_key, tag, channel, version, alive_key)
        VALUES ($1, $2, $3, $4, h, $6, pg_catalog.split_part(pgfence_notify_payload($1 || pg_catalog.chr(31), 0), ':', 1),
                $9, $7, $8)
        ON CONFLICT (sem) DO UPDATE
        SET permits = EXCLUDED.permits, owner = EXCLUDED.owner, ttl_us = EXCLUDED.ttl_us,
            secret_hash = EXCLUDED.secret_hash, grant_key = EXCLUDED.grant_key, tag = EXCLUDED.tag, channel = EXCLUDED.channel,
            version = EXCLUDED.version, alive_key = EXCLUDED.alive_key, claimed_at = pg_catalog.now(),
            granted = NULL, granted_fence = NULL;
    END IF;
    IF NOT r.acquired THEN
        -- Nothing was granted: what this call wrote is the claim (an
        -- unlogged row) and at most the semaphore's count while no permit
        -- is held, which any later grant's flush covers. Its commit need
        -- not wait for a flush (reading may have pruned pages: WAL).
        PERFORM pg_catalog.set_config('synchronous_commit', 'off', true);
    END IF;
    RETURN QUERY SELECT r.acquired, r.name, r.owner, r.fence, r.acquired_at, r.expires_at, r.db_now, r.secret,
        r.permits, r.busy, reg;
END;
$$;

CREATE OR REPLACE FUNCTION pgfence_hand_permit(pname text, token bigint, secret text, at_least_us bigint) RETURNS boolean
    LANGUAGE plpgsql VOLATILE
    SET search_path = pg_catalog, pg_temp
    SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    s    text := pg_catalog.split_part($1, pg_catalog.chr(31), 1);
    slot integer := pg_catalog.split_part($1, pg_catalog.chr(31), 2)::integer;
    c    record;
    t    timestamptz;
    tok  bigint;
    exp  timestamptz;
    msg  text;
BEGIN
    SELECT * INTO c FROM pgfence_permit_claims q
    WHERE q.sem = s AND q.granted IS NULL AND q.secret_hash IS NOT NULL
    FOR UPDATE;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    IF slot >= c.permits THEN
        RETURN false;
    END IF;
    IF NOT pg_catalog.pg_try_advisory_xact_lock_shared(pg_catalog.hashtextextended(s || pg_catalog.chr(31), 7378831))
       OR NOT EXISTS (SELECT FROM pgfence_semaphores m WHERE m.name = s AND m.permits = c.permits)
       OR pg_catalog.pg_try_advisory_xact_lock(c.alive_key)
       OR NOT pg_catalog.pg_try_advisory_xact_lock(pg_catalog.hashtextextended($1, 7378831)) THEN
        RETURN false;
    END IF;
    t := pg_catalog.clock_timestamp();
    UPDATE pgfence_leases AS l
    SET owner = c.owner, fence = pgfence_next_token(), acquired_at = t,
        expires_at = t + c.ttl_us * interval '1 microsecond', secret_hash = c.secret_hash
    WHERE l.name = $1 AND l.fence = $2 AND l.secret_hash = pg_catalog.sha256(pg_catalog.convert_to($3, 'UTF8'))
      AND l.expires_at > t AND l.acquired_at + $4 * interval '1 microsecond' <= pg_catalog.now()
    RETURNING l.fence, l.expires_at INTO tok, exp;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    UPDATE pgfence_permit_claims q SET granted = $1, granted_fence = tok WHERE q.sem = s;
    -- g:tag:version:slot:token:granted_us:expires_us:mac, where tag is the
    -- semaphore's waiters' tag (pgfence_notify_payload's, kept in the
    -- claim) and mac the hex of sha256(grant_key || sha256(grant_key ||
    -- 0x03 || the text before ':mac')).
    msg := 'g:' || c.tag || ':' || c.version || ':' || slot || ':' || tok
        || ':' || pg_catalog.floor(pg_catalog.date_part('epoch', t) * 1000000)::bigint
        || ':' || pg_catalog.floor(pg_catalog.date_part('epoch', exp) * 1000000)::bigint;
    PERFORM pg_catalog.pg_notify(c.channel, msg || ':' || pg_catalog.encode(pg_catalog.sha256(
        c.grant_key || pg_catalog.sha256(c.grant_key || '\x03'::bytea || pg_catalog.convert_to(msg, 'UTF8'))), 'hex'));
    RETURN true;
END;
$$;
COMMENT ON FUNCTION pgfence_hand_permit(pname text, token bigint, secret text, at_least_us bigint) IS
    'Releases permit pname held with token and secret and grants it, in the same update, to the claim of its semaphore''s line head while that claim''s session lives; notifies the grant signed with the claim''s grant key. False, with nothing changed, otherwise.';

ALTER TABLE pgfence_permit_claims DROP COLUMN reserve_next, DROP COLUMN reserve_end, DROP COLUMN reserved_by;

CREATE OR REPLACE FUNCTION pgfence_schema_version() RETURNS integer
    LANGUAGE sql IMMUTABLE
    SET search_path = pg_catalog, pg_temp
AS $$ SELECT 8 $$;

DO $$
DECLARE
    s text := pg_catalog.quote_ident(pg_catalog.current_schema());
    f text;
BEGIN
    FOREACH f IN ARRAY ARRAY['pgfence_claim_permit(text, integer, text, bigint, text, bytea, bigint, bigint, text)',
                             'pgfence_hand_permit(text, bigint, text, bigint)',
                             'pgfence_schema_version()']
    LOOP
        EXECUTE pg_catalog.format('ALTER FUNCTION %s.%s SET search_path = pg_catalog, %s, pg_temp', s, f, s);
    END LOOP;
END;
$$;
