-- pgfence version 7: pgfence_acquire_permit finds a semaphore's permit rows
-- through the primary key at any size of pgfence_leases.
--
-- Version 6 joined generate_series(0, n - 1) to pgfence_leases. The
-- function's plans are generic (planned once, plan_cache_mode
-- force_generic_plan), and a generic plan cannot know n: the planner
-- counted 1000 slots and, once the table's statistics said a few thousand
-- rows, chose to read the whole table into a hash on every acquire (a
-- sequential scan and a 32,768-bucket hash for one slot). Version 7 looks
-- each slot's row up on its own and reads the rows of all slots with
-- name = ANY (their names), as the library's Semaphores does; both use the
-- primary key whatever the statistics say. It also checks the TTL inline
-- instead of through pgfence_check_us, with the same error, and refuses a
-- caller not in the line while callers wait in it before reading the
-- semaphore's count and taking its lock, with one lookup of the count (a
-- caller asking for another count still learns that it differs).
--
-- Version 5's four-argument function, kept for callers of that version,
-- never looked at the line: it now returns the five-argument function's
-- answer as the head of the line (in_line true), without its queued column,
-- instead of a copy of version 5's body.

CREATE OR REPLACE FUNCTION pgfence_acquire_permit(sem text, n integer, new_owner text, ttl_us bigint, in_line boolean)
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
    lined boolean := false;
BEGIN
    IF $4 IS NULL OR $4 < 1 OR $4 > 604800000000 THEN
        RAISE EXCEPTION 'pgfence: a TTL must be between 1 microseconds and 7 days (604800000000 microseconds)'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF $2 IS NULL OR $2 < 1 OR $2 > 1024 THEN
        RAISE EXCEPTION 'pgfence: a semaphore has 1 to 1024 permits, not %', $2
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF $1 IS NULL OR $1 = '' OR pg_catalog.octet_length($1) > 507 OR pg_catalog.strpos($1, pg_catalog.chr(31)) > 0 THEN
        RAISE EXCEPTION 'pgfence: a semaphore name is 1 to 507 bytes without chr(31)'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    -- A caller not in the line while callers wait in it is refused
    -- (queued) at once, unless it asks for another count than the one
    -- recorded: the checks below answer that.
    IF NOT $5 THEN
        IF NOT pg_catalog.pg_try_advisory_xact_lock_shared(
                pg_catalog.hashtextextended($1 || pg_catalog.chr(31) || pg_catalog.chr(31), 7378831)) THEN
            SELECT s.permits INTO cur FROM pgfence_semaphores s WHERE s.name = $1;
            IF cur = $2 THEN
                RETURN QUERY SELECT false, NULL::text, NULL::text, NULL::bigint, NULL::timestamptz, NULL::timestamptz,
                    pg_catalog.now(), NULL::text, cur, false, true;
                RETURN;
            END IF;
            lined := true;
        END IF;
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
            WHERE p.name = ANY (ARRAY(SELECT $1 || pg_catalog.chr(31) || g.s FROM pg_catalog.generate_series(0, cur - 1) g(s)))
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
    IF lined THEN
        -- Callers wait in the line: no taking a permit ahead of them.
        RETURN QUERY SELECT false, NULL::text, NULL::text, NULL::bigint, NULL::timestamptz, NULL::timestamptz,
            pg_catalog.now(), NULL::text, cur, false, true;
        RETURN;
    END IF;
    sec := pg_catalog.replace(pg_catalog.gen_random_uuid()::text || pg_catalog.gen_random_uuid()::text, '-', '');
    -- Each slot's row is looked up on its own (an aggregate in a lateral
    -- subquery cannot be flattened into a join the planner could hash).
    FOR slot IN
        SELECT g.s FROM pg_catalog.generate_series(0, cur - 1) g(s)
        CROSS JOIN LATERAL (
            SELECT pg_catalog.count(*) AS live FROM pgfence_leases p
            WHERE p.name = $1 || pg_catalog.chr(31) || g.s AND p.expires_at > pg_catalog.now()) c
        WHERE c.live = 0
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
            WHERE p.name = ANY (ARRAY(SELECT $1 || pg_catalog.chr(31) || g.s FROM pg_catalog.generate_series(0, cur - 1) g(s)))
              AND p.expires_at > pg_catalog.now()),
           pg_catalog.now(), NULL::text, cur, skip, false;
END;
$$;
COMMENT ON FUNCTION pgfence_acquire_permit(sem text, n integer, new_owner text, ttl_us bigint, in_line boolean) IS
    'Takes one free or expired permit of semaphore sem of n permits, as version 5 did, unless in_line is false and callers wait in the semaphore''s line (queued true).';

CREATE OR REPLACE FUNCTION pgfence_acquire_permit(sem text, n integer, new_owner text, ttl_us bigint)
    RETURNS TABLE(acquired boolean, name text, owner text, fence bigint, acquired_at timestamptz, expires_at timestamptz,
                  db_now timestamptz, secret text, permits integer, busy boolean)
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
    SET plan_cache_mode = force_generic_plan
AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    SELECT a.acquired, a.name, a.owner, a.fence, a.acquired_at, a.expires_at, a.db_now, a.secret, a.permits, a.busy
    FROM pgfence_acquire_permit($1, $2, $3, $4, true) a;
END;
$$;
COMMENT ON FUNCTION pgfence_acquire_permit(sem text, n integer, new_owner text, ttl_us bigint) IS
    'Version 5''s call: takes one free or expired permit of semaphore sem of n permits as pgfence_acquire_permit(sem, n, new_owner, ttl_us, true) does, without its queued column.';

CREATE OR REPLACE FUNCTION pgfence_schema_version() RETURNS integer
    LANGUAGE sql IMMUTABLE
    SET search_path = pg_catalog, pg_temp
AS $$ SELECT 7 $$;

-- CREATE OR REPLACE keeps owners and grants but replaces the SET clauses:
-- pin the search_path of the functions above again, as version 6 did.
DO $$
DECLARE
    s text := pg_catalog.quote_ident(pg_catalog.current_schema());
    f text;
BEGIN
    FOREACH f IN ARRAY ARRAY['pgfence_acquire_permit(text, integer, text, bigint, boolean)',
                             'pgfence_acquire_permit(text, integer, text, bigint)',
                             'pgfence_schema_version()']
    LOOP
        EXECUTE pg_catalog.format('ALTER FUNCTION %s.%s SET search_path = pg_catalog, %s, pg_temp', s, f, s);
    END LOOP;
END;
$$;
