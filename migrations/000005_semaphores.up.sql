-- pgfence version 5: semaphores (N permits of a name, each a lease row with
-- its own token) and all-or-nothing sets of leases. Created, like the
-- baseline, in current_schema() of the migrating connection.
--
-- Permit k (0 <= k < N) of semaphore S is the lease row named
-- S || chr(31) || k. Lease names given to the library cannot contain
-- control characters, so no ordinary lease shares a permit's row; renewal,
-- release, pgfence_lease_held, prune and force release work on permits as
-- on any lease.

-- The permit count recorded for each semaphore name.
CREATE TABLE pgfence_semaphores (
    name       text        NOT NULL,
    permits    integer     NOT NULL,
    updated_at timestamptz NOT NULL DEFAULT pg_catalog.now(),
    CONSTRAINT pgfence_semaphores_pkey PRIMARY KEY (name),
    CONSTRAINT pgfence_semaphores_name_check CHECK (name <> '' AND pg_catalog.octet_length(name) <= 507
        AND pg_catalog.strpos(name, pg_catalog.chr(31)) = 0),
    CONSTRAINT pgfence_semaphores_permits_check CHECK (permits BETWEEN 1 AND 1024)
);
COMMENT ON TABLE pgfence_semaphores IS
    'pgfence semaphores: the number of permits of each semaphore name; permit k is the lease row name || chr(31) || k.';

-- Numbers the wake-up notifications of a semaphore's waiters, which
-- listeners drop unless newer than the last they acted on.
CREATE SEQUENCE pgfence_permit_wake_seq CACHE 1 NO CYCLE;
REVOKE ALL ON TABLE pgfence_semaphores FROM PUBLIC;
REVOKE ALL ON SEQUENCE pgfence_permit_wake_seq FROM PUBLIC;

-- Takes one free or expired permit of semaphore sem of n permits (1 to
-- 1024), with a fresh token and secret, as pgfence_acquire takes a lease:
-- each slot is claimed with the same transaction-scoped try-lock, expired
-- rows are locked SKIP LOCKED, a token is drawn only for a slot taken. The
-- count n is recorded at first use; a call giving another n while a permit
-- is held is refused (permits then reports the recorded count); with none
-- held, the new n replaces it. Not acquired: expires_at is the earliest
-- expiry of a held permit, busy that a slot was claimed by another
-- transaction.
CREATE FUNCTION pgfence_acquire_permit(sem text, n integer, new_owner text, ttl_us bigint)
    RETURNS TABLE(acquired boolean, name text, owner text, fence bigint, acquired_at timestamptz, expires_at timestamptz,
                  db_now timestamptz, secret text, permits integer, busy boolean)
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
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
            pg_catalog.now(), NULL::text, cur, false;
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
        RETURNING true, l.name, l.owner, l.fence, l.acquired_at, l.expires_at, pg_catalog.now(), sec, cur, false;
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
            RETURNING true, l.name, l.owner, l.fence, l.acquired_at, l.expires_at, pg_catalog.now(), sec, cur, false;
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
           pg_catalog.now(), NULL::text, cur, skip;
END;
$$;
COMMENT ON FUNCTION pgfence_acquire_permit(sem text, n integer, new_owner text, ttl_us bigint) IS
    'Takes one free or expired permit (lease row sem || chr(31) || slot) of semaphore sem of n permits with a fresh token and secret; refuses (permits = the recorded count) another n while a permit is held.';

-- All or nothing: pgfence_acquire's batch (try-locks and SKIP LOCKED, rows
-- taken in name order: it never waits, so two sets cannot deadlock) in a
-- subtransaction that is rolled back unless every name was acquired. The
-- tokens drawn then are never issued. Returns pgfence_acquire's rows; on a
-- refusal none has acquired true, and a name that was free has no owner
-- and expires_at = db_now.
CREATE FUNCTION pgfence_acquire_set(names text[], new_owner text, ttl_us bigint[])
    RETURNS TABLE(acquired boolean, name text, owner text, fence bigint, acquired_at timestamptz, expires_at timestamptz, db_now timestamptz, secret text)
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    got  record;
    res  jsonb := '[]';
    all_ok boolean := true;
BEGIN
    IF pg_catalog.cardinality($1) IS NULL OR pg_catalog.cardinality($1) < 1 OR pg_catalog.cardinality($1) > 1024 THEN
        RAISE EXCEPTION 'pgfence: a set has 1 to 1024 names'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF (SELECT pg_catalog.count(DISTINCT u.n) FROM pg_catalog.unnest($1) u(n)) <> pg_catalog.cardinality($1) THEN
        RAISE EXCEPTION 'pgfence: a set names each lease once'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    BEGIN
        FOR got IN SELECT * FROM pgfence_acquire($1, $2, $3) LOOP
            res := res || pg_catalog.jsonb_build_array(pg_catalog.to_jsonb(got));
            all_ok := all_ok AND got.acquired;
        END LOOP;
        IF NOT all_ok OR pg_catalog.jsonb_array_length(res) <> pg_catalog.cardinality($1) THEN
            RAISE EXCEPTION USING ERRCODE = 'PF900', MESSAGE = 'pgfence: set refused';
        END IF;
    EXCEPTION WHEN SQLSTATE 'PF900' THEN
        RETURN QUERY
        SELECT false, r.name, CASE WHEN r.acquired THEN NULL ELSE r.owner END,
               CASE WHEN r.acquired THEN NULL ELSE r.fence END,
               CASE WHEN r.acquired THEN NULL ELSE r.acquired_at END,
               CASE WHEN r.acquired THEN r.db_now ELSE r.expires_at END,
               r.db_now, NULL::text
        FROM pg_catalog.jsonb_to_recordset(res) AS r(acquired boolean, name text, owner text, fence bigint,
            acquired_at timestamptz, expires_at timestamptz, db_now timestamptz, secret text);
        RETURN;
    END;
    RETURN QUERY
    SELECT r.acquired, r.name, r.owner, r.fence, r.acquired_at, r.expires_at, r.db_now, r.secret
    FROM pg_catalog.jsonb_to_recordset(res) AS r(acquired boolean, name text, owner text, fence bigint,
        acquired_at timestamptz, expires_at timestamptz, db_now timestamptz, secret text);
END;
$$;
COMMENT ON FUNCTION pgfence_acquire_set(names text[], new_owner text, ttl_us bigint[]) IS
    'Takes every lease of a set (distinct names, at most 1024) or none: pgfence_acquire''s rows when all were acquired, else the same rows with acquired false and no new lease.';

-- Wakes a semaphore's waiters when one of its permits is released (or
-- force-released): a notification under the tag of sem || chr(31), which
-- no lease name equals, numbered from pgfence_permit_wake_seq.
CREATE FUNCTION pgfence_permit_released() RETURNS trigger
    LANGUAGE plpgsql
    SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM pg_catalog.pg_notify('pgfence_lease_released', pgfence_notify_payload(
        pg_catalog.split_part(NEW.name, pg_catalog.chr(31), 1) || pg_catalog.chr(31),
        pg_catalog.nextval('pgfence_permit_wake_seq'::pg_catalog.regclass)));
    RETURN NULL;
END;
$$;
COMMENT ON FUNCTION pgfence_permit_released() IS
    'Trigger on pgfence_leases: a permit row whose expiry moved earlier (released) notifies its semaphore''s waiters.';

CREATE TRIGGER pgfence_permit_released AFTER UPDATE ON pgfence_leases
    FOR EACH ROW
    WHEN (NEW.expires_at < OLD.expires_at AND pg_catalog.strpos(NEW.name, pg_catalog.chr(31)) > 0)
    EXECUTE FUNCTION pgfence_permit_released();

CREATE OR REPLACE FUNCTION pgfence_schema_version() RETURNS integer
    LANGUAGE sql IMMUTABLE
    SET search_path = pg_catalog, pg_temp
AS $$ SELECT 5 $$;

-- Pin the new functions' search_path as the baseline pins its own, and take
-- EXECUTE from PUBLIC.
DO $$
DECLARE
    s text := pg_catalog.quote_ident(pg_catalog.current_schema());
    f pg_catalog.regprocedure;
BEGIN
    FOR f IN
        SELECT p.oid FROM pg_catalog.pg_proc p
        WHERE p.pronamespace = s::pg_catalog.regnamespace
          AND p.proname IN ('pgfence_acquire_permit', 'pgfence_acquire_set', 'pgfence_permit_released', 'pgfence_schema_version')
          AND pg_catalog.pg_get_userbyid(p.proowner) = current_user
    LOOP
        EXECUTE pg_catalog.format('ALTER FUNCTION %s SET search_path = pg_catalog, %s, pg_temp', f, s);
        EXECUTE pg_catalog.format('REVOKE ALL ON FUNCTION %s FROM PUBLIC', f);
    END LOOP;
END;
$$;
