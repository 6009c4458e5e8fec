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
