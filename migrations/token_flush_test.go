package migrations_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/migrations"
)

// TestTokenDrawCommitsDurably: every transaction that draws a token with
// pgfence_next_token() and writes nothing else commits with a WAL flush,
// also the draws nextval() serves from the 32 values it logged ahead
// without a WAL record of their own (000006). The count is the server's
// WAL flushes (pg_stat_wal.wal_sync) over draws in autocommit, on a cluster
// of the test's own so that nothing else flushes. The negative control is
// the draw as 000003 made it (a transaction id and synchronous_commit on,
// but no WAL record of its own): most of its commits do not flush.
func TestTokenDrawCommitsDurably(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	_, srv := pgtest.NewCluster(t, &pgtest.ClusterOptions{Settings: map[string]string{
		"fsync": "on", "synchronous_commit": "on",
	}})
	conn := srv.NewDB(t).Conn(t)
	const draws = 96

	flushes := func(draw string) int64 {
		t.Helper()
		var before, after int64
		read := func(v *int64) {
			t.Helper()
			_, err := conn.Exec(ctx, "SELECT pg_catalog.pg_stat_force_next_flush()")
			require.NoError(t, err)
			require.NoError(t, conn.QueryRow(ctx, "SELECT wal_sync FROM pg_catalog.pg_stat_wal").Scan(v))
		}
		read(&before)
		var last int64
		for range draws {
			var token int64
			require.NoError(t, conn.QueryRow(ctx, draw).Scan(&token))
			require.Greater(t, token, last)
			last = token
		}
		read(&after)
		return after - before
	}

	got := flushes("SELECT pgfence.pgfence_next_token()")
	t.Logf("pgfence_next_token: %d WAL flushes for %d draws", got, draws)
	// Each draw's commit flushes; a flush the WAL writer made just
	// before one of them may spare it, hence the margin.
	require.GreaterOrEqual(t, got, int64(draws*3/4))

	old := flushes(`SELECT t FROM (SELECT pg_catalog.set_config('synchronous_commit', 'on', true), pg_catalog.pg_current_xact_id(),
		pg_catalog.nextval('pgfence.pgfence_leases_fence_seq') AS t) d`)
	t.Logf("negative control, the draw of 000003: %d WAL flushes for %d draws", old, draws)
	require.Less(t, old, int64(draws/2))
}

// TestMigration000006: the flush sequence is installed with its privileges
// revoked from PUBLIC and the token function keeps its pinned search_path;
// reverting 000006 leaves exactly what 000005 left, compared with an
// install that stopped at version 5.
func TestMigration000006(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	db := pgtest.NewDB(t)
	var (
		publicSelect, publicUpdate bool
		config                     []string
	)
	require.NoError(t, db.Pool.QueryRow(ctx, `
		SELECT has_sequence_privilege('public', 'pgfence.pgfence_token_flush_seq', 'SELECT'),
		       has_sequence_privilege('public', 'pgfence.pgfence_token_flush_seq', 'UPDATE'),
		       (SELECT p.proconfig FROM pg_proc p WHERE p.oid = 'pgfence.pgfence_next_token()'::regprocedure)`).
		Scan(&publicSelect, &publicUpdate, &config))
	require.False(t, publicSelect)
	require.False(t, publicUpdate)
	require.Equal(t, []string{"search_path=pg_catalog, pgfence, pg_temp"}, config)

	at5 := emptyDB(t)
	require.NoError(t, migrations.UpTo(ctx, migrations.Target{URL: at5.URL}, nil, 5))
	reverted := pgtest.NewDB(t)
	require.NoError(t, migrations.DownTo(ctx, migrations.Target{URL: reverted.URL}, nil, 5))
	want := describe(t, at5)
	require.Equal(t, want, describe(t, reverted))
	// Negative control: version 6 differs from version 5 in that view.
	require.NotEqual(t, want, describe(t, db))
	require.NoError(t, migrations.Up(ctx, migrations.Target{URL: reverted.URL}, nil))
	require.Equal(t, describe(t, db), describe(t, reverted))
}
