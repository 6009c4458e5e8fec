DROP FUNCTION IF EXISTS pgfence_next_token();
-- Dropping the table drops its owned sequence pgfence_leases_fence_seq too.
DROP TABLE IF EXISTS pgfence_leases;
