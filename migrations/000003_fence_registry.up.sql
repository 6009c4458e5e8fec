-- pgfence schema version 3: the fence registry, which lets a service outside
-- pgfence's own tables check fencing tokens. Created, like the baseline, in
-- current_schema() of the migrating connection; the function runs as the
-- role that runs the migration and its search_path is pinned at the end.

-- The highest token presented for each resource: written only by
-- pgfence_fence_check, which never lowers it.
CREATE TABLE pgfence_fence_registry (
    resource  text        NOT NULL,
    token     bigint      NOT NULL,
    raised_at timestamptz NOT NULL DEFAULT pg_catalog.now(),
    CONSTRAINT pgfence_fence_registry_pkey PRIMARY KEY (resource),
    CONSTRAINT pgfence_fence_registry_resource_check CHECK (resource <> '' AND pg_catalog.octet_length(resource) <= 512),
    CONSTRAINT pgfence_fence_registry_token_check CHECK (token > 0)
) WITH (
    -- Checks update rows in place without changing the key: keep them HOT.
    fillfactor = 75
);
COMMENT ON TABLE pgfence_fence_registry IS
    'pgfence fence registry: the highest fencing token presented for each resource through pgfence_fence_check.';
REVOKE ALL ON TABLE pgfence_fence_registry FROM PUBLIC;

-- Accepts token when it is at least the highest presented for resource,
-- raising the highest to it, else raises PF001 as the guard triggers do.
-- The resource's row stays locked until the calling transaction ends, so
-- the service's writes under an accepted token commit before any newer
-- token is accepted, and a rollback undoes the raise. SECURITY DEFINER:
-- callers get no privilege on the table.
CREATE FUNCTION pgfence_fence_check(resource text, token bigint) RETURNS void
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    highest bigint;
BEGIN
    IF resource IS NULL OR resource OPERATOR(pg_catalog.=) '' OR pg_catalog.octet_length(resource) OPERATOR(pg_catalog.>) 512 THEN
        RAISE EXCEPTION 'pgfence: fence registry resource names are 1 to 512 bytes long, not %',
                COALESCE(pg_catalog.octet_length(resource)::pg_catalog.text || ' bytes', 'NULL')
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF token IS NULL OR token OPERATOR(pg_catalog.<=) 0 THEN
        RAISE EXCEPTION 'pgfence: fencing token % is not positive; tokens come from pgfence_next_token()', token
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    INSERT INTO pgfence_fence_registry AS r (resource, token) VALUES (resource, token)
    ON CONFLICT ON CONSTRAINT pgfence_fence_registry_pkey DO UPDATE
        SET token = excluded.token,
            raised_at = CASE WHEN r.token OPERATOR(pg_catalog.<) excluded.token THEN pg_catalog.now() ELSE r.raised_at END
        WHERE r.token OPERATOR(pg_catalog.<=) excluded.token;
    IF FOUND THEN
        RETURN;
    END IF;
    -- The row is locked by the INSERT above: highest is the committed value
    -- that refused token.
    SELECT r.token INTO STRICT highest FROM pgfence_fence_registry AS r
    WHERE r.resource OPERATOR(pg_catalog.=) pgfence_fence_check.resource;
    RAISE EXCEPTION 'pgfence: stale fencing token % for resource % (highest seen %)',
            token, pg_catalog.quote_literal(resource), highest
        USING ERRCODE = 'PF001',
              DETAIL = pg_catalog.format('presented=%s current=%s', token, highest),
              HINT = 'A newer lock holder has presented its token for this resource; this holder''s lock was lost.',
              SCHEMA = (pg_catalog.current_schemas(false))[2],
              TABLE = 'pgfence_fence_registry';
END;
$$;
COMMENT ON FUNCTION pgfence_fence_check(resource text, token bigint) IS
    'Accepts a fencing token at least the highest presented for resource (raising the highest, row locked until the transaction ends), else SQLSTATE PF001.';

CREATE OR REPLACE FUNCTION pgfence_schema_version() RETURNS integer
    LANGUAGE sql IMMUTABLE
    SET search_path = pg_catalog, pg_temp
AS $$ SELECT 3 $$;

-- As at the end of the baseline: pin the search_path (CREATE OR REPLACE
-- reset pgfence_schema_version's) and take EXECUTE from PUBLIC.
DO $$
DECLARE
    s text := pg_catalog.quote_ident(pg_catalog.current_schema());
    f text;
BEGIN
    FOREACH f IN ARRAY ARRAY['pgfence_fence_check(pg_catalog.text, pg_catalog.int8)', 'pgfence_schema_version()'] LOOP
        EXECUTE pg_catalog.format('ALTER FUNCTION %s.%s SET search_path = pg_catalog, %s, pg_temp', s, f, s);
        EXECUTE pg_catalog.format('REVOKE ALL ON FUNCTION %s.%s FROM PUBLIC', s, f);
    END LOOP;
END;
$$;
