-- pgfence baseline schema, version 1.
--
-- Everything is created in current_schema() of the migrating connection:
-- migrations.Up sets search_path to exactly the chosen schema; with the
-- migrate CLI, pass search_path=<schema> in the database URL. The role that
-- runs it owns every object, and the SECURITY DEFINER functions run as that
-- role; application roles get only what migrations.Grant gives them. Every
-- function's search_path is pinned at the end of this file to pg_catalog,
-- the install schema, pg_temp: built-ins resolve first, the caller's
-- temporary schema last, so no role that can create objects elsewhere on
-- the caller's search_path can redirect a call.

-- A second install in the same database would draw tokens from a second
-- sequence, and two holders of one name could present tokens from unrelated
-- sequences. Temporary tables are ignored: any role may create one.
DO $$
DECLARE
    here  text := pg_catalog.current_schema();
    other text;
BEGIN
    IF here IS NULL OR here = 'pg_catalog' THEN
        RAISE EXCEPTION 'pgfence: the schema to install into must come first in search_path (current schema: %)', here
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

CREATE TABLE pgfence_leases (
    name        text        NOT NULL,
    owner       text        NOT NULL,
    fence       bigserial   NOT NULL,
    acquired_at timestamptz NOT NULL DEFAULT pg_catalog.now(),
    expires_at  timestamptz NOT NULL,
    secret_hash bytea,
    CONSTRAINT pgfence_leases_pkey PRIMARY KEY (name),
    CONSTRAINT pgfence_leases_name_check CHECK (name <> '' AND pg_catalog.octet_length(name) <= 512),
    CONSTRAINT pgfence_leases_owner_check CHECK (owner <> '' AND pg_catalog.octet_length(owner) <= 512)
) WITH (
    -- Renewals and releases update rows in place and never change the
    -- indexed name: free space keeps those updates HOT. The table is small
    -- and churns, so vacuum it early.
    fillfactor = 75,
    autovacuum_vacuum_scale_factor = 0.05,
    autovacuum_vacuum_threshold = 100
);
COMMENT ON TABLE pgfence_leases IS
    'pgfence lease locks: one row per lock name; a lease is held while expires_at > now().';
COMMENT ON COLUMN pgfence_leases.fence IS
    'Fencing token of the current (or last) holder; drawn from pgfence_leases_fence_seq, never reused.';
COMMENT ON COLUMN pgfence_leases.secret_hash IS
    'SHA-256 of the secret returned to the acquiring call; renew, release, lease-held checks and proclaims must present the secret.';

-- The one source of fencing tokens, for both lock strategies. Each value
-- covers a block of 1024 consecutive tokens (pgfence_next_tokens); no cache,
-- which would issue tokens out of order across sessions, and no cycle, which
-- would repeat them. pgfence_next_token() refuses other settings (PF002).
ALTER SEQUENCE pgfence_leases_fence_seq INCREMENT 1024 CACHE 1 NO CYCLE;

-- pgfence_next_token() sets it only to write WAL of its own, so that the
-- drawing transaction's commit waits for the flush.
CREATE SEQUENCE pgfence_token_flush_seq MINVALUE 0 MAXVALUE 1 START 0 CACHE 1 NO CYCLE;
COMMENT ON SEQUENCE pgfence_token_flush_seq IS
    'pgfence: set by pgfence_next_token() on every draw, only to write WAL so that the drawing transaction commits durably; its value means nothing.';

-- Appended to by pgfence_force_release only.
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
COMMENT ON TABLE pgfence_forced_releases IS
    'pgfence audit log: one row per forced release (pgfence_force_release), never removed by pgfence.';

-- Written by pgfence_leader_proclaim only, which keeps the newest ten terms
-- of each election.
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
COMMENT ON TABLE pgfence_leaders IS
    'pgfence leader election: one row per term (newest ten per election), with the value its leader proclaimed.';

-- The key of notification payloads: a role that cannot read it learns
-- nothing from a notification and cannot forge one.
CREATE TABLE pgfence_notify_key (
    one boolean PRIMARY KEY DEFAULT true CHECK (one),
    key bytea   NOT NULL CHECK (pg_catalog.octet_length(key) = 32)
);
INSERT INTO pgfence_notify_key (key)
SELECT pg_catalog.decode(pg_catalog.replace(
    pg_catalog.gen_random_uuid()::text || pg_catalog.gen_random_uuid()::text, '-', ''), 'hex');
COMMENT ON TABLE pgfence_notify_key IS
    'pgfence: the key of the tags and MACs in notification payloads (tag:token:mac); readable by pgfence''s roles only.';

REVOKE ALL ON TABLE pgfence_leases, pgfence_forced_releases, pgfence_leaders FROM PUBLIC;
REVOKE ALL ON SEQUENCE pgfence_leases_fence_seq, pgfence_forced_releases_id_seq, pgfence_token_flush_seq FROM PUBLIC;

-- A token must be durable before its holder uses it. nextval() writes WAL
-- only once per 32 values, so a transaction that drew a token and wrote
-- nothing else would commit without waiting for the flush, and a crash or
-- failover could hand the token out again. When the WAL covering the token
-- may not be flushed yet, setval() on pgfence_token_flush_seq gives the
-- transaction a WAL record of its own, and synchronous_commit is raised to
-- on: its commit waits for the flush and for synchronous standbys.
-- SECURITY DEFINER: callers get no privilege on the sequence.
CREATE FUNCTION pgfence_next_token() RETURNS bigint
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
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

-- The checks and durability of pgfence_next_token, paid once for a batch.
CREATE FUNCTION pgfence_next_tokens(wanted boolean[]) RETURNS bigint[]
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
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
COMMENT ON FUNCTION pgfence_next_tokens(wanted boolean[]) IS
    'Draws a fencing token for each true element of its argument (at most 65536 elements), in order, NULL elsewhere: consecutive tokens from one value of pgfence_leases_fence_seq per 1024; the checks and durability of pgfence_next_token, paid once per call.';

-- Read by pgfence_guard_strict (as the writer) to refuse a token that was
-- never issued.
CREATE FUNCTION pgfence_last_token() RETURNS bigint
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RETURN (SELECT CASE WHEN s.is_called THEN s.last_value OPERATOR(pg_catalog.+) 1023 ELSE s.last_value OPERATOR(pg_catalog.-) 1 END
            FROM pgfence_leases_fence_seq AS s);
END;
$$;
COMMENT ON FUNCTION pgfence_last_token() IS
    'The largest fencing token pgfence_leases_fence_seq may have handed out: the top of the last value''s block of 1024 (0 before the first); read by pgfence_guard_strict.';

CREATE FUNCTION pgfence_schema_version() RETURNS integer
    LANGUAGE sql IMMUTABLE
    SET search_path = pg_catalog, pg_temp
AS $$ SELECT 1 $$;
COMMENT ON FUNCTION pgfence_schema_version() IS
    'The version of the pgfence schema installed here (the number of its last migration).';

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

-- The payload announcing that lease name with token was released (or, on
-- pgfence_leader, proclaimed):
--   tag = hex of the first 16 bytes of sha256(key || 0x01 || name)
--   mac = hex of the first 16 bytes of sha256(key || sha256(key || 0x02 || tag ':' token))
CREATE FUNCTION pgfence_notify_payload(name text, token bigint) RETURNS text
    LANGUAGE plpgsql STABLE
    SET search_path = pg_catalog, pg_temp
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

-- Each name is first claimed with a transaction-scoped try-lock, and expired
-- rows are locked SKIP LOCKED: a name another transaction is taking answers
-- busy at once instead of waiting. Rows are inserted or locked in name
-- order, so two batches cannot deadlock. A token is drawn only for a name
-- that is free, so a failed attempt draws none. The secret (two v4 UUIDs:
-- 244 random bits) is returned only to this call; the row keeps its SHA-256.
-- force_generic_plan: a generic plan cannot know an array's length and would
-- otherwise lose to a fresh custom plan on every call, for the same shape.
CREATE FUNCTION pgfence_acquire(names text[], new_owner text, ttl_us bigint[])
    RETURNS TABLE(acquired boolean, name text, owner text, fence bigint, acquired_at timestamptz, expires_at timestamptz, db_now timestamptz, secret text)
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
    SET plan_cache_mode = force_generic_plan
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
COMMENT ON FUNCTION pgfence_acquire(names text[], new_owner text, ttl_us bigint[]) IS
    'Takes each free or expired lease of a batch with a fresh token and secret; returns one row per name: the new lease with its secret, the current holder, or (owner NULL) busy: claimed or locked by another transaction.';

-- clock_timestamp(), not now(): the statement may wait for a row lock and
-- must judge expiry when it gets the row; an expired lease is never revived.
-- A row another transaction has locked is skipped (renewed false), so it
-- never delays the rest of the batch. A renewal's commit waits for the
-- flush and for synchronous standbys, as a token draw's does: a renewal
-- lost in a crash or failover after its holder was told would let another
-- client take a lease its holder still believes it holds.
CREATE FUNCTION pgfence_renew(names text[], tokens bigint[], secrets text[], ttl_us bigint[])
    RETURNS TABLE(fence bigint, renewed boolean)
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
    SET plan_cache_mode = force_generic_plan
AS $$
#variable_conflict use_column
BEGIN
    PERFORM pgfence_check_us($4, 1, 'a TTL');
    IF pg_catalog.current_setting('synchronous_commit') NOT IN ('on', 'remote_apply') THEN
        PERFORM pg_catalog.set_config('synchronous_commit', 'on', true);
    END IF;
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
COMMENT ON FUNCTION pgfence_renew(names text[], tokens bigint[], secrets text[], ttl_us bigint[]) IS
    'Extends each lease of a batch still held with its token and secret (never revives an expired one); a row locked by another transaction is skipped and returned with renewed = false.';

-- Rows are expired in place, never deleted. When every released row is free
-- at once, the transaction commits with synchronous_commit off: its
-- notifications take a database-wide lock at commit, and waiting for the
-- flush under it would serialise releases behind the disk. Losing such a
-- release in a crash only keeps the lease until its TTL; whoever takes the
-- row next commits durably. The durability column must be selected, or the
-- planner removes the join that sets it.
CREATE FUNCTION pgfence_release(names text[], tokens bigint[], secrets text[], at_least_us bigint[])
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
COMMENT ON FUNCTION pgfence_release(names text[], tokens bigint[], secrets text[], at_least_us bigint[]) IS
    'Releases each lease of a batch still held with its token and secret; notifies pgfence_lease_released (tag:token:mac) for each one.';

-- Locks the row FOR SHARE until the caller's transaction ends: a takeover
-- or release in flight is waited for, and one that starts later waits.
CREATE FUNCTION pgfence_lease_held(name text, token bigint, secret text) RETURNS boolean
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
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
COMMENT ON FUNCTION pgfence_lease_held(name text, token bigint, secret text) IS
    'True iff the lease is held with the token and secret (database clock); locks its row FOR SHARE for the calling transaction.';

-- vxids lists the transactions holding RowExclusiveLock on pgfence_leases:
-- every statement that puts a token into the table holds it from before it
-- draws the token until it commits, and prune waits for them. The age must
-- reach a minute into the past however the interval is written
-- ('-1 year 360 days' compares as zero).
CREATE FUNCTION pgfence_prune_scan(after text, page integer, older_than interval)
    RETURNS TABLE(last_name text, page_rows bigint, names text[], tokens bigint[], vxids text[])
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
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
COMMENT ON FUNCTION pgfence_prune_scan(after text, page integer, older_than interval) IS
    'Prune: reads one page of pgfence_leases and lists its long-expired rows and the transactions writing the table.';

-- SKIP LOCKED: a row a lease-checked write holds FOR SHARE, or a takeover
-- in flight, is left for a later prune, which never waits.
CREATE FUNCTION pgfence_prune_delete(names text[], tokens bigint[], older_than interval) RETURNS bigint
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
    SET plan_cache_mode = force_generic_plan
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
COMMENT ON FUNCTION pgfence_prune_delete(names text[], tokens bigint[], older_than interval) IS
    'Prune: deletes the listed long-expired rows whose token is unchanged, skipping rows another transaction has locked.';

-- The fresh token fences the old holder out; pgfence_next_token() makes the
-- commit durable, so it is never reissued after a crash.
CREATE FUNCTION pgfence_force_release(name text, reason text)
    RETURNS TABLE(old_owner text, old_token bigint, was_held boolean, token bigint)
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
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
COMMENT ON FUNCTION pgfence_force_release(name text, reason text) IS
    'Ends a lease whoever holds it (fresh token, expired now), records it in pgfence_forced_releases and notifies waiters.';

-- The lease row is locked FOR SHARE, so no takeover commits between the
-- check and the write. A proclaim in a transaction that wrote nothing before
-- commits with synchronous_commit off: losing one in a crash only makes the
-- term look unproclaimed, and a token drawn in the same transaction keeps
-- its durability.
CREATE FUNCTION pgfence_leader_proclaim(name text, token bigint, secret text, value text) RETURNS boolean
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
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
COMMENT ON FUNCTION pgfence_leader_proclaim(name text, token bigint, secret text, value text) IS
    'Records the value a term proclaims if its lease is held (name, token, secret), keeps the newest ten terms, notifies pgfence_leader (tag:token:mac).';

-- The default guard: an UPDATE may not move the column (fence_token unless
-- the trigger names another) backwards or to NULL; a DELETE is checked
-- against pgfence.token when one is presented. Rejections are PF001.
CREATE FUNCTION pgfence_guard() RETURNS trigger
    LANGUAGE plpgsql
    SET search_path = pg_catalog, pg_temp
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

-- The strict guard: every UPDATE and DELETE presents a token (the column's
-- new value, or pgfence.token) at least the row's and no newer than the last
-- issued. It runs as the writer, who needs EXECUTE on pgfence_last_token
-- only when presenting a newer token. The DELETE half of a row moving to
-- another partition presents what its UPDATE half presented
-- (pgfence.moving). The table's owner in pgfence_maintenance is not checked.
CREATE FUNCTION pgfence_guard_strict() RETURNS trigger
    LANGUAGE plpgsql
    SET search_path = pg_catalog, pg_temp
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
    from_col  boolean := false;
    move_key  text;
BEGIN
    IF TG_WHEN <> 'BEFORE' OR TG_LEVEL <> 'ROW' OR TG_OP NOT IN ('UPDATE', 'DELETE') THEN
        RAISE EXCEPTION 'pgfence_guard_strict: attach it BEFORE UPDATE OR DELETE ... FOR EACH ROW, not % % FOR EACH %',
                TG_WHEN, TG_OP, TG_LEVEL
            USING ERRCODE = 'trigger_protocol_violated';
    END IF;
    setting := pg_catalog.current_setting('pgfence.maintenance'::text, true);
    IF setting IS NOT NULL AND setting <> ''::text
       AND TG_RELID::text = ANY (pg_catalog.string_to_array(setting, ' '))
       AND pg_catalog.pg_has_role((SELECT c.relowner FROM pg_catalog.pg_class c WHERE c.oid = TG_RELID), 'USAGE') THEN
        IF TG_OP = 'DELETE' THEN
            RETURN OLD;
        END IF;
        RETURN NEW;
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
        from_col := true;
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
        ELSIF TG_OP = 'DELETE' THEN
            -- The DELETE half of a move to another partition presents what
            -- its UPDATE half presented.
            setting := pg_catalog.current_setting('pgfence.moving'::text, true);
            move_key := pg_catalog.format('%s/%s/%s/', TG_RELID, pg_catalog.statement_timestamp(), pg_catalog.md5(OLD::text));
            IF setting IS NOT NULL AND pg_catalog.starts_with(setting, move_key)
               AND pg_catalog.substr(setting, pg_catalog.length(move_key) + 1) ~ '^[0-9]{1,18}$'::text THEN
                presented := pg_catalog.substr(setting, pg_catalog.length(move_key) + 1)::bigint;
                PERFORM pg_catalog.set_config('pgfence.moving', '', true);
            END IF;
        END IF;
    END IF;

    IF from_col AND presented IS NULL THEN
        RAISE EXCEPTION 'pgfence: UPDATE on %.% sets the fencing token to NULL (current %)',
                TG_TABLE_SCHEMA, TG_TABLE_NAME, old_token
            USING ERRCODE = 'PF001',
                  DETAIL = pg_catalog.format('presented= current=%s', old_token),
                  HINT = 'Present a token at least the row''s; the guard column may not move backwards or to NULL.';
    END IF;
    IF presented IS NULL THEN
        RAISE EXCEPTION 'pgfence: % on %.% presents no fencing token (strict mode; current %)',
                TG_OP, TG_TABLE_SCHEMA, TG_TABLE_NAME, old_token
            USING ERRCODE = 'PF004',
                  DETAIL = pg_catalog.format('presented= current=%s', old_token),
                  HINT = pg_catalog.format('Call %s.pgfence_present(token) (in Go: fence.Present) in the transaction before writing.',
                      pg_catalog.quote_ident((pg_catalog.current_schemas(false))[2]));
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
    IF from_col AND (SELECT c.relispartition FROM pg_catalog.pg_class c WHERE c.oid = TG_RELID) THEN
        PERFORM pg_catalog.set_config('pgfence.moving', pg_catalog.format('%s/%s/%s/%s',
            TG_RELID, pg_catalog.statement_timestamp(), pg_catalog.md5(OLD::text), presented), true);
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
COMMENT ON FUNCTION pgfence_guard_strict() IS
    'Trigger (strict mode): every UPDATE and DELETE must present a fencing token >= the row''s, else SQLSTATE PF001.';

CREATE FUNCTION pgfence_guard_truncate() RETURNS trigger
    LANGUAGE plpgsql
    SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    setting text;
BEGIN
    IF TG_OP <> 'TRUNCATE' THEN
        RAISE EXCEPTION 'pgfence_guard_truncate: attach it BEFORE TRUNCATE ... FOR EACH STATEMENT, not % % FOR EACH %',
                TG_WHEN, TG_OP, TG_LEVEL
            USING ERRCODE = 'trigger_protocol_violated';
    END IF;
    setting := pg_catalog.current_setting('pgfence.maintenance'::text, true);
    IF setting IS NOT NULL AND setting <> ''::text
       AND TG_RELID::text = ANY (pg_catalog.string_to_array(setting, ' '))
       AND pg_catalog.pg_has_role((SELECT c.relowner FROM pg_catalog.pg_class c WHERE c.oid = TG_RELID), 'USAGE') THEN
        RETURN NULL;
    END IF;
    RAISE EXCEPTION 'pgfence: TRUNCATE of fenced table %.% is not allowed', TG_TABLE_SCHEMA, TG_TABLE_NAME
        USING ERRCODE = 'PF001',
              DETAIL = 'presented= current=',
              HINT = 'Delete rows with a fencing token, or, as the table''s owner, call pgfence_maintenance(table) first.';
END;
$$;
COMMENT ON FUNCTION pgfence_guard_truncate() IS
    'Trigger (BEFORE TRUNCATE): rejects TRUNCATE of a fenced table with SQLSTATE PF001.';

CREATE FUNCTION pgfence_present(token bigint) RETURNS void
    LANGUAGE plpgsql
    SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF token IS NULL OR token OPERATOR(pg_catalog.<=) 0 THEN
        RAISE EXCEPTION 'pgfence: fencing token % is not positive; tokens come from pgfence_next_token()', token
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    PERFORM pg_catalog.set_config('pgfence.token', token::pg_catalog.text, true);
END;
$$;
COMMENT ON FUNCTION pgfence_present(token bigint) IS
    'Presents a fencing token to the pgfence_guard triggers: sets pgfence.token until the transaction ends.';

-- Setting pgfence.maintenance by hand gives nothing: the triggers honour it
-- only for a writer with the privileges of the written table's owner.
CREATE FUNCTION pgfence_maintenance(tbl regclass) RETURNS void
    LANGUAGE plpgsql
    SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    owner_oid pg_catalog.oid;
    rels      pg_catalog.text;
BEGIN
    SELECT c.relowner INTO owner_oid FROM pg_catalog.pg_class c WHERE c.oid OPERATOR(pg_catalog.=) tbl;
    IF owner_oid IS NULL THEN
        RAISE EXCEPTION 'pgfence: no table %', tbl USING ERRCODE = 'undefined_table';
    END IF;
    IF NOT pg_catalog.pg_has_role(owner_oid, 'USAGE') THEN
        RAISE EXCEPTION 'pgfence: only the owner of % may write it without fencing tokens', tbl
            USING ERRCODE = 'insufficient_privilege',
                  HINT = 'Run the maintenance as the table''s owner; application roles present tokens.';
    END IF;
    WITH RECURSIVE tree(rel) AS (
        SELECT tbl::pg_catalog.oid
        UNION
        SELECT i.inhrelid FROM pg_catalog.pg_inherits i JOIN tree t ON i.inhparent OPERATOR(pg_catalog.=) t.rel
    )
    SELECT pg_catalog.string_agg(t.rel::pg_catalog.text, ' ') INTO rels FROM tree t;
    PERFORM pg_catalog.set_config('pgfence.maintenance', pg_catalog.concat_ws(' ',
        NULLIF(pg_catalog.current_setting('pgfence.maintenance', true), ''), rels), true);
    RAISE LOG 'pgfence: % writes % without fencing tokens until its transaction ends', current_user, tbl;
END;
$$;
COMMENT ON FUNCTION pgfence_maintenance(tbl regclass) IS
    'For the table''s owner only: its writes to the table and its descendants skip the strict guard until the transaction ends.';

-- Triggers fire in name order: a BEFORE UPDATE row trigger sorting before
-- pgfence_guard that may write the column (its function names the column,
-- rewrites NEW generically, or is not SQL or PL/pgSQL) would decide the
-- token the guard checks, so it is refused (PF005); one firing after draws
-- a warning. Runs as the caller, who must be able to create the triggers.
CREATE FUNCTION pgfence_protect(tbl regclass, col name, strict boolean) RETURNS void
    LANGUAGE plpgsql
    SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    kind   "char";
    typ    pg_catalog.oid;
    rel    pg_catalog.regclass;
    bad    record;
    schema pg_catalog.text := (pg_catalog.current_schemas(false))[2];
BEGIN
    SELECT c.relkind INTO kind FROM pg_catalog.pg_class c WHERE c.oid OPERATOR(pg_catalog.=) tbl;
    IF kind IS NULL OR kind NOT IN ('r', 'p') THEN
        RAISE EXCEPTION 'pgfence: % is not a table: the guard protects tables and partitioned tables only', tbl
            USING ERRCODE = 'PF005';
    END IF;
    SELECT a.atttypid INTO typ FROM pg_catalog.pg_attribute a
    WHERE a.attrelid OPERATOR(pg_catalog.=) tbl AND a.attname OPERATOR(pg_catalog.=) col AND a.attnum OPERATOR(pg_catalog.>) 0 AND NOT a.attisdropped;
    IF typ IS DISTINCT FROM 'pg_catalog.int8'::pg_catalog.regtype THEN
        RAISE EXCEPTION 'pgfence: % has no bigint column %', tbl, pg_catalog.quote_ident(col)
            USING ERRCODE = 'PF005';
    END IF;
    FOR bad IN
        WITH RECURSIVE tree(rel) AS (
            SELECT tbl::pg_catalog.oid
            UNION
            SELECT i.inhrelid FROM pg_catalog.pg_inherits i JOIN tree t ON i.inhparent OPERATOR(pg_catalog.=) t.rel
        )
        SELECT t.tgrelid::pg_catalog.regclass AS rel, t.tgname,
               t.tgname::pg_catalog.text COLLATE "C" OPERATOR(pg_catalog.<) 'pgfence_guard' AS first
        FROM pg_catalog.pg_trigger t
        JOIN tree r ON r.rel OPERATOR(pg_catalog.=) t.tgrelid
        JOIN pg_catalog.pg_proc p ON p.oid OPERATOR(pg_catalog.=) t.tgfoid
        JOIN pg_catalog.pg_language l ON l.oid OPERATOR(pg_catalog.=) p.prolang
        WHERE NOT t.tgisinternal AND t.tgname OPERATOR(pg_catalog.<>) 'pgfence_guard'
          AND (t.tgtype::pg_catalog.int4 OPERATOR(pg_catalog.&) 1) OPERATOR(pg_catalog.=) 1     -- ROW
          AND (t.tgtype::pg_catalog.int4 OPERATOR(pg_catalog.&) 2) OPERATOR(pg_catalog.=) 2     -- BEFORE
          AND (t.tgtype::pg_catalog.int4 OPERATOR(pg_catalog.&) 16) OPERATOR(pg_catalog.=) 16   -- UPDATE
          AND p.proname::pg_catalog.text NOT IN ('pgfence_guard', 'pgfence_guard_strict')
          AND (l.lanname NOT IN ('plpgsql', 'sql')
               OR p.prosrc OPERATOR(pg_catalog.~*) ('\m' OPERATOR(pg_catalog.||) pg_catalog.regexp_replace(col::pg_catalog.text, '([^[:alnum:]_])', '\\\1', 'g') OPERATOR(pg_catalog.||) '\M')
               OR p.prosrc OPERATOR(pg_catalog.~*) 'populate_record|#='::pg_catalog.text)
        ORDER BY 3 DESC, 1, 2
    LOOP
        IF bad.first THEN
            RAISE EXCEPTION 'pgfence: trigger % on % fires before pgfence_guard and may write column %', pg_catalog.quote_ident(bad.tgname), bad.rel, pg_catalog.quote_ident(col)
                USING ERRCODE = 'PF005',
                      HINT = 'A BEFORE trigger that writes the guard column before the guard checks it decides the token a write presents: rename it to sort after pgfence_guard, or change it not to write the column.';
        END IF;
        RAISE WARNING 'pgfence: trigger % on % fires after pgfence_guard and may write column %: the row may not keep the token the guard checked', pg_catalog.quote_ident(bad.tgname), bad.rel, pg_catalog.quote_ident(col);
    END LOOP;
    FOR rel IN
        WITH RECURSIVE tree(rel, depth) AS (
            SELECT tbl::pg_catalog.oid, 0
            UNION
            SELECT i.inhrelid, t.depth OPERATOR(pg_catalog.+) 1 FROM pg_catalog.pg_inherits i JOIN tree t ON i.inhparent OPERATOR(pg_catalog.=) t.rel
        )
        SELECT t.rel::pg_catalog.regclass FROM tree t ORDER BY t.depth
    LOOP
        IF rel OPERATOR(pg_catalog.=) tbl OR kind OPERATOR(pg_catalog.=) 'r' THEN
            IF EXISTS (SELECT FROM pg_catalog.pg_trigger t WHERE t.tgrelid OPERATOR(pg_catalog.=) rel AND t.tgname OPERATOR(pg_catalog.=) 'pgfence_guard') THEN
                EXECUTE pg_catalog.format('DROP TRIGGER pgfence_guard ON %s', rel);
            END IF;
            EXECUTE pg_catalog.format('CREATE TRIGGER pgfence_guard BEFORE UPDATE OR DELETE ON %s FOR EACH ROW EXECUTE FUNCTION %I.%I(%L)',
                rel, schema, CASE WHEN strict THEN 'pgfence_guard_strict' ELSE 'pgfence_guard' END, col);
        END IF;
        IF EXISTS (SELECT FROM pg_catalog.pg_trigger t WHERE t.tgrelid OPERATOR(pg_catalog.=) rel AND t.tgname OPERATOR(pg_catalog.=) 'pgfence_guard_truncate') THEN
            EXECUTE pg_catalog.format('DROP TRIGGER pgfence_guard_truncate ON %s', rel);
        END IF;
        IF strict THEN
            EXECUTE pg_catalog.format('CREATE TRIGGER pgfence_guard_truncate BEFORE TRUNCATE ON %s FOR EACH STATEMENT EXECUTE FUNCTION %I.pgfence_guard_truncate()',
                rel, schema);
        END IF;
        IF rel OPERATOR(pg_catalog.<>) tbl THEN
            RAISE NOTICE 'pgfence: % protected too (a descendant of %); run pgfence_protect again after adding one', rel, tbl;
        END IF;
    END LOOP;
END;
$$;
COMMENT ON FUNCTION pgfence_protect(tbl regclass, col name, strict boolean) IS
    'Attaches pgfence''s guard (strict or default mode) to a table and its descendants, refusing (PF005) a placement where it cannot protect.';

-- Pin the search_path of each function created above to pg_catalog, the
-- install schema, pg_temp (the schema is only known now), and take EXECUTE
-- from PUBLIC: no role but the owner calls pgfence's functions until
-- migrations.Grant.
DO $$
DECLARE
    s text := pg_catalog.quote_ident(pg_catalog.current_schema());
    f pg_catalog.regprocedure;
BEGIN
    FOR f IN
        SELECT p.oid FROM pg_catalog.pg_proc p
        WHERE p.pronamespace = s::pg_catalog.regnamespace AND p.proname ~ '^pgfence_'
          AND pg_catalog.pg_get_userbyid(p.proowner) = current_user
    LOOP
        EXECUTE pg_catalog.format('ALTER FUNCTION %s SET search_path = pg_catalog, %s, pg_temp', f, s);
        EXECUTE pg_catalog.format('REVOKE ALL ON FUNCTION %s FROM PUBLIC', f);
    END LOOP;
END;
$$;
