-- pgfence version 8: a release hands a freed permit to the head of its
-- semaphore's line in its own statement (docs/semaphores.md, Hand-over).
--
-- Until version 7 a hand-over took two statements, one after the other:
-- the release, whose notification woke the head of the line, then the
-- head's pgfence_acquire_permit, whose commit waited for the WAL flush.
-- Now the head, on its line connection, registers a claim
-- (pgfence_claim_permit): its owner, TTL, the SHA-256 of a secret of its
-- own, a grant key, a version and the channel its Locker listens on for
-- grants. A release that frees a permit of that semaphore
-- (pgfence_release) grants it to the claim in the same row update, with a
-- fresh token, and notifies the claim's channel with a payload the grant
-- key signs (no other Locker's connection is woken); its commit waits for
-- the flush, as a grant's must. The head adopts the grant from the
-- notification, without a statement of its own.
--
-- A claim is honoured only while the session that registered it lives: the
-- head's line connection holds a session advisory lock on a random key of
-- its own (alive_key) for as long as it is open, and a release passes over
-- a claim whose key it can take (a head that crashed or lost its
-- connection), notifying the waiters as before. A head that leaves the
-- line clears its claim before it gives the line key back. A semaphore's
-- claim row stays, cleared (secret_hash NULL), between claims: its
-- updates stay in place (HOT), and the table keeps one small row per
-- semaphore that had a waiter, as pgfence_semaphores keeps one per
-- semaphore. Claims live in an unlogged table (no WAL; emptied by a
-- crash or a failover, which end the line's sessions anyway) that no role
-- but its owner reads: the grant key never leaves it but to the claimant,
-- so no other role can forge a grant notification, and the secret's hash
-- is the lease's, as any acquire's.

CREATE UNLOGGED TABLE pgfence_permit_claims (
    sem           text        NOT NULL,
    permits       integer     NOT NULL,
    owner         text        NOT NULL,
    ttl_us        bigint      NOT NULL,
    secret_hash   bytea,
    grant_key     bytea       NOT NULL,
    tag           text        NOT NULL,
    channel       text        NOT NULL,
    version       bigint      NOT NULL,
    alive_key     bigint      NOT NULL,
    claimed_at    timestamptz NOT NULL DEFAULT pg_catalog.now(),
    granted       text,
    granted_fence bigint,
    CONSTRAINT pgfence_permit_claims_pkey PRIMARY KEY (sem)
);
COMMENT ON TABLE pgfence_permit_claims IS
    'pgfence: the claim of the head of each semaphore''s line, which a release that frees a permit grants it (granted, granted_fence) while its session holds alive_key; secret_hash NULL: no claim.';
REVOKE ALL ON TABLE pgfence_permit_claims FROM PUBLIC;

-- Called by the head of semaphore sem's line, on the session holding the
-- line key and the session advisory lock alive_key: returns the permit a
-- release granted to its claim (secret's hash), else takes a free or
-- expired permit as pgfence_acquire_permit does in the line, else, when a
-- permit is held by another owner than new_owner, registers (or renews)
-- its claim (claimed): owner new_owner, TTL ttl_us, secret's SHA-256,
-- grant_key (32 bytes), version, alive_key and the channel to notify a
-- grant on (grant_channel). acquired with secret NULL is a grant to the
-- claim: the lease's secret is the claimant's. A registered claim's row
-- is locked first, so a release granting it has committed before the call
-- looks for the grant, and none grants it while the call runs.
CREATE FUNCTION pgfence_claim_permit(sem text, n integer, new_owner text, ttl_us bigint, claim_secret text, grant_key bytea,
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
COMMENT ON FUNCTION pgfence_claim_permit(sem text, n integer, new_owner text, ttl_us bigint, claim_secret text, grant_key bytea,
                                         version bigint, alive_key bigint, grant_channel text) IS
    'For the head of semaphore sem''s line only: the permit granted to its claim, else a free one, else it registers its claim (secret''s hash, grant key, version) for the next release to grant.';

-- Called by the head of semaphore sem's line as it leaves the line: clears
-- its claim (the one registered with claim_secret); with give_back, a
-- permit already granted to it is released (and its semaphore's waiters
-- notified). Returns the token of the permit given back, NULL if none.
CREATE FUNCTION pgfence_unclaim_permit(sem text, claim_secret text, give_back boolean) RETURNS bigint
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    c   record;
    tok bigint;
BEGIN
    SELECT * INTO c FROM pgfence_permit_claims q
    WHERE q.sem = $1 AND q.secret_hash = pg_catalog.sha256(pg_catalog.convert_to($2, 'UTF8'))
    FOR UPDATE;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    UPDATE pgfence_permit_claims q SET secret_hash = NULL, granted = NULL, granted_fence = NULL WHERE q.sem = $1;
    -- An unlogged row, and at most a release (which commits without
    -- waiting for the flush too): no flush awaited.
    PERFORM pg_catalog.set_config('synchronous_commit', 'off', true);
    IF NOT $3 THEN
        RETURN NULL;
    END IF;
    IF c.granted IS NULL THEN
        RETURN NULL;
    END IF;
    -- SKIP LOCKED: a release of this very permit in flight ends it anyway.
    UPDATE pgfence_leases AS l SET expires_at = pg_catalog.now()
    WHERE l.name = c.granted AND l.fence = c.granted_fence AND l.secret_hash = c.secret_hash
      AND l.expires_at > pg_catalog.clock_timestamp()
      AND l.name IN (SELECT q.name FROM pgfence_leases q WHERE q.name = c.granted FOR NO KEY UPDATE SKIP LOCKED)
    RETURNING l.fence INTO tok;
    IF FOUND THEN
        PERFORM pgfence_notify_waiters(c.granted, tok);
    END IF;
    RETURN tok;
END;
$$;
COMMENT ON FUNCTION pgfence_unclaim_permit(sem text, claim_secret text, give_back boolean) IS
    'Clears the claim registered with claim_secret for semaphore sem; with give_back, releases the permit already granted to it.';

-- Releases permit pname held with token and secret, as pgfence_release
-- does when the release frees it (at_least_us has passed), and grants it
-- in the same row update to the claim of its semaphore's line head, with a
-- fresh token; notifies the grant, signed with the claim's grant key, and
-- returns true. Returns false, having changed nothing, when there is no
-- claim, when the claim's session ended (its alive_key can be taken), when
-- it is for another count than the recorded one, when a change of count or
-- an acquire of the slot is in flight, and when the lease is not held with
-- token and secret or is not freed yet: pgfence_release then releases it
-- as before. The claim's row is locked before the lease's, as
-- pgfence_claim_permit and pgfence_unclaim_permit lock them.
CREATE FUNCTION pgfence_hand_permit(pname text, token bigint, secret text, at_least_us bigint) RETURNS boolean
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

-- As in version 2, but a permit that a one-lease release frees goes to
-- the claim of its semaphore's line head when there is one
-- (pgfence_hand_permit), and the release's commit then waits for the
-- flush. A batch of several leases is released as before: its permits'
-- waiters are notified, and the head of a line takes its permit itself.
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
        -- A claim is looked for here first: most permit releases find none.
        IF pg_catalog.strpos($1[1], pg_catalog.chr(31)) > 0
           AND EXISTS (SELECT FROM pgfence_permit_claims q
                       WHERE q.sem = pg_catalog.split_part($1[1], pg_catalog.chr(31), 1)
                         AND q.secret_hash IS NOT NULL AND q.granted IS NULL)
           AND pgfence_hand_permit($1[1], $2[1], $3[1], $4[1]) THEN
            fence := $2[1];
            RETURN NEXT;
            RETURN;
        END IF;
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
    'Releases each lease of a batch still held with its token and secret; a permit released alone goes to the claim of its semaphore''s line head (pgfence_hand_permit), else waiters are notified (pgfence_notify_waiters).';

CREATE OR REPLACE FUNCTION pgfence_schema_version() RETURNS integer
    LANGUAGE sql IMMUTABLE
    SET search_path = pg_catalog, pg_temp
AS $$ SELECT 8 $$;

-- Pin the search_path of the functions above as the baseline pins its own;
-- take EXECUTE on the new ones from PUBLIC, and give the claims' to the
-- roles that may take permits (pgfence grant gives them).
DO $$
DECLARE
    s text := pg_catalog.quote_ident(pg_catalog.current_schema());
    f text;
    r record;
BEGIN
    FOREACH f IN ARRAY ARRAY['pgfence_claim_permit(text, integer, text, bigint, text, bytea, bigint, bigint, text)',
                             'pgfence_unclaim_permit(text, text, boolean)',
                             'pgfence_hand_permit(text, bigint, text, bigint)',
                             'pgfence_release(text[], bigint[], text[], bigint[])',
                             'pgfence_schema_version()']
    LOOP
        EXECUTE pg_catalog.format('ALTER FUNCTION %s.%s SET search_path = pg_catalog, %s, pg_temp', s, f, s);
    END LOOP;
    FOREACH f IN ARRAY ARRAY['pgfence_claim_permit(text, integer, text, bigint, text, bytea, bigint, bigint, text)',
                             'pgfence_unclaim_permit(text, text, boolean)',
                             'pgfence_hand_permit(text, bigint, text, bigint)']
    LOOP
        EXECUTE pg_catalog.format('REVOKE ALL ON FUNCTION %s.%s FROM PUBLIC', s, f);
    END LOOP;
    FOR r IN
        SELECT a.grantee::pg_catalog.regrole AS grantee
        FROM pg_catalog.pg_proc p, pg_catalog.aclexplode(p.proacl) a
        WHERE p.oid = pg_catalog.format('%s.pgfence_acquire_permit(text, integer, text, bigint, boolean)', s)::pg_catalog.regprocedure
          AND a.privilege_type = 'EXECUTE' AND a.grantee <> 0 AND a.grantee <> p.proowner
    LOOP
        EXECUTE pg_catalog.format('GRANT EXECUTE ON FUNCTION %s.pgfence_claim_permit(text, integer, text, bigint, text, bytea, bigint, bigint, text) TO %s',
            s, r.grantee);
        EXECUTE pg_catalog.format('GRANT EXECUTE ON FUNCTION %s.pgfence_unclaim_permit(text, text, boolean) TO %s', s, r.grantee);
    END LOOP;
END;
$$;
