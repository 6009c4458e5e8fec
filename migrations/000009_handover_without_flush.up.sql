-- pgfence version 9: a permit's hand-over commits without waiting for the
-- WAL flush (docs/semaphores.md, Hand-over without a flush).
--
-- In version 8 the release that grants a permit to the claim of its line's
-- head waited for the flush before the head saw the grant: a grant lost in
-- a crash would otherwise let its token be issued again (model P2), and
-- let the slot go to another client while the head still believed it held
-- it (model P4). Both are now paid before the release:
--
-- * The token. A claim reserves a block of tokens when it registers
--   (reserve_next up to reserve_end): one pgfence_next_token value, which
--   covers 1024 consecutive tokens, drawn and made durable by the claim's
--   own commit, as every draw is. A hand-over grants the next token of the
--   block when it is above the slot's token, and a crash cannot issue it
--   again: the sequence resumes after the block. The block stays with the
--   semaphore's claim row: the claim that drew it keeps it, and the next
--   claims too while no other token is drawn (so a grant's token stays
--   above every token returned before its acquire began, whatever the
--   name): a line's heads draw (and wait for a flush) once per 1024
--   hand-overs where nothing else draws tokens, and at most once per head
--   where other names do.
-- * The expiry. The hand-over moves the lease, not its expiry: the new
--   holder's lease ends when the old holder's did (or earlier, at its own
--   TTL). Whatever a crash rolls back to, the row holds the slot for its
--   owner until at least that time, and that owner has released it, so no
--   other client is granted the slot while the new holder believes it
--   holds it; the holder's first renewal, which waits for the flush, makes
--   the hand-over durable. A hand-over whose old lease has less than half
--   the claim's TTL left grants a full TTL and waits for the flush, as in
--   version 8; so does one without a usable block.

ALTER TABLE pgfence_permit_claims ADD COLUMN reserve_next bigint, ADD COLUMN reserve_end bigint, ADD COLUMN reserved_by bytea;
COMMENT ON COLUMN pgfence_permit_claims.reserve_next IS
    'pgfence: the next token of the block the semaphore''s claims reserved (durable when reserved); a hand-over grants it when it is above the slot''s token.';
COMMENT ON COLUMN pgfence_permit_claims.reserve_end IS
    'pgfence: the end (exclusive) of the reserved block of tokens.';
COMMENT ON COLUMN pgfence_permit_claims.reserved_by IS
    'pgfence: the secret hash of the claim that drew the block (which keeps it whatever is drawn after).';

-- As in version 8, and a claim it registers holds a durable block of tokens
-- (reserve_next, reserve_end): a new one is drawn when there is none, when
-- it is used up, when a slot of the semaphore holds a token not below its
-- next one, or when another claim drew it and any token was drawn after
-- it; the call's commit then waits for the flush when the draw needs it
-- (pgfence_next_token).
CREATE OR REPLACE FUNCTION pgfence_claim_permit(sem text, n integer, new_owner text, ttl_us bigint, claim_secret text,
                                                grant_key bytea, version bigint, alive_key bigint, grant_channel text)
    RETURNS TABLE(acquired boolean, name text, owner text, fence bigint, acquired_at timestamptz, expires_at timestamptz,
                  db_now timestamptz, secret text, permits integer, busy boolean, claimed boolean)
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
    SET plan_cache_mode = force_generic_plan
AS $$
#variable_conflict use_column
DECLARE
    reg       boolean := false;
    drew      boolean := false;
    others    boolean;
    top       bigint;
    r         record;
    h         bytea;
    g_name    text;
    g_fence   bigint;
    g_hash    bytea;
    g_permits integer;
    rn        bigint;
    re        bigint;
    rby       bytea;
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
        -- The grant was committed by the release (durable, or carrying an
        -- expiry the old holder's durable lease covers).
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
    SELECT pg_catalog.bool_or(p.expires_at > pg_catalog.clock_timestamp() AND p.owner <> $3), pg_catalog.max(p.fence)
    INTO others, top
    FROM pgfence_leases p
    WHERE p.name = ANY (ARRAY(SELECT $1 || pg_catalog.chr(31) || g.s FROM pg_catalog.generate_series(0, $2 - 1) g(s)));
    reg := NOT r.acquired AND r.permits = $2 AND coalesce(others, false);
    IF NOT reg THEN
        IF g_hash IS NOT NULL THEN
            UPDATE pgfence_permit_claims q SET secret_hash = NULL, granted = NULL, granted_fence = NULL WHERE q.sem = $1;
        END IF;
    ELSE
        SELECT q.reserve_next, q.reserve_end, q.reserved_by INTO rn, re, rby FROM pgfence_permit_claims q WHERE q.sem = $1;
        -- Every token a grant returned before this claim's acquire began (of
        -- any name) must be below the block's next one, as below a token
        -- drawn now: so it is when this claim drew the block (after its
        -- acquire began), and when no token has been drawn after it.
        IF rn IS NULL OR re IS NULL OR rn >= re OR rn <= coalesce(top, 0)
           OR (rby IS DISTINCT FROM h AND re - 1024 <> (SELECT q.last_value FROM pgfence_leases_fence_seq q)) THEN
            -- One value covers the 1024 tokens from it (pgfence_next_tokens
            -- hands them out so too); the draw makes this call's commit
            -- wait for the flush when the WAL that covers it is not on disk.
            rn := pgfence_next_token();
            re := rn + 1024;
            rby := h;
            drew := true;
        END IF;
        -- The tag is the semaphore's waiters' (pgfence_notify_payload's first
        -- field), so that the Locker finds the claim by it.
        INSERT INTO pgfence_permit_claims AS q (sem, permits, owner, ttl_us, secret_hash, grant_key, tag, channel, version,
                                                alive_key, reserve_next, reserve_end, reserved_by)
        VALUES ($1, $2, $3, $4, h, $6, pg_catalog.split_part(pgfence_notify_payload($1 || pg_catalog.chr(31), 0), ':', 1),
                $9, $7, $8, rn, re, rby)
        ON CONFLICT (sem) DO UPDATE
        SET permits = EXCLUDED.permits, owner = EXCLUDED.owner, ttl_us = EXCLUDED.ttl_us,
            secret_hash = EXCLUDED.secret_hash, grant_key = EXCLUDED.grant_key, tag = EXCLUDED.tag, channel = EXCLUDED.channel,
            version = EXCLUDED.version, alive_key = EXCLUDED.alive_key, claimed_at = pg_catalog.now(),
            granted = NULL, granted_fence = NULL, reserve_next = EXCLUDED.reserve_next, reserve_end = EXCLUDED.reserve_end,
            reserved_by = EXCLUDED.reserved_by;
    END IF;
    IF NOT r.acquired AND NOT drew THEN
        -- Nothing was granted or drawn: what this call wrote is the claim (an
        -- unlogged row) and at most the semaphore's count while no permit
        -- is held, which any later grant's flush covers. Its commit need
        -- not wait for a flush (reading may have pruned pages: WAL).
        PERFORM pg_catalog.set_config('synchronous_commit', 'off', true);
    END IF;
    RETURN QUERY SELECT r.acquired, r.name, r.owner, r.fence, r.acquired_at, r.expires_at, r.db_now, r.secret,
        r.permits, r.busy, reg;
END;
$$;

-- As in version 8, but when the claim's block has a token above the slot's
-- and the old lease has at least half the claim's TTL left, the grant takes
-- that token and the old lease's expiry (capped at the claim's TTL), and
-- the release's commit does not wait for the flush (fast true). Otherwise
-- the grant draws a token and a full TTL, and its commit waits.
CREATE OR REPLACE FUNCTION pgfence_hand_permit(pname text, token bigint, secret text, at_least_us bigint) RETURNS boolean
    LANGUAGE plpgsql VOLATILE
    SET search_path = pg_catalog, pg_temp
    SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    s     text := pg_catalog.split_part($1, pg_catalog.chr(31), 1);
    slot  integer := pg_catalog.split_part($1, pg_catalog.chr(31), 2)::integer;
    c     record;
    t     timestamptz;
    held  timestamptz;
    fast  boolean;
    tok   bigint;
    exp   timestamptz;
    msg   text;
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
    SELECT l.expires_at INTO held FROM pgfence_leases AS l
    WHERE l.name = $1 AND l.fence = $2 AND l.secret_hash = pg_catalog.sha256(pg_catalog.convert_to($3, 'UTF8'))
      AND l.acquired_at + $4 * interval '1 microsecond' <= pg_catalog.now()
    FOR NO KEY UPDATE;
    -- The clock is read once the row is locked: the lease is still held.
    t := pg_catalog.clock_timestamp();
    IF NOT FOUND OR held <= t THEN
        RETURN false;
    END IF;
    fast := coalesce(c.reserve_next < c.reserve_end AND c.reserve_next > $2
                     AND held - t >= (c.ttl_us / 2) * interval '1 microsecond', false);
    IF fast THEN
        tok := c.reserve_next;
        exp := LEAST(held, t + c.ttl_us * interval '1 microsecond');
    ELSE
        tok := pgfence_next_token();
        exp := t + c.ttl_us * interval '1 microsecond';
    END IF;
    UPDATE pgfence_leases AS l
    SET owner = c.owner, fence = tok, acquired_at = t, expires_at = exp, secret_hash = c.secret_hash
    WHERE l.name = $1;
    UPDATE pgfence_permit_claims q
    SET granted = $1, granted_fence = tok,
        reserve_next = CASE WHEN fast THEN q.reserve_next + 1 ELSE q.reserve_next END
    WHERE q.sem = s;
    IF fast THEN
        -- The token's block was made durable by the claim's commit, and the
        -- old holder's lease covers the new expiry: nothing here needs the
        -- flush before the grant is seen.
        PERFORM pg_catalog.set_config('synchronous_commit', 'off', true);
    END IF;
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
    'Releases permit pname held with token and secret and grants it, in the same update, to the claim of its semaphore''s line head while that claim''s session lives; with a token of the claim''s durable block and the old lease''s expiry it commits without waiting for the flush. False, with nothing changed, otherwise.';

CREATE OR REPLACE FUNCTION pgfence_schema_version() RETURNS integer
    LANGUAGE sql IMMUTABLE
    SET search_path = pg_catalog, pg_temp
AS $$ SELECT 9 $$;

-- Pin the search_path of the functions replaced above, as the baseline pins
-- its own (CREATE OR REPLACE keeps their privileges).
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
