-- Gives back version 5: drops the line-aware pgfence_acquire_permit and
-- restores version 5's permit trigger function, which always notifies.
DROP FUNCTION IF EXISTS pgfence_acquire_permit(text, integer, text, bigint, boolean);
CREATE OR REPLACE FUNCTION pgfence_permit_released() RETURNS trigger
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
CREATE OR REPLACE FUNCTION pgfence_schema_version() RETURNS integer
    LANGUAGE sql IMMUTABLE
    SET search_path = pg_catalog, pg_temp
AS $$ SELECT 5 $$;
DO $$
DECLARE
    s text := pg_catalog.quote_ident(pg_catalog.current_schema());
BEGIN
    EXECUTE pg_catalog.format('ALTER FUNCTION %s.pgfence_permit_released() SET search_path = pg_catalog, %s, pg_temp', s, s);
    EXECUTE pg_catalog.format('ALTER FUNCTION %s.pgfence_schema_version() SET search_path = pg_catalog, %s, pg_temp', s, s);
END;
$$;
