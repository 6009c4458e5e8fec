-- Gives back version 5: drops the line-aware pgfence_acquire_permit, gives
-- pgfence_notify_waiters its version 2 body (plan_cache_mode reset) and the
-- permit trigger of version 5 back, which notifies every permit release.
DROP FUNCTION IF EXISTS pgfence_acquire_permit(text, integer, text, bigint, boolean);
ALTER FUNCTION pgfence_acquire_permit(text, integer, text, bigint) RESET plan_cache_mode;
ALTER FUNCTION pgfence_notify_waiters(text, bigint) RESET plan_cache_mode;
CREATE OR REPLACE FUNCTION pgfence_notify_waiters(name text, token bigint) RETURNS boolean
    LANGUAGE plpgsql VOLATILE
    SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    h bytea;
BEGIN
    SELECT pg_catalog.sha256(n.key OPERATOR(pg_catalog.||) '\x01'::bytea OPERATOR(pg_catalog.||) pg_catalog.convert_to($1, 'UTF8'))
    INTO STRICT h FROM pgfence_notify_key n;
    IF pg_catalog.pg_try_advisory_xact_lock(1885824620,
           (pg_catalog.get_byte(h, 0) OPERATOR(pg_catalog.<<) 24) OPERATOR(pg_catalog.|)
           (pg_catalog.get_byte(h, 1) OPERATOR(pg_catalog.<<) 16) OPERATOR(pg_catalog.|)
           (pg_catalog.get_byte(h, 2) OPERATOR(pg_catalog.<<) 8) OPERATOR(pg_catalog.|)
           pg_catalog.get_byte(h, 3)) THEN
        RETURN false;
    END IF;
    PERFORM pg_catalog.pg_notify('pgfence_lease_released', pgfence_notify_payload($1, $2));
    RETURN true;
END;
$$;
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
DO $$
DECLARE
    s text := pg_catalog.quote_ident(pg_catalog.current_schema());
    f text;
BEGIN
    FOREACH f IN ARRAY ARRAY['pgfence_notify_waiters(text, bigint)', 'pgfence_permit_released()', 'pgfence_schema_version()']
    LOOP
        EXECUTE pg_catalog.format('ALTER FUNCTION %s.%s SET search_path = pg_catalog, %s, pg_temp', s, f, s);
    END LOOP;
    EXECUTE pg_catalog.format('REVOKE ALL ON FUNCTION %s.pgfence_permit_released() FROM PUBLIC', s);
END;
$$;
