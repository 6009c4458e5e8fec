package migrations_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence/internal/pgtest"
)

// TestMigration000005: the leader table and its function are installed
// with their privileges revoked from PUBLIC, the function SECURITY DEFINER
// with the pinned search_path; reverting 000005 leaves exactly what 000004
// left, compared with an install that stopped at version 4.
func TestMigration000005(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	db := pgtest.NewDB(t)
	var (
		definer, publicExec, publicSelect bool
		config                            []string
	)
	require.NoError(t, db.Pool.QueryRow(ctx, `
		SELECT p.prosecdef, p.proconfig,
		       has_function_privilege('public', p.oid, 'EXECUTE'),
		       has_table_privilege('public', 'pgfence.pgfence_leaders', 'SELECT')
		FROM pg_proc p WHERE p.oid = 'pgfence.pgfence_leader_proclaim(text, bigint, text, text)'::regprocedure`).
		Scan(&definer, &config, &publicExec, &publicSelect))
	require.True(t, definer)
	require.Contains(t, config, "search_path=pg_catalog, pgfence, pg_temp")
	require.False(t, publicExec)
	require.False(t, publicSelect)

	requireRevertsTo(t, db, 4)
}
