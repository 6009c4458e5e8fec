-- Drops what 000003_fence_registry.up.sql creates, with the grants on it,
-- and gives pgfence_schema_version its previous value back.
DROP FUNCTION IF EXISTS pgfence_fence_check(text, bigint);
DROP TABLE IF EXISTS pgfence_fence_registry;

CREATE OR REPLACE FUNCTION pgfence_schema_version() RETURNS integer
    LANGUAGE sql IMMUTABLE
    SET search_path = pg_catalog, pg_temp
AS $$ SELECT 2 $$;

DO $$
DECLARE
    s text := pg_catalog.quote_ident(pg_catalog.current_schema());
BEGIN
    EXECUTE pg_catalog.format('ALTER FUNCTION %s.pgfence_schema_version() SET search_path = pg_catalog, %s, pg_temp', s, s);
END;
$$;
