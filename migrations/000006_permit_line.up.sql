-- pgfence version 6: a semaphore's waiters form one line across Lockers and
-- processes, and a permit's release notifies only when someone waits
-- (docs/semaphores.md, Fairness). Its pgfence_acquire_permit plans its
-- statements once (plan_cache_mode force_generic_plan, as pgfence_acquire
-- does): version 5's re-planned them at every call.
--
-- The line: a Locker whose caller waits for a permit of semaphore S queues,
-- on a session connection of its own, for the exclusive session advisory
-- lock on S's line key, hashtextextended(S || chr(31) || chr(31), 7378831)
-- (no lease, permit or semaphore key hashes that text: names hold no
-- control character). PostgreSQL grants such a lock to its waiters in the
-- order they asked. A caller that is not in the line takes the key shared
-- for its transaction, without waiting, and is refused (queued) when the
-- try fails: while one session holds the key, and while one waits for it,
-- since a request that conflicts with a waiting one is never granted ahead
-- of it. The session holding the key calls with in_line true and competes
-- only with holders' releases and expiries.

-- Takes one permit as version 5's pgfence_acquire_permit does, unless a
-- caller waits in the semaphore's line and in_line is false: then acquired
-- and busy are false, queued true and permits the count recorded. Version
-- 5's signature stays for callers of that version; it ignores the line.
CREATE FUNCTION pgfence_acquire_permit(sem text, n integer, new_owner text, ttl_us bigint, in_line boolean)
    RETURNS TABLE(acquired boolean, name text, owner text, fence bigint, acquired_at timestamptz, expires_at timestamptz,
                  db_now timestamptz, secret text, permits integer, busy boolean, queued boolean)
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
    SET plan_cache_mode = force_generic_plan
AS $$
#variable_conflict use_column
DECLARE
    cur   integer;
    sec   text;
    pname text;
    slot  integer;
    skip  boolean := false;
BEGIN
    PERFORM pgfence_check_us(ARRAY[$4], 1, 'a TTL');
    IF $2 IS NULL OR $2 < 1 OR $2 > 1024 THEN
        RAISE EXCEPTION 'pgfence: a semaphore has 1 to 1024 permits, not %', $2
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF $1 IS NULL OR $1 = '' OR pg_catalog.octet_length($1) > 507 OR pg_catalog.strpos($1, pg_catalog.chr(31)) > 0 THEN
        RAISE EXCEPTION 'pgfence: a semaphore name is 1 to 507 bytes without chr(31)'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    -- Acquires hold the semaphore's lock shared (in memory: no row lock,
    -- no WAL); a change of count holds it exclusive, which waits for
    -- acquires in flight, so the statements after it see them.
    SELECT s.permits INTO cur FROM pgfence_semaphores s WHERE s.name = $1;
    IF NOT FOUND THEN
        INSERT INTO pgfence_semaphores AS s (name, permits) VALUES ($1, $2) ON CONFLICT (name) DO NOTHING;
        SELECT s.permits INTO STRICT cur FROM pgfence_semaphores s WHERE s.name = $1;
    END IF;
    IF cur = $2 THEN
        PERFORM pg_catalog.pg_advisory_xact_lock_shared(pg_catalog.hashtextextended($1 || pg_catalog.chr(31), 7378831));
        SELECT s.permits INTO STRICT cur FROM pgfence_semaphores s WHERE s.name = $1;
    ELSE
        PERFORM pg_catalog.pg_advisory_xact_lock(pg_catalog.hashtextextended($1 || pg_catalog.chr(31), 7378831));
        SELECT s.permits INTO STRICT cur FROM pgfence_semaphores s WHERE s.name = $1;
        IF cur <> $2 AND NOT EXISTS (
            SELECT FROM pgfence_leases p
            WHERE p.name IN (SELECT $1 || pg_catalog.chr(31) || g.s FROM pg_catalog.generate_series(0, cur - 1) g(s))
              AND p.expires_at > pg_catalog.now()) THEN
            UPDATE pgfence_semaphores s SET permits = $2, updated_at = pg_catalog.now() WHERE s.name = $1;
            cur := $2;
        END IF;
    END IF;
    IF cur <> $2 THEN
        -- A permit is held under another count (or the count changed
        -- during the call).
        RETURN QUERY SELECT false, NULL::text, NULL::text, NULL::bigint, NULL::timestamptz, NULL::timestamptz,
            pg_catalog.now(), NULL::text, cur, false, false;
        RETURN;
    END IF;
    IF NOT $5 AND NOT pg_catalog.pg_try_advisory_xact_lock_shared(
            pg_catalog.hashtextextended($1 || pg_catalog.chr(31) || pg_catalog.chr(31), 7378831)) THEN
        -- Callers wait in the line: no taking a permit ahead of them.
        RETURN QUERY SELECT false, NULL::text, NULL::text, NULL::bigint, NULL::timestamptz, NULL::timestamptz,
            pg_catalog.now(), NULL::text, cur, false, true;
        RETURN;
    END IF;
    sec := pg_catalog.replace(pg_catalog.gen_random_uuid()::text || pg_catalog.gen_random_uuid()::text, '-', '');
    FOR slot IN
        SELECT g.s FROM pg_catalog.generate_series(0, cur - 1) g(s)
        LEFT JOIN pgfence_leases p ON p.name = $1 || pg_catalog.chr(31) || g.s
        WHERE p.name IS NULL OR p.expires_at <= pg_catalog.now()
        ORDER BY g.s
    LOOP
        pname := $1 || pg_catalog.chr(31) || slot;
        IF NOT pg_catalog.pg_try_advisory_xact_lock(pg_catalog.hashtextextended(pname, 7378831)) THEN
            skip := true;
            CONTINUE;
        END IF;
        RETURN QUERY
        UPDATE pgfence_leases AS l
        SET owner = $3,
            fence = pgfence_next_token(),
            acquired_at = pg_catalog.now(),
            expires_at = pg_catalog.now() + $4 * interval '1 microsecond',
            secret_hash = pg_catalog.sha256(pg_catalog.convert_to(sec, 'UTF8'))
        WHERE l.name = pname AND l.expires_at <= pg_catalog.now()
          AND l.name IN (SELECT q.name FROM pgfence_leases q
                         WHERE q.name = pname AND q.expires_at <= pg_catalog.now()
                         FOR NO KEY UPDATE SKIP LOCKED)
        RETURNING true, l.name, l.owner, l.fence, l.acquired_at, l.expires_at, pg_catalog.now(), sec, cur, false, false;
        IF FOUND THEN
            RETURN;
        END IF;
        IF NOT EXISTS (SELECT FROM pgfence_leases q WHERE q.name = pname) THEN
            RETURN QUERY
            INSERT INTO pgfence_leases AS l (name, owner, fence, acquired_at, expires_at, secret_hash)
            VALUES (pname, $3, pgfence_next_token(), pg_catalog.now(),
                    pg_catalog.now() + $4 * interval '1 microsecond',
                    pg_catalog.sha256(pg_catalog.convert_to(sec, 'UTF8')))
            ON CONFLICT (name) DO NOTHING
            RETURNING true, l.name, l.owner, l.fence, l.acquired_at, l.expires_at, pg_catalog.now(), sec, cur, false, false;
            IF FOUND THEN
                RETURN;
            END IF;
        END IF;
        skip := true;
    END LOOP;
    RETURN QUERY
    SELECT false, NULL::text, NULL::text, NULL::bigint, NULL::timestamptz,
           (SELECT pg_catalog.min(p.expires_at) FROM pgfence_leases p
            WHERE p.name IN (SELECT $1 || pg_catalog.chr(31) || g.s FROM pg_catalog.generate_series(0, cur - 1) g(s))
              AND p.expires_at > pg_catalog.now()),
           pg_catalog.now(), NULL::text, cur, skip, false;
END;
$$;
COMMENT ON FUNCTION pgfence_acquire_permit(sem text, n integer, new_owner text, ttl_us bigint, in_line boolean) IS
    'Takes one free or expired permit of semaphore sem of n permits, as version 5 did, unless in_line is false and callers wait in the semaphore''s line (queued true).';

-- A permit's release (or force release) wakes its semaphore's waiters only
-- when one registered for them, through pgfence_notify_waiters as for a
-- lease, instead of version 5's trigger, which notified every time: a
-- permit's name (S || chr(31) || slot) is notified under its semaphore's
-- waiters' name S || chr(31), numbered from pgfence_permit_wake_seq (drawn
-- only to notify), and the waiters' interest key is that name's. Lease
-- names hold no control character.
DROP TRIGGER pgfence_permit_released ON pgfence_leases;
DROP FUNCTION pgfence_permit_released();

CREATE OR REPLACE FUNCTION pgfence_notify_waiters(name text, token bigint) RETURNS boolean
    LANGUAGE plpgsql VOLATILE
    SET search_path = pg_catalog, pg_temp
    SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    h     bytea;
    waits text := $1;
    tok   bigint := $2;
BEGIN
    IF pg_catalog.strpos($1, pg_catalog.chr(31)) > 0 THEN
        waits := pg_catalog.split_part($1, pg_catalog.chr(31), 1) OPERATOR(pg_catalog.||) pg_catalog.chr(31);
    END IF;
    SELECT pg_catalog.sha256(n.key OPERATOR(pg_catalog.||) '\x01'::bytea OPERATOR(pg_catalog.||) pg_catalog.convert_to(waits, 'UTF8'))
    INTO STRICT h FROM pgfence_notify_key n;
    IF pg_catalog.pg_try_advisory_xact_lock(1885824620,
           (pg_catalog.get_byte(h, 0) OPERATOR(pg_catalog.<<) 24) OPERATOR(pg_catalog.|)
           (pg_catalog.get_byte(h, 1) OPERATOR(pg_catalog.<<) 16) OPERATOR(pg_catalog.|)
           (pg_catalog.get_byte(h, 2) OPERATOR(pg_catalog.<<) 8) OPERATOR(pg_catalog.|)
           pg_catalog.get_byte(h, 3)) THEN
        RETURN false;
    END IF;
    IF waits OPERATOR(pg_catalog.<>) $1 THEN
        tok := pg_catalog.nextval('pgfence_permit_wake_seq'::pg_catalog.regclass);
    END IF;
    PERFORM pg_catalog.pg_notify('pgfence_lease_released', pgfence_notify_payload(waits, tok));
    RETURN true;
END;
$$;
COMMENT ON FUNCTION pgfence_notify_waiters(name text, token bigint) IS
    'Notifies pgfence_lease_released (tag:token:mac) that lease name was released with token, only if a session holds the name''s interest key (a waiter); a permit''s release is notified to its semaphore''s waiters (S || chr(31)) with a number from pgfence_permit_wake_seq. Returns whether it notified.';

CREATE OR REPLACE FUNCTION pgfence_schema_version() RETURNS integer
    LANGUAGE sql IMMUTABLE
    SET search_path = pg_catalog, pg_temp
AS $$ SELECT 6 $$;

-- Pin the search_path of the functions (re)defined above as the baseline
-- pins its own; take EXECUTE on the new function from PUBLIC and give it to
-- the roles that may call version 5's (pgfence grant gives both), whose
-- statements are planned once from now on too.
DO $$
DECLARE
    s text := pg_catalog.quote_ident(pg_catalog.current_schema());
    f text;
    r record;
BEGIN
    FOREACH f IN ARRAY ARRAY['pgfence_acquire_permit(text, integer, text, bigint, boolean)',
                             'pgfence_notify_waiters(text, bigint)',
                             'pgfence_schema_version()']
    LOOP
        EXECUTE pg_catalog.format('ALTER FUNCTION %s.%s SET search_path = pg_catalog, %s, pg_temp', s, f, s);
    END LOOP;
    EXECUTE pg_catalog.format('REVOKE ALL ON FUNCTION %s.pgfence_acquire_permit(text, integer, text, bigint, boolean) FROM PUBLIC', s);
    EXECUTE pg_catalog.format('ALTER FUNCTION %s.pgfence_acquire_permit(text, integer, text, bigint) SET plan_cache_mode = force_generic_plan', s);
    FOR r IN
        SELECT a.grantee::pg_catalog.regrole AS grantee
        FROM pg_catalog.pg_proc p, pg_catalog.aclexplode(p.proacl) a
        WHERE p.oid = pg_catalog.format('%s.pgfence_acquire_permit(text, integer, text, bigint)', s)::pg_catalog.regprocedure
          AND a.privilege_type = 'EXECUTE' AND a.grantee <> 0 AND a.grantee <> p.proowner
    LOOP
        EXECUTE pg_catalog.format('GRANT EXECUTE ON FUNCTION %s.pgfence_acquire_permit(text, integer, text, bigint, boolean) TO %s',
            s, r.grantee);
    END LOOP;
END;
$$;
