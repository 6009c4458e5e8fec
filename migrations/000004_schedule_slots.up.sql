-- pgfence schema version 4: schedule slots.
--
-- One row per (job, slot) that was started: who runs or ran it, with which
-- lease token, and how it ended. Written only by pgfence_slot_begin and
-- pgfence_slot_finish, both under the job's lease
-- ('pgfence:schedule:' || job), checked with its token and secret on the
-- database clock, as pgfence_lease_held does.

CREATE TABLE pgfence_slots (
    job         text        NOT NULL,
    slot        text        NOT NULL,
    state       text        NOT NULL,
    owner       text        NOT NULL,
    token       bigint      NOT NULL,
    attempts    integer     NOT NULL,
    started_at  timestamptz NOT NULL,
    finished_at timestamptz,
    error       text,
    CONSTRAINT pgfence_slots_pkey PRIMARY KEY (job, slot),
    CONSTRAINT pgfence_slots_job_check CHECK (job <> '' AND pg_catalog.octet_length(job) <= 256),
    CONSTRAINT pgfence_slots_slot_check CHECK (slot <> '' AND pg_catalog.octet_length(slot) <= 256),
    CONSTRAINT pgfence_slots_state_check CHECK (state IN ('running', 'done', 'failed')),
    CONSTRAINT pgfence_slots_error_check CHECK (pg_catalog.octet_length(error) <= 1024)
);
CREATE INDEX pgfence_slots_recent ON pgfence_slots (job, started_at DESC);
COMMENT ON TABLE pgfence_slots IS
    'pgfence schedule slots: one row per started (job, slot); state running, done or failed; written under the job''s lease only.';
REVOKE ALL ON TABLE pgfence_slots FROM PUBLIC;

-- Starts a slot under the job's lease, whose row stays locked FOR SHARE
-- until the caller's transaction ends. outcome is
--   run     started: new, or begun again by the same token
--   retry   started again: it was running under an older token (its holder
--           died or lost the lease) or had failed; prev_* describe that run
--   done    not started: it is done (by prev_owner, prev_token)
--   lost    not started: the lease is not held with this token and secret
--   fenced  not started: a newer token has started it
CREATE FUNCTION pgfence_slot_begin(job text, slot text, token bigint, secret text)
    RETURNS TABLE(outcome text, attempts integer, prev_state text, prev_owner text, prev_token bigint,
                  prev_started_at timestamptz, prev_finished_at timestamptz)
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    who text;
    cur record;
BEGIN
    SELECT l.owner INTO who FROM pgfence_leases l
    WHERE l.name = 'pgfence:schedule:' OPERATOR(pg_catalog.||) $1 AND l.fence = $3
      AND l.secret_hash = pg_catalog.sha256(pg_catalog.convert_to($4, 'UTF8'))
      AND l.expires_at > pg_catalog.clock_timestamp()
    FOR SHARE;
    IF NOT FOUND THEN
        RETURN QUERY SELECT 'lost'::text, NULL::integer, NULL::text, NULL::text, NULL::bigint, NULL::timestamptz, NULL::timestamptz;
        RETURN;
    END IF;
    SELECT s.state, s.owner, s.token, s.attempts, s.started_at, s.finished_at INTO cur
    FROM pgfence_slots s WHERE s.job = $1 AND s.slot = $2
    FOR UPDATE;
    IF NOT FOUND THEN
        INSERT INTO pgfence_slots AS s (job, slot, state, owner, token, attempts, started_at)
        VALUES ($1, $2, 'running', who, $3, 1, pg_catalog.clock_timestamp());
        RETURN QUERY SELECT 'run'::text, 1, NULL::text, NULL::text, NULL::bigint, NULL::timestamptz, NULL::timestamptz;
        RETURN;
    END IF;
    IF cur.state = 'done' THEN
        RETURN QUERY SELECT 'done'::text, cur.attempts, cur.state, cur.owner, cur.token, cur.started_at, cur.finished_at;
        RETURN;
    END IF;
    IF cur.token OPERATOR(pg_catalog.=) $3 AND cur.state = 'running' THEN
        RETURN QUERY SELECT 'run'::text, cur.attempts, NULL::text, NULL::text, NULL::bigint, NULL::timestamptz, NULL::timestamptz;
        RETURN;
    END IF;
    IF cur.token OPERATOR(pg_catalog.>=) $3 THEN
        RETURN QUERY SELECT 'fenced'::text, cur.attempts, cur.state, cur.owner, cur.token, cur.started_at, cur.finished_at;
        RETURN;
    END IF;
    UPDATE pgfence_slots AS s
    SET state = 'running', owner = who, token = $3, attempts = s.attempts OPERATOR(pg_catalog.+) 1,
        started_at = pg_catalog.clock_timestamp(), finished_at = NULL, error = NULL
    WHERE s.job = $1 AND s.slot = $2;
    RETURN QUERY SELECT 'retry'::text, cur.attempts OPERATOR(pg_catalog.+) 1, cur.state, cur.owner, cur.token, cur.started_at, cur.finished_at;
END;
$$;
COMMENT ON FUNCTION pgfence_slot_begin(job text, slot text, token bigint, secret text) IS
    'Starts (job, slot) under the lease pgfence:schedule:<job> held with token and secret, unless it is done or started by a newer token; returns run, retry, done, lost or fenced.';

-- Ends a slot started with token, as done or failed, if the job's lease is
-- still held with token and secret: the lease row stays locked FOR SHARE
-- until the caller's transaction ends, so no takeover commits before it.
-- Called in the job's own transaction, the slot is done exactly when the
-- job's writes commit. The commit waits for the flush and for synchronous
-- standbys, as a renewal's does: a done slot lost in a crash would run again.
CREATE FUNCTION pgfence_slot_finish(job text, slot text, token bigint, secret text, outcome text, error text)
    RETURNS boolean
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
BEGIN
    IF $5 IS NULL OR $5 NOT IN ('done', 'failed') THEN
        RAISE EXCEPTION 'pgfence: a slot finishes done or failed, not %', $5
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    PERFORM 1 FROM pgfence_leases l
    WHERE l.name = 'pgfence:schedule:' OPERATOR(pg_catalog.||) $1 AND l.fence = $3
      AND l.secret_hash = pg_catalog.sha256(pg_catalog.convert_to($4, 'UTF8'))
      AND l.expires_at > pg_catalog.clock_timestamp()
    FOR SHARE;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    IF pg_catalog.current_setting('synchronous_commit') NOT IN ('on', 'remote_apply') THEN
        PERFORM pg_catalog.set_config('synchronous_commit', 'on', true);
    END IF;
    UPDATE pgfence_slots AS s
    SET state = $5, finished_at = pg_catalog.clock_timestamp(),
        error = CASE WHEN $5 = 'failed' THEN pg_catalog.left(coalesce($6, ''), 1024) END
    WHERE s.job = $1 AND s.slot = $2 AND s.token = $3 AND s.state = 'running';
    RETURN FOUND;
END;
$$;
COMMENT ON FUNCTION pgfence_slot_finish(job text, slot text, token bigint, secret text, outcome text, error text) IS
    'Ends (job, slot) as done or failed if it runs under token and the lease pgfence:schedule:<job> is still held with token and secret; returns false otherwise.';

-- Deletes the finished slots of every job that finished before now() -
-- older_than (at least a day): a slot asked for again after its row is
-- gone runs again.
CREATE FUNCTION pgfence_slots_prune(older_than interval) RETURNS bigint
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    deleted bigint;
BEGIN
    IF $1 IS NULL OR pg_catalog.now() - $1 > pg_catalog.now() - interval '1 day' THEN
        RAISE EXCEPTION 'pgfence: slots prune: older_than must reach at least a day into the past (got %)', $1
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    DELETE FROM pgfence_slots s
    WHERE s.state <> 'running' AND s.finished_at < pg_catalog.now() - $1;
    GET DIAGNOSTICS deleted = ROW_COUNT;
    RETURN deleted;
END;
$$;
COMMENT ON FUNCTION pgfence_slots_prune(older_than interval) IS
    'Deletes finished schedule slots that finished more than older_than (at least a day) ago; returns how many.';

CREATE OR REPLACE FUNCTION pgfence_schema_version() RETURNS integer
    LANGUAGE sql IMMUTABLE
    SET search_path = pg_catalog, pg_temp
AS $$ SELECT 4 $$;

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
          AND p.proname IN ('pgfence_slot_begin', 'pgfence_slot_finish', 'pgfence_slots_prune', 'pgfence_schema_version')
    LOOP
        EXECUTE pg_catalog.format('ALTER FUNCTION %s SET search_path = pg_catalog, %s, pg_temp', f, s);
        EXECUTE pg_catalog.format('REVOKE ALL ON FUNCTION %s FROM PUBLIC', f);
    END LOOP;
END;
$$;
