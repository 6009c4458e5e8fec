-- For sqlc only: a declaration of pgfence's function that query.sql calls,
-- so that sqlc resolves it and types its argument (without it, Present
-- would take an interface{}). sqlc.yaml reads this file before schema.sql;
-- no database runs it: the real function comes from pgfence's migrations
-- (the baseline), and the tests build their database from schema.sql alone.
CREATE SCHEMA pgfence;
CREATE FUNCTION pgfence.pgfence_present(token bigint) RETURNS void
    LANGUAGE sql AS $$ SELECT $$;
