-- Reverts 000003 to exactly what 000002 left: the functions and the audit
-- table it added are dropped (with every grant on them), pgfence_next_token
-- gets its 000001 body back (SECURITY INVOKER, no pinned search_path), and
-- pgfence_guard loses its pinned search_path. EXECUTE on both is given back
-- to PUBLIC, as PostgreSQL does by default for a new function. The sequence
-- keeps INCREMENT 1 CACHE 1 NO CYCLE, which is what 000001 created.
DROP FUNCTION IF EXISTS pgfence_force_release(text, text);
DROP FUNCTION IF EXISTS pgfence_prune_delete(text[], bigint[], interval);
DROP FUNCTION IF EXISTS pgfence_prune_scan(text, integer, interval);
DROP FUNCTION IF EXISTS pgfence_lease_held(text, bigint);
DROP FUNCTION IF EXISTS pgfence_renew(text[], bigint[], bigint[]);
DROP FUNCTION IF EXISTS pgfence_release(text[], bigint[], bigint[], text);
DROP FUNCTION IF EXISTS pgfence_acquire(text[], text, bigint[]);
DROP FUNCTION IF EXISTS pgfence_schema_version();
-- Dropping the table drops its owned sequence pgfence_forced_releases_id_seq.
DROP TABLE IF EXISTS pgfence_forced_releases;

CREATE OR REPLACE FUNCTION pgfence_next_token() RETURNS bigint
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

ALTER FUNCTION pgfence_guard() RESET search_path;

GRANT EXECUTE ON FUNCTION pgfence_next_token(), pgfence_guard() TO PUBLIC;
