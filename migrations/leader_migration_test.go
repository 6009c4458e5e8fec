package migrations_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/migrations"
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

	at4 := emptyDB(t)
	require.NoError(t, migrations.UpTo(ctx, migrations.Target{URL: at4.URL}, nil, 4))
	reverted := pgtest.NewDB(t)
	require.NoError(t, migrations.DownTo(ctx, migrations.Target{URL: reverted.URL}, nil, 4))
	want := describe(t, at4)
	require.Equal(t, want, describe(t, reverted))
	// Negative control: version 5 differs from version 4 in that view.
	require.NotEqual(t, want, describe(t, db))
	// And up applies again.
	require.NoError(t, migrations.Up(ctx, migrations.Target{URL: reverted.URL}, nil))
	require.Equal(t, describe(t, db), describe(t, reverted))
}
