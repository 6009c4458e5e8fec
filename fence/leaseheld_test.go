package fence_test

// TEST-ONLY, DELETE AT MERGE. On the fence branch migration 000003, which
// installs pgfence_lease_held, is absent, so the builders' UnderLease SQL
// would call a function that does not exist. installLeaseHeld creates a
// copy of its definition (DESIGN.md §3: true iff the row is held with that
// token on clock_timestamp(), locking it FOR SHARE; SECURITY DEFINER, pinned
// search_path) in each test database that lacks it. Once 000003 is merged,
// delete this file and the installLeaseHeld calls, and make pgfenceSchema
// return pgfence.DefaultSchema.

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/pgfence/pgfence"
)

// leaseHeldSQL is the test-only copy of 000003's pgfence_lease_held, created
// in the schema that holds pgfence_leases.
const leaseHeldSQL = `
CREATE FUNCTION %[1]s.pgfence_lease_held(name text, token bigint) RETURNS boolean
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER
    SET search_path = pg_catalog, %[1]s, pg_temp
AS $$
BEGIN
    PERFORM FROM pgfence_leases AS l
    WHERE l.name OPERATOR(pg_catalog.=) $1 AND l.fence OPERATOR(pg_catalog.=) $2
      AND l.expires_at OPERATOR(pg_catalog.>) pg_catalog.clock_timestamp()
    FOR SHARE;
    RETURN FOUND;
END;
$$;
REVOKE EXECUTE ON FUNCTION %[1]s.pgfence_lease_held(text, bigint) FROM PUBLIC;`

// installLeaseHeld creates pgfence_lease_held in db when it is missing and
// returns the schema pgfence is installed in.
func installLeaseHeld(ctx context.Context, db pgfence.DB) (string, error) {
	schema, err := pgfenceSchema(ctx, db)
	if err != nil {
		return "", err
	}
	var exists bool
	if err := db.QueryRow(ctx, `SELECT pg_catalog.to_regprocedure(
		pg_catalog.quote_ident($1) || '.pgfence_lease_held(text, bigint)') IS NOT NULL`, schema).Scan(&exists); err != nil {
		return "", err
	}
	if !exists {
		q := pgx.Identifier{schema}.Sanitize()
		if _, err := db.Exec(ctx, fmt.Sprintf(leaseHeldSQL, q)); err != nil {
			return "", err
		}
	}
	return schema, nil
}
