-- pgfence's schema at version 11: migrations 000001 to 000011 as they were,
-- for the "before" arm of bench scenario 13 only. Run it in one transaction on
-- a database whose schema "pgfence" exists, with search_path set to it.

-- 000001_create_leases.up.sql
SELECT pg_catalog.set_config('search_path', 'pgfence', true);
-- pgfence lease table and the single source of fencing tokens.
--
-- The fence column is a bigserial: its sequence (pgfence_leases_fence_seq) is
-- NO CYCLE by default, so a token can never wrap around and repeat. Both lock
-- strategies (lease table and advisory locks) draw their tokens from this one
-- sequence, through pgfence_next_token(), so tokens are comparable across them.
CREATE TABLE pgfence_leases (
    name        text        NOT NULL,
    owner       text        NOT NULL,
    fence       bigserial   NOT NULL,
    acquired_at timestamptz NOT NULL DEFAULT now(),
    expires_at  timestamptz NOT NULL,
    CONSTRAINT pgfence_leases_pkey PRIMARY KEY (name),
    CONSTRAINT pgfence_leases_name_check CHECK (name <> '' AND octet_length(name) <= 512),
    CONSTRAINT pgfence_leases_owner_check CHECK (owner <> '' AND octet_length(owner) <= 512)
) WITH (
    -- Renewals and releases update a row in place. Leaving a quarter of each
    -- page free lets those updates stay HOT (no index entry is written), and
    -- no indexed column (name) ever changes.
    fillfactor = 75,
    -- The table is small and churns: vacuum it early so dead versions are
    -- reclaimed before pages fill.
    autovacuum_vacuum_scale_factor = 0.05,
    autovacuum_vacuum_threshold = 100
);

COMMENT ON TABLE pgfence_leases IS
    'pgfence lease locks: one row per lock name; a lease is held while expires_at > now().';
COMMENT ON COLUMN pgfence_leases.fence IS
    'Fencing token of the current (or last) holder; drawn from pgfence_leases_fence_seq, never reused.';

-- pgfence_next_token draws a fencing token that is durable before the caller
-- sees it. A transaction that only calls nextval() gets no transaction id and
-- so commits without waiting for its WAL to be flushed; after a crash the
-- sequence could then hand out the same value again. Assigning a transaction
-- id and forcing synchronous_commit on for the rest of the calling
-- transaction makes its commit wait for the flush (and, where configured, for
-- synchronous standbys), even on a server running synchronous_commit=off.
CREATE FUNCTION pgfence_next_token() RETURNS bigint
    LANGUAGE plpgsql VOLATILE
AS $$
BEGIN
    PERFORM set_config('synchronous_commit', 'on', true);
    PERFORM pg_current_xact_id();
    RETURN nextval('pgfence_leases_fence_seq');
END;
$$;

COMMENT ON FUNCTION pgfence_next_token() IS
    'Draws a fencing token from pgfence_leases_fence_seq and makes the calling transaction commit durably.';

-- 000002_fence_guard.up.sql
SELECT pg_catalog.set_config('search_path', 'pgfence', true);
-- pgfence_guard is a trigger function that protects a user table against
-- writes from stale lock holders, whatever SQL path the write comes from.
--
-- Attach it to a table that has a bigint fencing column (fence_token unless
-- another name is given as the trigger argument):
--
--   CREATE TRIGGER accounts_fence
--       BEFORE UPDATE OR DELETE ON accounts
--       FOR EACH ROW EXECUTE FUNCTION pgfence_guard('fence_token');
--
-- An UPDATE that would move the column backwards (NEW < OLD) is rejected with
-- SQLSTATE PF001, which the fence package reports as pgfence.ErrFenced.
-- An UPDATE that leaves the column unchanged is allowed (the non-strict form);
-- one that sets it to NULL is rejected too. DELETE cannot carry a token, so a
-- DELETE is only guarded when the session has set pgfence.token (the fence
-- package's guarded deletes do, with set_config('pgfence.token', ..., true));
-- a DELETE with a token older than the row's is rejected with PF001.
--
-- Cost: for the default column (no argument, or 'fence_token') the check
-- reads NEW.fence_token and OLD.fence_token directly, which PL/pgSQL plans
-- once per table and session; any other column is read through to_jsonb of
-- the row, which costs more per row but never parses SQL at run time. To
-- skip the call for rows it would accept, attach it behind WHEN conditions
-- (see the fence package documentation):
--
--   CREATE TRIGGER accounts_fence_update BEFORE UPDATE ON accounts FOR EACH ROW
--       WHEN (NEW.fence_token IS NULL OR NEW.fence_token < OLD.fence_token)
--       EXECUTE FUNCTION pgfence_guard('fence_token');
--   CREATE TRIGGER accounts_fence_delete BEFORE DELETE ON accounts FOR EACH ROW
--       WHEN (current_setting('pgfence.token', true) <> '')
--       EXECUTE FUNCTION pgfence_guard('fence_token');
CREATE FUNCTION pgfence_guard() RETURNS trigger
    LANGUAGE plpgsql
AS $$
DECLARE
    old_token bigint;
    new_token bigint;
    presented text;
    old_row   jsonb;
    new_row   jsonb;
BEGIN
    IF TG_OP = 'UPDATE' THEN
        IF TG_NARGS = 0 OR TG_ARGV[0] = 'fence_token' THEN
            new_token := NEW.fence_token;
            old_token := OLD.fence_token;
        ELSE
            new_row := to_jsonb(NEW);
            IF NOT new_row ? TG_ARGV[0] THEN
                RAISE EXCEPTION 'pgfence_guard: table %.% has no column %', TG_TABLE_SCHEMA, TG_TABLE_NAME, TG_ARGV[0]
                    USING ERRCODE = 'undefined_column';
            END IF;
            new_token := (new_row ->> TG_ARGV[0])::bigint;
            old_token := (to_jsonb(OLD) ->> TG_ARGV[0])::bigint;
        END IF;
        IF new_token IS NULL OR new_token < old_token THEN
            RAISE EXCEPTION 'pgfence: stale fencing token % on %.% (current %)',
                    new_token, TG_TABLE_SCHEMA, TG_TABLE_NAME, old_token
                USING ERRCODE = 'PF001',
                      DETAIL = format('presented=%s current=%s', new_token, old_token),
                      HINT = 'A newer lock holder has written this row; this holder''s lock was lost.';
        END IF;
        RETURN NEW;
    ELSIF TG_OP = 'DELETE' THEN
        presented := current_setting('pgfence.token', true);
        IF presented IS NOT NULL AND presented <> '' THEN
            IF TG_NARGS = 0 OR TG_ARGV[0] = 'fence_token' THEN
                old_token := OLD.fence_token;
            ELSE
                old_row := to_jsonb(OLD);
                IF NOT old_row ? TG_ARGV[0] THEN
                    RAISE EXCEPTION 'pgfence_guard: table %.% has no column %', TG_TABLE_SCHEMA, TG_TABLE_NAME, TG_ARGV[0]
                        USING ERRCODE = 'undefined_column';
                END IF;
                old_token := (old_row ->> TG_ARGV[0])::bigint;
            END IF;
            IF presented::bigint < old_token THEN
                RAISE EXCEPTION 'pgfence: stale fencing token % on %.% (current %)',
                        presented, TG_TABLE_SCHEMA, TG_TABLE_NAME, old_token
                    USING ERRCODE = 'PF001',
                          DETAIL = format('presented=%s current=%s', presented, old_token),
                          HINT = 'A newer lock holder has written this row; this holder''s lock was lost.';
            END IF;
        END IF;
        RETURN OLD;
    END IF;
    RETURN NEW;
END;
$$;

COMMENT ON FUNCTION pgfence_guard() IS
    'Trigger: rejects (SQLSTATE PF001) writes that move a fencing column backwards.';

-- 000003_harden.up.sql
SELECT pg_catalog.set_config('search_path', 'pgfence', true);
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

-- 000004_guard_modes.up.sql
SELECT pg_catalog.set_config('search_path', 'pgfence', true);
-- 000004: trigger modes for fenced tables.
--
-- Replaces pgfence_guard (the default mode; existing triggers keep working)
-- with a body that resolves nothing through the writer's search_path and
-- reports a malformed pgfence.token setting (SQLSTATE PF003), and adds:
--
--   pgfence_guard_strict()   BEFORE UPDATE OR DELETE FOR EACH ROW: every
--                            UPDATE or DELETE must present a token >= the
--                            row's, in the guard column or in pgfence.token.
--   pgfence_guard_truncate() BEFORE TRUNCATE FOR EACH STATEMENT: rejects
--                            TRUNCATE (PF001).
--   pgfence_last_token()     the last token the sequence handed out
--                            (SECURITY DEFINER: writers have no privilege
--                            on the sequence).
--
-- Everything is created in current_schema() of the migrating connection
-- (the schema pgfence is installed in). Each function then gets its
-- search_path pinned to pg_catalog, that schema, pg_temp: at the end of this
-- file the session's path is set to that for the rest of the transaction and
-- captured with ALTER FUNCTION ... SET search_path FROM CURRENT. (Setting the
-- path first and creating the functions under it would create them in
-- pg_catalog, the first schema of that path.) The bodies also qualify every
-- built-in they call with pg_catalog, so no object another role creates can
-- change what they run.
DO $$
BEGIN
    IF pg_catalog.current_schema() IS NULL OR pg_catalog.current_schema() = 'pg_catalog' THEN
        RAISE EXCEPTION 'pgfence: migration 000004 needs the schema to install into first in search_path (current schema: %)',
            pg_catalog.current_schema();
    END IF;
END;
$$;

-- The version of the installed schema; the lock strategies check it.
CREATE OR REPLACE FUNCTION pgfence_schema_version() RETURNS integer
    LANGUAGE sql IMMUTABLE
AS $$ SELECT 4 $$;

COMMENT ON FUNCTION pgfence_schema_version() IS
    'The version of the pgfence schema installed here (the number of its last migration).';

-- pgfence_last_token returns the last fencing token pgfence_leases_fence_seq
-- handed out (0 before the first). nextval is not transactional, so this
-- counts tokens drawn by transactions that rolled back too: it is an upper
-- bound on every token any holder can present. It runs as its owner so that
-- writers need no privilege on the sequence, only EXECUTE on this function.
CREATE FUNCTION pgfence_last_token() RETURNS bigint
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER
AS $$
BEGIN
    RETURN (SELECT CASE WHEN s.is_called THEN s.last_value ELSE s.last_value OPERATOR(pg_catalog.-) 1 END
            FROM pgfence_leases_fence_seq AS s);
END;
$$;

REVOKE EXECUTE ON FUNCTION pgfence_last_token() FROM PUBLIC;

COMMENT ON FUNCTION pgfence_last_token() IS
    'The last fencing token pgfence_leases_fence_seq handed out (0 before the first); read by pgfence_guard_strict.';

-- pgfence_guard, the default (non-strict) mode, as in 000002 with the same
-- semantics:
--   UPDATE: rejects (PF001) NEW.col < OLD.col and NEW.col NULL; an UPDATE
--           that leaves the column unchanged passes unchecked.
--   DELETE: when pgfence.token is set (not empty), rejects (PF001) a row
--           whose token is newer; a DELETE without it passes unchecked.
-- New: a pgfence.token that is not a bigint raises PF003, and built-ins are
-- called through pg_catalog only.
CREATE OR REPLACE FUNCTION pgfence_guard() RETURNS trigger
    LANGUAGE plpgsql
AS $$
DECLARE
    old_token bigint;
    new_token bigint;
    setting   text;
    malformed boolean := false;
    presented bigint;
    new_row   jsonb;
    old_row   jsonb;
BEGIN
    IF TG_OP = 'UPDATE' THEN
        IF TG_NARGS = 0 OR TG_ARGV[0] = 'fence_token' THEN
            new_token := NEW.fence_token;
            old_token := OLD.fence_token;
        ELSE
            new_row := pg_catalog.to_jsonb(NEW);
            IF NOT new_row OPERATOR(pg_catalog.?) TG_ARGV[0] THEN
                RAISE EXCEPTION 'pgfence_guard: table %.% has no column %', TG_TABLE_SCHEMA, TG_TABLE_NAME, TG_ARGV[0]
                    USING ERRCODE = 'undefined_column';
            END IF;
            new_token := (new_row OPERATOR(pg_catalog.->>) TG_ARGV[0])::bigint;
            old_token := (pg_catalog.to_jsonb(OLD) OPERATOR(pg_catalog.->>) TG_ARGV[0])::bigint;
        END IF;
        IF new_token IS NULL OR new_token < old_token THEN
            RAISE EXCEPTION 'pgfence: stale fencing token % on %.% (current %)',
                    new_token, TG_TABLE_SCHEMA, TG_TABLE_NAME, old_token
                USING ERRCODE = 'PF001',
                      DETAIL = pg_catalog.format('presented=%s current=%s', new_token, old_token),
                      HINT = 'A newer lock holder has written this row; this holder''s lock was lost.';
        END IF;
        RETURN NEW;
    ELSIF TG_OP = 'DELETE' THEN
        setting := pg_catalog.current_setting('pgfence.token'::text, true);
        IF setting IS NOT NULL AND setting <> ''::text THEN
            -- Up to 18 digits (what set_config(..., token::text, true)
            -- writes) is a bigint; anything else is checked in full.
            IF setting !~ '^[0-9]{1,18}$'::text THEN
                IF setting !~ '^[[:space:]]*[-+]?[0-9]{1,19}[[:space:]]*$'::text THEN
                    malformed := true;
                ELSIF setting::numeric NOT BETWEEN -9223372036854775808::numeric AND 9223372036854775807::numeric THEN
                    malformed := true;
                END IF;
            END IF;
            IF malformed THEN
                RAISE EXCEPTION 'pgfence: malformed pgfence.token setting %: want a fencing token (a bigint) or an empty string',
                        pg_catalog.quote_literal(setting)
                    USING ERRCODE = 'PF003',
                          HINT = 'Set it with set_config(''pgfence.token'', token::text, true).';
            END IF;
            presented := setting::bigint;
            IF TG_NARGS = 0 OR TG_ARGV[0] = 'fence_token' THEN
                old_token := OLD.fence_token;
            ELSE
                old_row := pg_catalog.to_jsonb(OLD);
                IF NOT old_row OPERATOR(pg_catalog.?) TG_ARGV[0] THEN
                    RAISE EXCEPTION 'pgfence_guard: table %.% has no column %', TG_TABLE_SCHEMA, TG_TABLE_NAME, TG_ARGV[0]
                        USING ERRCODE = 'undefined_column';
                END IF;
                old_token := (old_row OPERATOR(pg_catalog.->>) TG_ARGV[0])::bigint;
            END IF;
            IF presented < old_token THEN
                RAISE EXCEPTION 'pgfence: stale fencing token % on %.% (current %)',
                        presented, TG_TABLE_SCHEMA, TG_TABLE_NAME, old_token
                    USING ERRCODE = 'PF001',
                          DETAIL = pg_catalog.format('presented=%s current=%s', presented, old_token),
                          HINT = 'A newer lock holder has written this row; this holder''s lock was lost.';
            END IF;
        END IF;
        RETURN OLD;
    END IF;
    RETURN NEW;
END;
$$;

COMMENT ON FUNCTION pgfence_guard() IS
    'Trigger: rejects (SQLSTATE PF001) writes that move a fencing column backwards.';

-- pgfence_guard_strict: every UPDATE and DELETE must present a token at
-- least as new as the row's.
--
--   CREATE TRIGGER accounts_fence
--       BEFORE UPDATE OR DELETE ON accounts
--       FOR EACH ROW EXECUTE FUNCTION pgfence_guard_strict('fence_token');
--
-- UPDATE: NEW.col > OLD.col presents NEW.col. NEW.col = OLD.col (also what
--   an UPDATE that does not mention the column looks like) presents the
--   transaction's pgfence.token setting, which must be set and >= OLD.col;
--   when it is newer, the row's column is set to it, so the row always
--   records the newest token that wrote it. NEW.col < OLD.col, NEW.col NULL,
--   or a missing pgfence.token is rejected. INSERT ... ON CONFLICT DO UPDATE
--   takes this path for the conflicting row.
-- DELETE: presents pgfence.token, which must be set and >= OLD.col.
-- A presented token newer than the row's must also not be newer than the
-- last token the sequence handed out (pgfence_last_token()). A row whose
-- column is NULL accepts any presented token up to that.
-- Every rejection is PF001 with DETAIL 'presented=<token> current=<row's>'
-- (presented empty when no token was presented); a malformed pgfence.token
-- is PF003. INSERT is not checked: a new row carries the token it is
-- inserted with.
--
-- The function runs as the writer (it is not SECURITY DEFINER): writers need
-- USAGE on this schema and EXECUTE on pgfence_last_token(), and nothing on
-- the trigger function itself (EXECUTE on a trigger function is checked
-- when the trigger is created, not when it fires).
CREATE FUNCTION pgfence_guard_strict() RETURNS trigger
    LANGUAGE plpgsql
AS $$
DECLARE
    other     boolean := TG_NARGS > 0 AND TG_ARGV[0] <> 'fence_token';
    old_token bigint;
    new_token bigint;
    setting   text;
    malformed boolean := false;
    presented bigint;
    old_row   jsonb;
    new_row   jsonb;
BEGIN
    IF TG_WHEN <> 'BEFORE' OR TG_LEVEL <> 'ROW' OR TG_OP NOT IN ('UPDATE', 'DELETE') THEN
        RAISE EXCEPTION 'pgfence_guard_strict: attach it BEFORE UPDATE OR DELETE ... FOR EACH ROW, not % % FOR EACH %',
                TG_WHEN, TG_OP, TG_LEVEL
            USING ERRCODE = 'trigger_protocol_violated';
    END IF;
    IF NOT other THEN
        old_token := OLD.fence_token;
        IF TG_OP = 'UPDATE' THEN
            new_token := NEW.fence_token;
        END IF;
    ELSE
        old_row := pg_catalog.to_jsonb(OLD);
        IF NOT old_row OPERATOR(pg_catalog.?) TG_ARGV[0] THEN
            RAISE EXCEPTION 'pgfence_guard_strict: table %.% has no column %', TG_TABLE_SCHEMA, TG_TABLE_NAME, TG_ARGV[0]
                USING ERRCODE = 'undefined_column';
        END IF;
        old_token := (old_row OPERATOR(pg_catalog.->>) TG_ARGV[0])::bigint;
        IF TG_OP = 'UPDATE' THEN
            new_row := pg_catalog.to_jsonb(NEW);
            new_token := (new_row OPERATOR(pg_catalog.->>) TG_ARGV[0])::bigint;
        END IF;
    END IF;

    IF TG_OP = 'UPDATE' AND new_token IS DISTINCT FROM old_token THEN
        -- The UPDATE sets the column: it presents the new value.
        presented := new_token;
    ELSE
        -- A DELETE, or an UPDATE that leaves the column as it is: the
        -- transaction's pgfence.token is the token presented.
        setting := pg_catalog.current_setting('pgfence.token'::text, true);
        IF setting IS NOT NULL AND setting <> ''::text THEN
            -- Up to 18 digits (what set_config(..., token::text, true)
            -- writes) is a bigint; anything else is checked in full.
            IF setting !~ '^[0-9]{1,18}$'::text THEN
                IF setting !~ '^[[:space:]]*[-+]?[0-9]{1,19}[[:space:]]*$'::text THEN
                    malformed := true;
                ELSIF setting::numeric NOT BETWEEN -9223372036854775808::numeric AND 9223372036854775807::numeric THEN
                    malformed := true;
                END IF;
            END IF;
            IF malformed THEN
                RAISE EXCEPTION 'pgfence: malformed pgfence.token setting %: want a fencing token (a bigint) or an empty string',
                        pg_catalog.quote_literal(setting)
                    USING ERRCODE = 'PF003',
                          HINT = 'Set it with set_config(''pgfence.token'', token::text, true).';
            END IF;
            presented := setting::bigint;
        END IF;
    END IF;

    IF presented IS NULL THEN
        RAISE EXCEPTION 'pgfence: % on %.% presents no fencing token (strict mode; current %)',
                TG_OP, TG_TABLE_SCHEMA, TG_TABLE_NAME, old_token
            USING ERRCODE = 'PF001',
                  DETAIL = pg_catalog.format('presented=%s current=%s', presented, old_token),
                  HINT = 'Set the guard column to the token, or set pgfence.token with set_config(''pgfence.token'', token::text, true) in the transaction.';
    END IF;
    IF presented < old_token THEN
        RAISE EXCEPTION 'pgfence: stale fencing token % on %.% (current %)',
                presented, TG_TABLE_SCHEMA, TG_TABLE_NAME, old_token
            USING ERRCODE = 'PF001',
                  DETAIL = pg_catalog.format('presented=%s current=%s', presented, old_token),
                  HINT = 'A newer lock holder has written this row; this holder''s lock was lost.';
    END IF;
    -- A newer token must have been issued. (A separate IF: EXECUTE on
    -- pgfence_last_token is checked when the expression calling it is first
    -- prepared, so writers presenting the row's own token never need it.)
    IF old_token IS NULL OR presented > old_token THEN
        IF presented > pgfence_last_token() THEN
            RAISE EXCEPTION 'pgfence: fencing token % on %.% was never issued (current %)',
                    presented, TG_TABLE_SCHEMA, TG_TABLE_NAME, old_token
                USING ERRCODE = 'PF001',
                      DETAIL = pg_catalog.format('presented=%s current=%s', presented, old_token),
                      HINT = 'Tokens come from pgfence_next_token(); this one is newer than any it has handed out.';
        END IF;
    END IF;

    IF TG_OP = 'DELETE' THEN
        RETURN OLD;
    END IF;
    IF presented IS DISTINCT FROM new_token THEN
        -- A newer pgfence.token on an UPDATE that left the column alone:
        -- record it, so a holder with an older token cannot write next.
        IF NOT other THEN
            NEW.fence_token := presented;
        ELSE
            NEW := pg_catalog.jsonb_populate_record(NEW,
                pg_catalog.jsonb_build_object(TG_ARGV[0], presented));
        END IF;
    END IF;
    RETURN NEW;
END;
$$;

REVOKE EXECUTE ON FUNCTION pgfence_guard_strict() FROM PUBLIC;

COMMENT ON FUNCTION pgfence_guard_strict() IS
    'Trigger (strict mode): every UPDATE and DELETE must present a fencing token >= the row''s, else SQLSTATE PF001.';

-- pgfence_guard_truncate rejects TRUNCATE, which fires no row triggers and
-- so would bypass either mode:
--
--   CREATE TRIGGER accounts_fence_truncate
--       BEFORE TRUNCATE ON accounts
--       FOR EACH STATEMENT EXECUTE FUNCTION pgfence_guard_truncate();
--
-- To empty the table on purpose, the owner disables or drops the trigger.
CREATE FUNCTION pgfence_guard_truncate() RETURNS trigger
    LANGUAGE plpgsql
AS $$
BEGIN
    IF TG_OP <> 'TRUNCATE' THEN
        RAISE EXCEPTION 'pgfence_guard_truncate: attach it BEFORE TRUNCATE ... FOR EACH STATEMENT, not % % FOR EACH %',
                TG_WHEN, TG_OP, TG_LEVEL
            USING ERRCODE = 'trigger_protocol_violated';
    END IF;
    RAISE EXCEPTION 'pgfence: TRUNCATE of fenced table %.% is not allowed', TG_TABLE_SCHEMA, TG_TABLE_NAME
        USING ERRCODE = 'PF001',
              DETAIL = 'presented= current=',
              HINT = 'Delete rows with a fencing token, or have the table owner disable the trigger.';
END;
$$;

REVOKE EXECUTE ON FUNCTION pgfence_guard_truncate() FROM PUBLIC;

COMMENT ON FUNCTION pgfence_guard_truncate() IS
    'Trigger (BEFORE TRUNCATE): rejects TRUNCATE of a fenced table with SQLSTATE PF001.';

-- Pin every function's search_path: built-ins from pg_catalog first, this
-- schema's objects next, pg_temp last.
SELECT pg_catalog.set_config('search_path',
    'pg_catalog, ' || pg_catalog.quote_ident(pg_catalog.current_schema()) || ', pg_temp', true);

ALTER FUNCTION pgfence_schema_version() SET search_path FROM CURRENT;
ALTER FUNCTION pgfence_last_token() SET search_path FROM CURRENT;
ALTER FUNCTION pgfence_guard() SET search_path FROM CURRENT;
ALTER FUNCTION pgfence_guard_strict() SET search_path FROM CURRENT;
ALTER FUNCTION pgfence_guard_truncate() SET search_path FROM CURRENT;

-- 000005_leader.up.sql
SELECT pg_catalog.set_config('search_path', 'pgfence', true);
-- 000005: leader election (package leader).
--
-- An election is a lease of pgfence_leases: its leader is the lease's
-- holder, a term is one grant of it, and the term's fencing token is the
-- lease's. What the lease table cannot carry is the value a leader
-- proclaims (an address to forward requests to); this migration adds the
-- table that does, and the one function that writes it:
--
--   pgfence_leaders                one row per term of each election (the
--                                  newest ten), with the value proclaimed
--   pgfence_leader_proclaim(...)   records the value of a term whose lease
--                                  is held, and notifies pgfence_leader
--
-- Everything is created in current_schema() of the migrating connection, as
-- in 000004; every function gets search_path pinned to pg_catalog, that
-- schema, pg_temp at the end of this file, and the bodies qualify the
-- built-ins they call.
DO $$
BEGIN
    IF pg_catalog.current_schema() IS NULL OR pg_catalog.current_schema() = 'pg_catalog' THEN
        RAISE EXCEPTION 'pgfence: migration 000005 needs the schema to install into first in search_path (current schema: %)',
            pg_catalog.current_schema();
    END IF;
END;
$$;

CREATE OR REPLACE FUNCTION pgfence_schema_version() RETURNS integer
    LANGUAGE sql IMMUTABLE
AS $$ SELECT 5 $$;

COMMENT ON FUNCTION pgfence_schema_version() IS
    'The version of the pgfence schema installed here (the number of its last migration).';

-- One row per term: the election (the lease name), the term's token (the
-- lease's fence when it was granted), the holder's owner id, the value it
-- proclaimed, when the term began (the lease's acquired_at) and when the
-- value was last proclaimed, all on the database clock. The current leader
-- is the row whose token is the fence of the held lease of the same name;
-- rows of older terms are history, for operators (pgfence ls --terms).
-- Only pgfence_leader_proclaim writes it; it keeps the newest ten terms of
-- each election.
CREATE TABLE pgfence_leaders (
    name          text        NOT NULL,
    token         bigint      NOT NULL,
    owner         text        NOT NULL,
    value         text        NOT NULL,
    began_at      timestamptz NOT NULL,
    proclaimed_at timestamptz NOT NULL,
    CONSTRAINT pgfence_leaders_pkey PRIMARY KEY (name, token),
    CONSTRAINT pgfence_leaders_value_check CHECK (pg_catalog.octet_length(value) <= 4096)
);

REVOKE ALL ON TABLE pgfence_leaders FROM PUBLIC;

COMMENT ON TABLE pgfence_leaders IS
    'pgfence leader election: one row per term (newest ten per election), with the value its leader proclaimed.';

-- pgfence_leader_proclaim records value as what the term (name, token) of
-- owner proclaims, if that lease is held now: its row has the name, owner
-- and token, and expires after clock_timestamp() (the time of the check,
-- not the transaction's start). It locks that lease row FOR SHARE until
-- the transaction ends, so no takeover can commit between the check and
-- the write. It inserts the term's row or replaces its value, deletes the
-- election's terms older than its newest ten, notifies pgfence_leader with
-- the name (delivered at commit), and returns true; it returns false, and
-- writes nothing, when the lease is not held so.
--
-- Like a release, the transaction commits without waiting for its WAL to
-- be flushed (synchronous_commit off), but only when nothing else was
-- written in it before (no transaction id assigned yet), so it never
-- weakens the durability of a token drawn in the same transaction. Losing
-- a proclamation in a crash makes the term look unproclaimed until its
-- leader proclaims again; it never makes anyone look like the leader.
CREATE FUNCTION pgfence_leader_proclaim(name text, token bigint, owner text, value text)
    RETURNS boolean
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER
AS $$
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
$$;

REVOKE EXECUTE ON FUNCTION pgfence_leader_proclaim(text, bigint, text, text) FROM PUBLIC;

COMMENT ON FUNCTION pgfence_leader_proclaim(text, bigint, text, text) IS
    'Records the value a term proclaims if its lease is held (name, token, owner), keeps the newest ten terms, notifies pgfence_leader.';

SELECT pg_catalog.set_config('search_path',
    'pg_catalog, ' || pg_catalog.quote_ident(pg_catalog.current_schema()) || ', pg_temp', true);

ALTER FUNCTION pgfence_schema_version() SET search_path FROM CURRENT;
ALTER FUNCTION pgfence_leader_proclaim(text, bigint, text, text) SET search_path FROM CURRENT;

-- 000006_token_flush.up.sql
SELECT pg_catalog.set_config('search_path', 'pgfence', true);
-- 000006: a token drawn by pgfence_next_token() is durable before its
-- transaction's commit returns, whatever else the transaction did.
--
-- pgfence_next_token() (000003) assigned a transaction id and raised
-- synchronous_commit to on, expecting the commit to wait for the WAL flush.
-- PostgreSQL waits at commit only when the transaction itself wrote WAL
-- before its commit record (RecordTransactionCommit's wrote_xlog), and
-- nextval() writes WAL only once per 32 values: it logs a value 32 ahead and
-- hands out the values below it without a record. A transaction that drew
-- such a value and wrote nothing else (a session advisory lock's grant, or a
-- transaction lock's in a transaction that writes nothing) therefore
-- committed without waiting for the flush, nor for a synchronous standby.
-- When the record covering the value had been written by another
-- transaction not yet flushed, a crash, or a failover to a standby that had
-- not received it, could hand the same token out again: two holders with
-- equal tokens, which the fence's <= form lets both write.
--
-- pgfence_next_token() now also sets pgfence_token_flush_seq (a sequence of
-- its own, used for nothing else): setval() writes a WAL record on every
-- call, so the transaction has written WAL and its commit flushes it, up to
-- and past the record that covers the token, and waits for synchronous
-- standbys where they are configured. setval() holds the sequence's buffer
-- lock only while it writes the record, so concurrent draws do not queue on
-- each other until commit.
--
-- Everything is created in current_schema() of the migrating connection, as
-- in 000004 and 000005; the functions get search_path pinned to pg_catalog,
-- that schema, pg_temp at the end of this file.
DO $$
BEGIN
    IF pg_catalog.current_schema() IS NULL OR pg_catalog.current_schema() = 'pg_catalog' THEN
        RAISE EXCEPTION 'pgfence: migration 000006 needs the schema to install into first in search_path (current schema: %)',
            pg_catalog.current_schema();
    END IF;
END;
$$;

CREATE SEQUENCE pgfence_token_flush_seq MINVALUE 0 MAXVALUE 1 START 0 CACHE 1 NO CYCLE;

REVOKE ALL ON SEQUENCE pgfence_token_flush_seq FROM PUBLIC;

COMMENT ON SEQUENCE pgfence_token_flush_seq IS
    'pgfence: set by pgfence_next_token() on every draw, only to write WAL so that the drawing transaction commits durably; its value means nothing.';

CREATE OR REPLACE FUNCTION pgfence_next_token() RETURNS bigint
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp -- re-pinned below with the install schema
AS $$
DECLARE
    token bigint;
BEGIN
    IF pg_catalog.current_setting('synchronous_commit') NOT IN ('on', 'remote_apply') THEN
        PERFORM pg_catalog.set_config('synchronous_commit', 'on', true);
    END IF;
    IF NOT EXISTS (
        SELECT FROM pg_catalog.pg_sequence s
        WHERE s.seqrelid = 'pgfence_leases_fence_seq'::pg_catalog.regclass
          AND s.seqincrement = 1 AND s.seqcache = 1 AND NOT s.seqcycle
    ) THEN
        RAISE EXCEPTION 'pgfence: sequence pgfence_leases_fence_seq must be INCREMENT 1 CACHE 1 NO CYCLE'
            USING ERRCODE = 'PF002',
                  HINT = 'As its owner: ALTER SEQUENCE pgfence_leases_fence_seq INCREMENT 1 CACHE 1 NO CYCLE.';
    END IF;
    token := pg_catalog.nextval('pgfence_leases_fence_seq'::pg_catalog.regclass);
    -- A WAL record of this transaction's own (and, through setval, a
    -- transaction id), so that its commit waits for the flush.
    PERFORM pg_catalog.setval('pgfence_token_flush_seq'::pg_catalog.regclass, 1, true);
    RETURN token;
END;
$$;

COMMENT ON FUNCTION pgfence_next_token() IS
    'Draws a fencing token from pgfence_leases_fence_seq (which must be INCREMENT 1 CACHE 1 NO CYCLE, else PF002) and makes the calling transaction commit durably (it writes WAL and raises synchronous_commit to on).';

CREATE OR REPLACE FUNCTION pgfence_schema_version() RETURNS integer
    LANGUAGE sql IMMUTABLE
AS $$ SELECT 6 $$;

COMMENT ON FUNCTION pgfence_schema_version() IS
    'The version of the pgfence schema installed here (the number of its last migration).';

SELECT pg_catalog.set_config('search_path',
    'pg_catalog, ' || pg_catalog.quote_ident(pg_catalog.current_schema()) || ', pg_temp', true);

ALTER FUNCTION pgfence_schema_version() SET search_path FROM CURRENT;
ALTER FUNCTION pgfence_next_token() SET search_path FROM CURRENT;

-- 000007_acquire_one.up.sql
SELECT pg_catalog.set_config('search_path', 'pgfence', true);
-- 000007: pgfence_acquire takes a single lease with one UPDATE.
--
-- Most acquire statements carry one name (a lone caller, and every
-- hand-over from a released holder to a waiter), and most of those names
-- have a row already, freed by a release or expired. 000003's statement
-- handled them like any batch: an INSERT ... ON CONFLICT DO UPDATE under a
-- CTE with a UNION, which drew a token for the row it tried to insert and
-- another under the row lock when the insert met the existing row (every
-- take-over of a freed row burnt one token), and planned and ran a dozen
-- nodes for one row.
--
-- For one name the function now runs the UPDATE that takes an existing free
-- row (expires_at <= now(), database clock, judged on the row's newest
-- version under its lock, so two concurrent takers cannot both win), which
-- draws exactly one token, and only for the row it takes; when the row is
-- held it returns the holder from a fresh snapshot (so a holder that
-- committed after the UPDATE started is reported, not missed), drawing no
-- token and locking nothing. A name with no row, and every batch of more
-- than one name, runs 000003's statement unchanged. The result rows, the
-- signature, the privileges and the settings (search_path pinned,
-- plan_cache_mode = force_generic_plan) are those of 000003.
--
-- Everything is created in current_schema() of the migrating connection, as
-- in 000004 to 000006.
DO $$
BEGIN
    IF pg_catalog.current_schema() IS NULL OR pg_catalog.current_schema() = 'pg_catalog' THEN
        RAISE EXCEPTION 'pgfence: migration 000007 needs the schema to install into first in search_path (current schema: %)',
            pg_catalog.current_schema();
    END IF;
END;
$$;

CREATE OR REPLACE FUNCTION pgfence_acquire(names text[], new_owner text, ttl_us bigint[])
    RETURNS TABLE(acquired boolean, name text, owner text, fence bigint,
                  acquired_at timestamptz, expires_at timestamptz, db_now timestamptz)
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp -- re-pinned below with the install schema
AS $$
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
$$;

COMMENT ON FUNCTION pgfence_acquire(text[], text, bigint[]) IS
    'Takes each free or expired lease of a batch with a fresh token; returns one row per name: the new lease, or the current holder.';

CREATE OR REPLACE FUNCTION pgfence_schema_version() RETURNS integer
    LANGUAGE sql IMMUTABLE
AS $$ SELECT 7 $$;

COMMENT ON FUNCTION pgfence_schema_version() IS
    'The version of the pgfence schema installed here (the number of its last migration).';

SELECT pg_catalog.set_config('search_path',
    'pg_catalog, ' || pg_catalog.quote_ident(pg_catalog.current_schema()) || ', pg_temp', true);

ALTER FUNCTION pgfence_schema_version() SET search_path FROM CURRENT;
ALTER FUNCTION pgfence_acquire(text[], text, bigint[]) SET search_path FROM CURRENT;
ALTER FUNCTION pgfence_acquire(text[], text, bigint[]) SET plan_cache_mode = force_generic_plan;

-- 000008_token_flush_when_needed.up.sql
SELECT pg_catalog.set_config('search_path', 'pgfence', true);
-- 000008: a token draw waits for the WAL flush only when the WAL that makes
-- its token durable is not flushed yet.
--
-- 000006 made every transaction that draws a token write a WAL record of
-- its own (setval on pgfence_token_flush_seq), so that its commit waits for
-- the flush: nextval() writes a record only once per 32 values (it logs a
-- value 32 ahead and hands out the values below it without one), and the
-- record that covers a value handed out without one may belong to another
-- transaction, not yet flushed. But most of the time that record was
-- flushed long ago, and every draw still cost a transaction id and a wait
-- for the disk: a session advisory lock's grant, which writes nothing else,
-- waited for a flush that protected nothing.
--
-- The record that covers the drawn value was inserted into the WAL before
-- nextval() returned (nextval writes it, under the sequence's buffer lock,
-- before it updates the value that later draws read), so it ends at or
-- before pg_current_wal_insert_lsn() read after the draw. When
-- pg_current_wal_flush_lsn() has reached that position, the record is on
-- disk, and so is every value it covers: a crash cannot hand the token out
-- again, and the draw writes nothing. Otherwise (the record is this draw's
-- own, or another transaction's not flushed yet, or other WAL was written
-- since) it sets pgfence_token_flush_seq as in 000006, and the commit
-- flushes everything written before it. The comparison errs only one way:
-- a position at a page boundary, or WAL written by others, can only make a
-- draw flush when it need not.
--
-- A flush on this server is not enough where synchronous standbys are
-- named: the token must reach them before the commit returns, or a failover
-- could hand it out again. So whenever synchronous_standby_names is not
-- empty every draw writes its record, as in 000006, and its commit waits
-- for the standbys. With asynchronous replication a failover can lose any
-- commit, flushed or not (docs/ha.md), so skipping the flush loses nothing
-- there that was kept before.
--
-- synchronous_commit is still raised to on, so that a transaction that
-- draws and writes WAL (a lease table grant) commits durably.
--
-- Everything is created in current_schema() of the migrating connection, as
-- in 000004 to 000007.
DO $$
BEGIN
    IF pg_catalog.current_schema() IS NULL OR pg_catalog.current_schema() = 'pg_catalog' THEN
        RAISE EXCEPTION 'pgfence: migration 000008 needs the schema to install into first in search_path (current schema: %)',
            pg_catalog.current_schema();
    END IF;
END;
$$;

CREATE OR REPLACE FUNCTION pgfence_next_token() RETURNS bigint
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp -- re-pinned below with the install schema
AS $$
DECLARE
    token bigint;
BEGIN
    IF pg_catalog.current_setting('synchronous_commit') NOT IN ('on', 'remote_apply') THEN
        PERFORM pg_catalog.set_config('synchronous_commit', 'on', true);
    END IF;
    IF NOT EXISTS (
        SELECT FROM pg_catalog.pg_sequence s
        WHERE s.seqrelid = 'pgfence_leases_fence_seq'::pg_catalog.regclass
          AND s.seqincrement = 1 AND s.seqcache = 1 AND NOT s.seqcycle
    ) THEN
        RAISE EXCEPTION 'pgfence: sequence pgfence_leases_fence_seq must be INCREMENT 1 CACHE 1 NO CYCLE'
            USING ERRCODE = 'PF002',
                  HINT = 'As its owner: ALTER SEQUENCE pgfence_leases_fence_seq INCREMENT 1 CACHE 1 NO CYCLE.';
    END IF;
    token := pg_catalog.nextval('pgfence_leases_fence_seq'::pg_catalog.regclass);
    -- Both positions are read after the draw: the record covering token
    -- ends at or before the insert position.
    IF pg_catalog.current_setting('synchronous_standby_names') <> ''
       OR pg_catalog.pg_current_wal_flush_lsn() OPERATOR(pg_catalog.<) pg_catalog.pg_current_wal_insert_lsn() THEN
        -- A WAL record of this transaction's own (and, through setval, a
        -- transaction id), so that its commit waits for the flush, and for
        -- synchronous standbys.
        PERFORM pg_catalog.setval('pgfence_token_flush_seq'::pg_catalog.regclass, 1, true);
    END IF;
    RETURN token;
END;
$$;

COMMENT ON FUNCTION pgfence_next_token() IS
    'Draws a fencing token from pgfence_leases_fence_seq (which must be INCREMENT 1 CACHE 1 NO CYCLE, else PF002); the token is durable once the calling transaction commits (it writes WAL, so that the commit waits for the flush and for synchronous standbys, unless the WAL that covers the token is flushed already and no synchronous standby is named).';

CREATE OR REPLACE FUNCTION pgfence_schema_version() RETURNS integer
    LANGUAGE sql IMMUTABLE
AS $$ SELECT 8 $$;

COMMENT ON FUNCTION pgfence_schema_version() IS
    'The version of the pgfence schema installed here (the number of its last migration).';

SELECT pg_catalog.set_config('search_path',
    'pg_catalog, ' || pg_catalog.quote_ident(pg_catalog.current_schema()) || ', pg_temp', true);

ALTER FUNCTION pgfence_schema_version() SET search_path FROM CURRENT;
ALTER FUNCTION pgfence_next_token() SET search_path FROM CURRENT;

-- 000009_token_batch.up.sql
SELECT pg_catalog.set_config('search_path', 'pgfence', true);
-- 000009: one call draws the tokens of every lock a statement granted.
--
-- An advisory Locker takes the session locks of many callers in one
-- statement (advisory/batch.go) and, until now, called pgfence_next_token()
-- once for each lock granted. Each call paid again for what does not change
-- within a statement: entering a SECURITY DEFINER function with its own
-- search_path, the check of the sequence's settings in pg_sequence, the
-- synchronous_commit test and the WAL positions; about 10 microseconds of
-- server time per token here, against about 1 for the nextval itself (a
-- 16-lock statement: 170-190 us with a call per token, 40-60 us with
-- pgfence_next_tokens).
--
-- pgfence_next_tokens(wanted) returns an array as long as wanted holding, at
-- each position where wanted is true, a token drawn from
-- pgfence_leases_fence_seq, in the order of the positions (so they grow
-- along the array), and NULL elsewhere. It checks the sequence once, draws
-- every token, then reads the WAL positions once, after the last draw: the
-- record that covers any of the tokens ends at or before the insert
-- position read then, so the test of 000008 covers them all. When the WAL
-- they need is not flushed yet, or synchronous standbys are named, it
-- writes the one record (pgfence_token_flush_seq) whose commit waits for the
-- flush and the standbys: every token of the call becomes durable with the
-- calling transaction's commit, as one from pgfence_next_token() does.
--
-- An array of more than 65536 elements is refused (SQLSTATE 22023): no
-- statement of pgfence's draws that many, and one call must not run for
-- long while it holds the sequence's log position to itself.
--
-- Every role that may execute pgfence_next_token() is granted EXECUTE on the
-- new function, so that an application role granted before this migration
-- draws in batches without a new grant (migrations.Grant grants it too).
--
-- Everything is created in current_schema() of the migrating connection, as
-- in 000004 to 000008.
DO $$
BEGIN
    IF pg_catalog.current_schema() IS NULL OR pg_catalog.current_schema() = 'pg_catalog' THEN
        RAISE EXCEPTION 'pgfence: migration 000009 needs the schema to install into first in search_path (current schema: %)',
            pg_catalog.current_schema();
    END IF;
END;
$$;

CREATE FUNCTION pgfence_next_tokens(wanted boolean[]) RETURNS bigint[]
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp -- re-pinned below with the install schema
AS $$
DECLARE
    tokens bigint[];
BEGIN
    IF wanted IS NULL THEN
        RETURN NULL;
    END IF;
    IF pg_catalog.cardinality(wanted) OPERATOR(pg_catalog.>) 65536 THEN
        RAISE EXCEPTION 'pgfence: pgfence_next_tokens draws for at most 65536 positions, not %', pg_catalog.cardinality(wanted)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF pg_catalog.current_setting('synchronous_commit') NOT IN ('on', 'remote_apply') THEN
        PERFORM pg_catalog.set_config('synchronous_commit', 'on', true);
    END IF;
    IF NOT EXISTS (
        SELECT FROM pg_catalog.pg_sequence s
        WHERE s.seqrelid = 'pgfence_leases_fence_seq'::pg_catalog.regclass
          AND s.seqincrement = 1 AND s.seqcache = 1 AND NOT s.seqcycle
    ) THEN
        RAISE EXCEPTION 'pgfence: sequence pgfence_leases_fence_seq must be INCREMENT 1 CACHE 1 NO CYCLE'
            USING ERRCODE = 'PF002',
                  HINT = 'As its owner: ALTER SEQUENCE pgfence_leases_fence_seq INCREMENT 1 CACHE 1 NO CYCLE.';
    END IF;
    -- One token per true position, drawn in the order of the positions.
    SELECT pg_catalog.array_agg(CASE WHEN w.want THEN pg_catalog.nextval('pgfence_leases_fence_seq'::pg_catalog.regclass) END
                                ORDER BY w.pos)
        INTO tokens
        FROM pg_catalog.unnest(wanted) WITH ORDINALITY AS w(want, pos);
    -- Both positions are read after the last draw: the record covering any
    -- of the tokens ends at or before the insert position.
    IF pg_catalog.current_setting('synchronous_standby_names') <> ''
       OR pg_catalog.pg_current_wal_flush_lsn() OPERATOR(pg_catalog.<) pg_catalog.pg_current_wal_insert_lsn() THEN
        PERFORM pg_catalog.setval('pgfence_token_flush_seq'::pg_catalog.regclass, 1, true);
    END IF;
    RETURN COALESCE(tokens, '{}');
END;
$$;

REVOKE ALL ON FUNCTION pgfence_next_tokens(boolean[]) FROM PUBLIC;

COMMENT ON FUNCTION pgfence_next_tokens(boolean[]) IS
    'Draws a fencing token from pgfence_leases_fence_seq for each true element of its argument (at most 65536 elements), in order, NULL elsewhere; the checks and durability of pgfence_next_token, paid once per call.';

-- Whoever may draw one token at a time may draw several.
DO $$
DECLARE
    grantee pg_catalog.regrole;
BEGIN
    FOR grantee IN
        SELECT a.grantee::pg_catalog.regrole
        FROM pg_catalog.pg_proc p, pg_catalog.aclexplode(p.proacl) AS a
        WHERE p.oid = 'pgfence_next_token()'::pg_catalog.regprocedure
          AND a.privilege_type = 'EXECUTE'
          AND a.grantee OPERATOR(pg_catalog.<>) 0
          AND a.grantee OPERATOR(pg_catalog.<>) p.proowner
    LOOP
        EXECUTE pg_catalog.format('GRANT EXECUTE ON FUNCTION pgfence_next_tokens(boolean[]) TO %s', grantee);
    END LOOP;
END;
$$;

CREATE OR REPLACE FUNCTION pgfence_schema_version() RETURNS integer
    LANGUAGE sql IMMUTABLE
AS $$ SELECT 9 $$;

COMMENT ON FUNCTION pgfence_schema_version() IS
    'The version of the pgfence schema installed here (the number of its last migration).';

SELECT pg_catalog.set_config('search_path',
    'pg_catalog, ' || pg_catalog.quote_ident(pg_catalog.current_schema()) || ', pg_temp', true);

ALTER FUNCTION pgfence_schema_version() SET search_path FROM CURRENT;
ALTER FUNCTION pgfence_next_tokens(boolean[]) SET search_path FROM CURRENT;

-- 000010_token_blocks.up.sql
SELECT pg_catalog.set_config('search_path', 'pgfence', true);
-- 000010: one sequence value covers a block of 1024 tokens, so that a
-- combined statement's tokens share one value and its WAL.
--
-- nextval() writes a WAL record once per 32 values, and a token draw waits
-- for the flush of the record that covers its token (000006, 000008). With
-- one value per token, an advisory Locker's combined statement of 16 grants
-- waited for a flush every second statement: on a disk whose flush takes
-- about 0.4 ms, more than half the server time of a statement that takes 16
-- locks and releases them (measured with pgbench: 0.40 ms per lock and
-- unlock statement pair, 0.17 ms with fsync off, 0.12 ms with no tokens).
--
-- The sequence now steps by 1024 (INCREMENT 1024). pgfence_next_token()
-- returns the value it draws, as before: tokens still only grow, and each
-- draw's token is larger than every token drawn before it. pgfence_next_tokens
-- draws one value for each 1024 tokens it hands out and gives the tokens of
-- one value consecutively from it (value, value + 1, ...): every token of a
-- value lies below the next value drawn, so every token drawn later, by any
-- call, is larger. The WAL record that covers a value covers its block, so
-- the test of 000008 still covers every token; a 16-grant statement now
-- draws one value, and 32 such statements share one flush.
--
-- pgfence_last_token(), the bound pgfence_guard_strict puts on presented
-- tokens, now returns the top of the last value's block (value + 1023): a
-- token drawn from that block may have been handed out. A presented token
-- at or below that bound is also below every token drawn after it, so it
-- can never outrank a later holder.
--
-- Tokens already handed out stay below every new one: the next value is the
-- last one plus 1024. The sequence's checks (PF002) now require INCREMENT
-- 1024 CACHE 1 NO CYCLE. The down migration moves the sequence to the top
-- of its last block before it steps by 1 again.
--
-- Everything is created in current_schema() of the migrating connection, as
-- in 000004 to 000009.
DO $$
BEGIN
    IF pg_catalog.current_schema() IS NULL OR pg_catalog.current_schema() = 'pg_catalog' THEN
        RAISE EXCEPTION 'pgfence: migration 000010 needs the schema to install into first in search_path (current schema: %)',
            pg_catalog.current_schema();
    END IF;
END;
$$;

ALTER SEQUENCE pgfence_leases_fence_seq INCREMENT 1024 CACHE 1 NO CYCLE;

CREATE OR REPLACE FUNCTION pgfence_next_token() RETURNS bigint
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp -- re-pinned below with the install schema
AS $$
DECLARE
    token bigint;
BEGIN
    IF pg_catalog.current_setting('synchronous_commit') NOT IN ('on', 'remote_apply') THEN
        PERFORM pg_catalog.set_config('synchronous_commit', 'on', true);
    END IF;
    IF NOT EXISTS (
        SELECT FROM pg_catalog.pg_sequence s
        WHERE s.seqrelid = 'pgfence_leases_fence_seq'::pg_catalog.regclass
          AND s.seqincrement = 1024 AND s.seqcache = 1 AND NOT s.seqcycle
    ) THEN
        RAISE EXCEPTION 'pgfence: sequence pgfence_leases_fence_seq must be INCREMENT 1024 CACHE 1 NO CYCLE'
            USING ERRCODE = 'PF002',
                  HINT = 'As its owner: ALTER SEQUENCE pgfence_leases_fence_seq INCREMENT 1024 CACHE 1 NO CYCLE.';
    END IF;
    token := pg_catalog.nextval('pgfence_leases_fence_seq'::pg_catalog.regclass);
    -- Both positions are read after the draw: the record covering token
    -- ends at or before the insert position.
    IF pg_catalog.current_setting('synchronous_standby_names') <> ''
       OR pg_catalog.pg_current_wal_flush_lsn() OPERATOR(pg_catalog.<) pg_catalog.pg_current_wal_insert_lsn() THEN
        -- A WAL record of this transaction's own (and, through setval, a
        -- transaction id), so that its commit waits for the flush, and for
        -- synchronous standbys.
        PERFORM pg_catalog.setval('pgfence_token_flush_seq'::pg_catalog.regclass, 1, true);
    END IF;
    RETURN token;
END;
$$;

COMMENT ON FUNCTION pgfence_next_token() IS
    'Draws a fencing token from pgfence_leases_fence_seq (which must be INCREMENT 1024 CACHE 1 NO CYCLE, else PF002); the token is durable once the calling transaction commits (it writes WAL, so that the commit waits for the flush and for synchronous standbys, unless the WAL that covers the token is flushed already and no synchronous standby is named).';

CREATE OR REPLACE FUNCTION pgfence_next_tokens(wanted boolean[]) RETURNS bigint[]
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp -- re-pinned below with the install schema
AS $$
DECLARE
    tokens bigint[] := '{}';
    want boolean;
    base bigint;
    used integer := 1024; -- tokens handed out from base's block
BEGIN
    IF wanted IS NULL THEN
        RETURN NULL;
    END IF;
    IF pg_catalog.cardinality(wanted) OPERATOR(pg_catalog.>) 65536 THEN
        RAISE EXCEPTION 'pgfence: pgfence_next_tokens draws for at most 65536 positions, not %', pg_catalog.cardinality(wanted)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF pg_catalog.current_setting('synchronous_commit') NOT IN ('on', 'remote_apply') THEN
        PERFORM pg_catalog.set_config('synchronous_commit', 'on', true);
    END IF;
    IF NOT EXISTS (
        SELECT FROM pg_catalog.pg_sequence s
        WHERE s.seqrelid = 'pgfence_leases_fence_seq'::pg_catalog.regclass
          AND s.seqincrement = 1024 AND s.seqcache = 1 AND NOT s.seqcycle
    ) THEN
        RAISE EXCEPTION 'pgfence: sequence pgfence_leases_fence_seq must be INCREMENT 1024 CACHE 1 NO CYCLE'
            USING ERRCODE = 'PF002',
                  HINT = 'As its owner: ALTER SEQUENCE pgfence_leases_fence_seq INCREMENT 1024 CACHE 1 NO CYCLE.';
    END IF;
    -- One token per true position, in the order of the positions (every
    -- element, as unnest takes them): the tokens of one value's block in
    -- turn, a new value for each 1024.
    FOREACH want IN ARRAY wanted LOOP
        IF want THEN
            IF used OPERATOR(pg_catalog.=) 1024 THEN
                base := pg_catalog.nextval('pgfence_leases_fence_seq'::pg_catalog.regclass);
                used := 0;
            END IF;
            tokens := tokens OPERATOR(pg_catalog.||) (base OPERATOR(pg_catalog.+) used);
            used := used OPERATOR(pg_catalog.+) 1;
        ELSE
            tokens := tokens OPERATOR(pg_catalog.||) NULL::bigint;
        END IF;
    END LOOP;
    -- Both positions are read after the last draw: the record covering any
    -- of the tokens ends at or before the insert position.
    IF pg_catalog.current_setting('synchronous_standby_names') <> ''
       OR pg_catalog.pg_current_wal_flush_lsn() OPERATOR(pg_catalog.<) pg_catalog.pg_current_wal_insert_lsn() THEN
        PERFORM pg_catalog.setval('pgfence_token_flush_seq'::pg_catalog.regclass, 1, true);
    END IF;
    RETURN tokens;
END;
$$;

COMMENT ON FUNCTION pgfence_next_tokens(boolean[]) IS
    'Draws a fencing token for each true element of its argument (at most 65536 elements), in order, NULL elsewhere: consecutive tokens from one value of pgfence_leases_fence_seq per 1024; the checks and durability of pgfence_next_token, paid once per call.';

CREATE OR REPLACE FUNCTION pgfence_last_token() RETURNS bigint
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER
AS $$
BEGIN
    RETURN (SELECT CASE WHEN s.is_called THEN s.last_value OPERATOR(pg_catalog.+) 1023 ELSE s.last_value OPERATOR(pg_catalog.-) 1 END
            FROM pgfence_leases_fence_seq AS s);
END;
$$;

COMMENT ON FUNCTION pgfence_last_token() IS
    'The largest fencing token pgfence_leases_fence_seq may have handed out: the top of the last value''s block of 1024 (0 before the first); read by pgfence_guard_strict.';

CREATE OR REPLACE FUNCTION pgfence_schema_version() RETURNS integer
    LANGUAGE sql IMMUTABLE
AS $$ SELECT 10 $$;

COMMENT ON FUNCTION pgfence_schema_version() IS
    'The version of the pgfence schema installed here (the number of its last migration).';

SELECT pg_catalog.set_config('search_path',
    'pg_catalog, ' || pg_catalog.quote_ident(pg_catalog.current_schema()) || ', pg_temp', true);

ALTER FUNCTION pgfence_schema_version() SET search_path FROM CURRENT;
ALTER FUNCTION pgfence_next_token() SET search_path FROM CURRENT;
ALTER FUNCTION pgfence_next_tokens(boolean[]) SET search_path FROM CURRENT;
ALTER FUNCTION pgfence_last_token() SET search_path FROM CURRENT;

-- 000011_release_one.up.sql
SELECT pg_catalog.set_config('search_path', 'pgfence', true);
-- 000011: pgfence_release frees a single lease with one UPDATE.
--
-- Most release statements carry one lease (a lone holder, and every
-- hand-over from a holder to a waiter), and a hand-over waits for the
-- release's answer. 000003's statement handled them like any batch: an
-- UPDATE ... FROM unnest() under a CTE, read twice, joined laterally to
-- pg_notify and by a hash join to an aggregate that chose the durability.
-- On a hand-over of one lease between two Lockers (PostgreSQL 15, 2 cores,
-- fsync off so that only CPU counts) that statement took 0.085 ms of server
-- time (pg_stat_statements) against 0.014 ms for the same UPDATE and
-- pg_notify in plain SQL, and the hand-over took 0.53 ms at p50; with the
-- one-lease path below, 0.065 ms and 0.48 ms.
--
-- For one lease (each of the three arrays has one element) the function now
-- runs the UPDATE on the row alone, then, when it released the lease, sends
-- the notification and, when the row is freed (not kept held by at_least),
-- makes the commit skip the WAL flush, exactly as 000003's statement does:
-- same rows returned (the token, and 'off' or NULL), same notification, same
-- durability, same row lock and the same test of expiry
-- (clock_timestamp()). Every batch of more than one lease, and arrays of
-- unequal length, run 000003's statement unchanged. The signature, the
-- comment, the privileges and the settings (search_path pinned,
-- plan_cache_mode = force_generic_plan) are those of 000003.
--
-- Everything is created in current_schema() of the migrating connection, as
-- in 000004 to 000010.
DO $$
BEGIN
    IF pg_catalog.current_schema() IS NULL OR pg_catalog.current_schema() = 'pg_catalog' THEN
        RAISE EXCEPTION 'pgfence: migration 000011 needs the schema to install into first in search_path (current schema: %)',
            pg_catalog.current_schema();
    END IF;
END;
$$;

CREATE OR REPLACE FUNCTION pgfence_release(names text[], tokens bigint[], at_least_us bigint[], owner text)
    RETURNS TABLE(fence bigint, durability text)
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp -- re-pinned below with the install schema
AS $$
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
$$;

CREATE OR REPLACE FUNCTION pgfence_schema_version() RETURNS integer
    LANGUAGE sql IMMUTABLE
AS $$ SELECT 11 $$;

COMMENT ON FUNCTION pgfence_schema_version() IS
    'The version of the pgfence schema installed here (the number of its last migration).';

SELECT pg_catalog.set_config('search_path',
    'pg_catalog, ' || pg_catalog.quote_ident(pg_catalog.current_schema()) || ', pg_temp', true);

ALTER FUNCTION pgfence_schema_version() SET search_path FROM CURRENT;
ALTER FUNCTION pgfence_release(text[], bigint[], bigint[], text) SET search_path FROM CURRENT;
ALTER FUNCTION pgfence_release(text[], bigint[], bigint[], text) SET plan_cache_mode = force_generic_plan;
