-- Drops what 000004_schedule_slots.up.sql creates, with the grants on it,
-- and gives pgfence_schema_version() back its previous number.
DROP FUNCTION IF EXISTS
    pgfence_slots_prune(interval),
    pgfence_slot_finish(text, text, bigint, text, text, text),
    pgfence_slot_begin(text, text, bigint, text);
DROP TABLE IF EXISTS pgfence_slots;
CREATE OR REPLACE FUNCTION pgfence_schema_version() RETURNS integer
    LANGUAGE sql IMMUTABLE
    SET search_path = pg_catalog, pg_temp
AS $$ SELECT 3 $$;
DO $$
BEGIN
    EXECUTE pg_catalog.format('ALTER FUNCTION %s.pgfence_schema_version() SET search_path = pg_catalog, %s, pg_temp',
        pg_catalog.quote_ident(pg_catalog.current_schema()), pg_catalog.quote_ident(pg_catalog.current_schema()));
END;
$$;
