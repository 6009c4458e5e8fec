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
