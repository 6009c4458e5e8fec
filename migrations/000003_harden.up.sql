-- 000003 hardens the install and completes it with the functions that own
-- every write to pgfence_leases.
--
-- Like every pgfence migration it installs into current_schema() of the
-- migrating connection: migrations.Up runs it with search_path set to exactly
-- the chosen schema; with the migrate CLI, pass search_path=<schema> in the
-- database URL. Everything below is therefore written unqualified, and every
-- function is created with search_path pinned to pg_catalog, pg_temp, then
-- re-pinned to pg_catalog, <schema>, pg_temp (at the end of this file, where
-- the schema is known and the result is checked), so that inside it built-ins resolve to pg_catalog first,
-- pgfence's own objects to <schema>, and the caller's temporary schema only
-- last (functions and operators are never looked up there). No role that can
-- create objects in a schema on the caller's search_path can redirect a call.
--
-- Roles: the role that runs the migrations owns every object, and the
-- SECURITY DEFINER functions run as that role. Application roles get only
-- what migrations.Grant gives them: SELECT on pgfence_leases and EXECUTE on
-- the functions, never a direct write. Use a dedicated owner role that is not
-- a superuser.

-- A second install in the same database would draw tokens from a second
-- sequence: two holders of one lock name could then present tokens from
-- different sequences, and fencing would compare unrelated numbers. Refuse.
-- Temporary tables (pg_temp_N) are ignored: any role may create one.
DO $$
DECLARE
    here  text := pg_catalog.current_schema();
    other text;
BEGIN
    IF here IS NULL THEN
        RAISE EXCEPTION 'pgfence: no schema to install into: no schema on the search_path exists'
            USING ERRCODE = 'invalid_schema_name';
    END IF;
    SELECT pg_catalog.string_agg(pg_catalog.quote_ident(n.nspname), ', ' ORDER BY n.nspname) INTO other
    FROM pg_catalog.pg_class c
    JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
    WHERE c.relname = 'pgfence_leases' AND c.relkind IN ('r', 'p')
      AND n.nspname <> here AND n.nspname !~ '^pg_(toast_)?temp_';
    IF other IS NOT NULL THEN
        RAISE EXCEPTION 'pgfence: already installed in schema % of this database; a second install in schema % would split the token space',
                other, pg_catalog.quote_ident(here)
            USING ERRCODE = 'duplicate_object',
                  HINT = 'Migrate the existing install instead: search_path=' || other || '.';
    END IF;
END;
$$;

-- Tokens must come one by one, in order, and never wrap: a cached range
-- would be lost in a crash (harmless) but would also let tokens be issued out
-- of order across sessions; a CYCLE sequence would repeat them.
-- pgfence_next_token() refuses to draw from a sequence set otherwise.
ALTER SEQUENCE pgfence_leases_fence_seq INCREMENT 1 CACHE 1 NO CYCLE;

REVOKE ALL ON TABLE pgfence_leases FROM PUBLIC;
REVOKE ALL ON SEQUENCE pgfence_leases_fence_seq FROM PUBLIC;

-- pgfence_next_token draws a fencing token that is durable before the caller
-- sees it. A transaction that only calls nextval() gets no transaction id and
-- so commits without waiting for its WAL to be flushed; after a crash the
-- sequence could then hand out the same value again. Assigning a transaction
-- id and raising synchronous_commit to on for the rest of the calling
-- transaction makes its commit wait for the flush (and, where configured, for
-- synchronous standbys). It only ever raises the setting: off, local and
-- remote_write become on; on and remote_apply are left alone.
--
-- SECURITY DEFINER: callers need no privilege on the sequence, so no role but
-- the owner can setval, alter or draw from it outside this function.
CREATE OR REPLACE FUNCTION pgfence_next_token() RETURNS bigint
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp -- the DO block below adds the install schema
AS $$
BEGIN
    IF pg_catalog.current_setting('synchronous_commit') NOT IN ('on', 'remote_apply') THEN
        PERFORM pg_catalog.set_config('synchronous_commit', 'on', true);
    END IF;
    PERFORM pg_catalog.pg_current_xact_id();
    IF NOT EXISTS (
        SELECT FROM pg_catalog.pg_sequence s
        WHERE s.seqrelid = 'pgfence_leases_fence_seq'::pg_catalog.regclass
          AND s.seqincrement = 1 AND s.seqcache = 1 AND NOT s.seqcycle
    ) THEN
        RAISE EXCEPTION 'pgfence: sequence pgfence_leases_fence_seq must be INCREMENT 1 CACHE 1 NO CYCLE'
            USING ERRCODE = 'PF002',
                  HINT = 'As its owner: ALTER SEQUENCE pgfence_leases_fence_seq INCREMENT 1 CACHE 1 NO CYCLE.';
    END IF;
    RETURN pg_catalog.nextval('pgfence_leases_fence_seq'::pg_catalog.regclass);
END;
$$;

COMMENT ON FUNCTION pgfence_next_token() IS
    'Draws a fencing token from pgfence_leases_fence_seq (which must be INCREMENT 1 CACHE 1 NO CYCLE, else PF002) and makes the calling transaction commit durably.';

-- pgfence_schema_version reports the version of the installed migrations.
-- Lockers check it when they start; each later migration replaces it with
-- its own number.
CREATE FUNCTION pgfence_schema_version() RETURNS integer
    LANGUAGE sql IMMUTABLE
    SET search_path = pg_catalog, pg_temp -- the DO block below adds the install schema
AS $$ SELECT 3 $$;

COMMENT ON FUNCTION pgfence_schema_version() IS
    'Version of the pgfence migrations installed in this schema.';

-- pgfence_acquire takes a batch of leases in one statement: it inserts each
-- missing row and takes over each row whose lease has expired (expires_at <=
-- now(), database clock), drawing a fresh token under the row lock. Rows are
-- inserted or locked in name order, so two batches over the same names cannot
-- deadlock with each other. For each name it returns one row: the new lease
-- (acquired true), or the current holder (false); no row when the holder
-- committed after this statement's snapshot. Names must be distinct: ON
-- CONFLICT cannot affect a row twice in one statement.
--
-- Tokens are drawn by pgfence_next_token() only for names that have no row or
-- whose row is free in the statement's snapshot, so that a failed attempt on a
-- held lease draws no token. A name absent from the snapshot draws its token
-- before inserting, which is only used when no row exists; on conflict the
-- token is drawn again under the row lock.
--
-- $1 names, $2 owner, $3 TTLs in microseconds (parallel arrays). The owner
-- parameter is called new_owner only because PL/pgSQL refuses an input and a
-- result column of the same name.
CREATE FUNCTION pgfence_acquire(names text[], new_owner text, ttl_us bigint[])
    RETURNS TABLE(acquired boolean, name text, owner text, fence bigint,
                  acquired_at timestamptz, expires_at timestamptz, db_now timestamptz)
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp -- the DO block below adds the install schema
AS $$
#variable_conflict use_column
BEGIN
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
$$;

COMMENT ON FUNCTION pgfence_acquire(text[], text, bigint[]) IS
    'Takes each free or expired lease of a batch with a fresh token; returns one row per name: the new lease, or the current holder.';

-- pgfence_release gives a batch of leases up: owner-checked, only rows with
-- the name, owner and token that are still held, expired in place (never
-- deleted), and a notification on channel pgfence_lease_released (payload:
-- the name; the channel is per database, whatever the schema) for each one,
-- delivered at commit: a row freed at once can be taken now, and a row kept
-- held by at_least now expires at acquired_at + at_least, earlier than a
-- waiter last saw, so the waiter retries and learns the new expiry. It
-- returns the token of each lease it released. It locks those rows.
--
-- When every released row becomes free at once (no at_least keeps one held),
-- the transaction commits with synchronous_commit off: it does not wait for
-- its WAL to be flushed. The notifications make each such commit take a
-- database-wide lock until it completes, so waiting for the flush there would
-- serialise every release on the server behind the disk. Losing such a
-- release in a crash only keeps the lease held until its TTL ends; it can
-- never make a lease look free early, and whoever takes the freed row commits
-- durably, which flushes the release's WAL first. A release that keeps a row
-- held (at_least) commits durably.
--
-- A row counts as held while expires_at > clock_timestamp(), not now():
-- now() is the start of the calling transaction, and a caller that kept a
-- transaction open past the lease's expiry must not keep it alive with
-- at_least (a single-statement release sees no difference).
--
-- The second column returns the durability setting chosen ('off', or NULL
-- when left alone): it must be selected, or the planner removes the join to
-- the subquery that sets it.
--
-- $1 names, $2 tokens, $3 at_least in microseconds (parallel arrays), $4
-- owner.
CREATE FUNCTION pgfence_release(names text[], tokens bigint[], at_least_us bigint[], owner text)
    RETURNS TABLE(fence bigint, durability text)
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp -- the DO block below adds the install schema
AS $$
#variable_conflict use_column
BEGIN
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
$$;

COMMENT ON FUNCTION pgfence_release(text[], bigint[], bigint[], text) IS
    'Releases each lease of a batch still held with its owner and token; notifies pgfence_lease_released for each one (freed, or expiring at its at_least end).';

-- pgfence_renew extends a batch of leases. A lease is renewed only while it
-- is still held by the same token: fence matches and expires_at is still in
-- the future, so an expired lease is never resurrected. clock_timestamp()
-- rather than now() is used in that check because the statement may wait for
-- a row lock (for example behind a release or a takeover) and must judge
-- expiry when it gets the row, not when it started. expires_at never moves
-- backwards. It locks the batch's rows. It returns the token of each lease it
-- renewed.
--
-- $1 names, $2 tokens, $3 TTLs in microseconds (parallel arrays).
CREATE FUNCTION pgfence_renew(names text[], tokens bigint[], ttl_us bigint[])
    RETURNS SETOF bigint
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp -- the DO block below adds the install schema
AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    UPDATE pgfence_leases AS l
    SET expires_at = greatest(l.expires_at, pg_catalog.now() + r.ttl_us * interval '1 microsecond')
    FROM ROWS FROM (pg_catalog.unnest($1), pg_catalog.unnest($2), pg_catalog.unnest($3)) AS r(name, fence, ttl_us)
    WHERE l.name = r.name AND l.fence = r.fence AND l.expires_at > pg_catalog.clock_timestamp()
    RETURNING l.fence;
END;
$$;

COMMENT ON FUNCTION pgfence_renew(text[], bigint[], bigint[]) IS
    'Extends each lease of a batch still held with its token; never revives an expired lease.';

-- pgfence_lease_held reports whether the lease is held with the token, on
-- the database clock, and locks its row FOR SHARE until the calling
-- transaction ends: a takeover or release (an UPDATE of the row) in flight
-- makes the call wait and then see the new row, and one that starts later
-- waits for the caller's transaction. clock_timestamp(), not now(): inside a
-- long transaction now() is the transaction's start, which would let an
-- expired lease pass.
CREATE FUNCTION pgfence_lease_held(name text, token bigint) RETURNS boolean
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp -- the DO block below adds the install schema
AS $$
#variable_conflict use_column
BEGIN
    PERFORM 1 FROM pgfence_leases l
    WHERE l.name = $1 AND l.fence = $2 AND l.expires_at > pg_catalog.clock_timestamp()
    FOR SHARE;
    RETURN FOUND;
END;
$$;

COMMENT ON FUNCTION pgfence_lease_held(text, bigint) IS
    'True iff the lease is held with the token (database clock); locks its row FOR SHARE for the calling transaction.';

-- pgfence_prune_scan reads one page of the table in name order: at most $2
-- rows with names after $1 (through the primary key). It returns the page's
-- last name and its number of rows; the names and tokens of the page's rows
-- that expired more than $3 before the database's now(); and, only when there
-- are such rows, the virtual transaction ids of the other transactions that
-- hold a write lock (RowExclusiveLock) on pgfence_leases at this moment.
-- Every statement that puts a token into the table (an acquire, a
-- force-release) holds that lock from before it draws the token until it
-- commits. It takes no row locks; reading pg_locks briefly takes the lock
-- manager's internal locks. A negative $3 is refused (invalid_parameter_value).
CREATE FUNCTION pgfence_prune_scan(after text, page integer, older_than interval)
    RETURNS TABLE(last_name text, page_rows bigint, names text[], tokens bigint[], vxids text[])
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp -- the DO block below adds the install schema
AS $$
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
$$;

COMMENT ON FUNCTION pgfence_prune_scan(text, integer, interval) IS
    'Prune: reads one page of pgfence_leases and lists its long-expired rows and the transactions writing the table.';

-- pgfence_prune_delete deletes the rows named $1 whose token is still the
-- one in $2 (parallel arrays) and which still expired more than $3 before the
-- database's now(), and returns how many it deleted. It locks them FOR UPDATE
-- first and skips every row another transaction has locked (a lease-checked
-- write's FOR SHARE, a takeover in flight): such a row is left for a later
-- prune, which never waits behind a row lock. The candidates are collected
-- first (ARRAY), so the DELETE itself finds them through the primary key.
-- A negative $3 is refused (invalid_parameter_value): it would reach rows
-- that are still held, and delete a lease from under its holder.
CREATE FUNCTION pgfence_prune_delete(names text[], tokens bigint[], older_than interval)
    RETURNS bigint
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp -- the DO block below adds the install schema
AS $$
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
$$;

COMMENT ON FUNCTION pgfence_prune_delete(text[], bigint[], interval) IS
    'Prune: deletes the listed long-expired rows whose token is unchanged, skipping rows another transaction has locked.';

-- pgfence_forced_releases records every force-release: who ended whose lease,
-- from where, and why. Rows are only ever appended, by
-- pgfence_force_release; acquiring the lease again leaves them alone.
CREATE TABLE pgfence_forced_releases (
    id          bigserial   NOT NULL,
    name        text        NOT NULL,
    old_owner   text        NOT NULL,
    old_token   bigint      NOT NULL,
    new_token   bigint      NOT NULL,
    was_held    boolean     NOT NULL,
    reason      text,
    released_by name        NOT NULL DEFAULT session_user,
    client_addr inet                 DEFAULT pg_catalog.inet_client_addr(),
    released_at timestamptz NOT NULL DEFAULT pg_catalog.now(),
    CONSTRAINT pgfence_forced_releases_pkey PRIMARY KEY (id)
);

REVOKE ALL ON TABLE pgfence_forced_releases FROM PUBLIC;
REVOKE ALL ON SEQUENCE pgfence_forced_releases_id_seq FROM PUBLIC;

COMMENT ON TABLE pgfence_forced_releases IS
    'pgfence audit log: one row per forced release (pgfence_force_release), never removed by pgfence.';

-- pgfence_force_release ends a lease whoever holds it: it locks the row (FOR
-- UPDATE) to read its previous holder, gives it a fresh token (so the old
-- holder is fenced out) and expires it now, with owner
-- 'released-by:<session_user>'. It appends a row to pgfence_forced_releases,
-- logs a line (RAISE LOG) saying who released what, and notifies waiters on
-- pgfence_lease_released as a release does. pgfence_next_token() makes the
-- transaction commit durably, so the new token is never reissued after a
-- crash. No row is returned, and nothing is recorded, when there is no lease
-- of that name.
CREATE FUNCTION pgfence_force_release(name text, reason text)
    RETURNS TABLE(old_owner text, old_token bigint, was_held boolean, token bigint)
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp -- the DO block below adds the install schema
AS $$
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
$$;

COMMENT ON FUNCTION pgfence_force_release(text, text) IS
    'Ends a lease whoever holds it (fresh token, expired now), records it in pgfence_forced_releases and notifies waiters.';

-- No role but the owner may call pgfence's functions until it is granted
-- (migrations.Grant, pgfence grant).
REVOKE ALL ON FUNCTION
    pgfence_next_token(),
    pgfence_schema_version(),
    pgfence_acquire(text[], text, bigint[]),
    pgfence_release(text[], bigint[], bigint[], text),
    pgfence_renew(text[], bigint[], bigint[]),
    pgfence_lease_held(text, bigint),
    pgfence_prune_scan(text, integer, interval),
    pgfence_prune_delete(text[], bigint[], interval),
    pgfence_force_release(text, text),
    pgfence_guard()
FROM PUBLIC;

-- Pin every function's search_path. The schema is only known at run time, so
-- the statements are built with format(); the function bodies above are
-- static and resolve their names under this path when they run.
DO $$
DECLARE
    s text := pg_catalog.quote_ident(pg_catalog.current_schema());
    f text;
BEGIN
    FOREACH f IN ARRAY ARRAY[
        'pgfence_next_token()',
        'pgfence_schema_version()',
        'pgfence_acquire(pg_catalog.text[], pg_catalog.text, pg_catalog.int8[])',
        'pgfence_release(pg_catalog.text[], pg_catalog.int8[], pg_catalog.int8[], pg_catalog.text)',
        'pgfence_renew(pg_catalog.text[], pg_catalog.int8[], pg_catalog.int8[])',
        'pgfence_lease_held(pg_catalog.text, pg_catalog.int8)',
        'pgfence_prune_scan(pg_catalog.text, pg_catalog.int4, pg_catalog.interval)',
        'pgfence_prune_delete(pg_catalog.text[], pg_catalog.int8[], pg_catalog.interval)',
        'pgfence_force_release(pg_catalog.text, pg_catalog.text)',
        'pgfence_guard()'
    ] LOOP
        EXECUTE pg_catalog.format('ALTER FUNCTION %s.%s SET search_path = pg_catalog, %s, pg_temp', s, f, s);
    END LOOP;
    -- The batch functions take arrays: a generic plan cannot know their
    -- length and estimates ten rows, so its cost never beats the custom
    -- plans' and the plan cache would plan the statement again on every
    -- call (most of the call's server time). The generic plan is the same
    -- shape (index probes per name), so use it.
    FOREACH f IN ARRAY ARRAY[
        'pgfence_acquire(pg_catalog.text[], pg_catalog.text, pg_catalog.int8[])',
        'pgfence_release(pg_catalog.text[], pg_catalog.int8[], pg_catalog.int8[], pg_catalog.text)',
        'pgfence_renew(pg_catalog.text[], pg_catalog.int8[], pg_catalog.int8[])',
        'pgfence_prune_delete(pg_catalog.text[], pg_catalog.int8[], pg_catalog.interval)'
    ] LOOP
        EXECUTE pg_catalog.format('ALTER FUNCTION %s.%s SET plan_cache_mode = force_generic_plan', s, f);
    END LOOP;
    -- The pins above are set by a list; check the result, so that a function
    -- added to this file and left off the list fails the migration instead
    -- of shipping unpinned.
    SELECT pg_catalog.string_agg(p.oid::pg_catalog.regprocedure::pg_catalog.text, ', ')
    INTO f
    FROM pg_catalog.pg_proc p
    JOIN pg_catalog.pg_namespace n ON n.oid OPERATOR(pg_catalog.=) p.pronamespace
    WHERE n.nspname OPERATOR(pg_catalog.=) pg_catalog.current_schema()
      AND p.proname OPERATOR(pg_catalog.~~) 'pgfence\_%'
      AND NOT coalesce(p.proconfig, '{}') OPERATOR(pg_catalog.@>)
          ARRAY['search_path=pg_catalog, ' OPERATOR(pg_catalog.||) s OPERATOR(pg_catalog.||) ', pg_temp'];
    IF f IS NOT NULL THEN
        RAISE EXCEPTION 'pgfence: functions without a pinned search_path: %', f;
    END IF;
END;
$$;
