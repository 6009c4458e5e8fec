package pgfence_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/migrations"
)

// emptyDB returns a fresh database without pgfence's objects or schema. The
// migration tests that lived here moved to package migrations; this helper
// stays for integration_test.go.
func emptyDB(t *testing.T) *pgtest.DB {
	t.Helper()
	ctx := context.Background()
	db := pgtest.NewDB(t)
	require.NoError(t, migrations.Down(ctx, migrations.Target{URL: db.URL}, nil))
	_, err := db.Pool.Exec(ctx, "DROP SCHEMA pgfence")
	require.NoError(t, err)
	return db
}
