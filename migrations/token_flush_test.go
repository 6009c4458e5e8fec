package migrations_test

import (
	"context"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/migrations"
)

// flushCounter counts the WAL flushes (pg_stat_wal.wal_sync) of a server
// over draws made on conn in autocommit, each token checked to be greater
// than the one before.
type flushCounter struct {
	t    *testing.T
	ctx  context.Context
	conn *pgx.Conn
}

// flushes runs draw n times and returns the WAL flushes the server made
// meanwhile.
func (f flushCounter) flushes(draw string, n int) int64 {
	t := f.t
	t.Helper()
	read := func() int64 {
		t.Helper()
		_, err := f.conn.Exec(f.ctx, "SELECT pg_catalog.pg_stat_force_next_flush()")
		require.NoError(t, err)
		var v int64
		require.NoError(t, f.conn.QueryRow(f.ctx, "SELECT wal_sync FROM pg_catalog.pg_stat_wal").Scan(&v))
		return v
	}
	before := read()
	var last int64
	for range n {
		var token int64
		require.NoError(t, f.conn.QueryRow(f.ctx, draw).Scan(&token))
		require.Greater(t, token, last)
		last = token
	}
	return read() - before
}

// bareDraw draws a token without pgfence_next_token()'s care for
// durability: what a draw that never writes WAL of its own commits.
const bareDraw = "SELECT pg_catalog.nextval('pgfence.pgfence_leases_fence_seq')"

// draws are the two ways to draw tokens durably, each as a statement
// returning its greatest token: pgfence_next_token() (000006, 000008) and
// pgfence_next_tokens (000009), here drawing three tokens in one call.
var draws = []struct {
	name, sql string
	tokens    int64 // drawn by one statement
}{
	{"pgfence_next_token", "SELECT pgfence.pgfence_next_token()", 1},
	{"pgfence_next_tokens", "SELECT max(t) FROM pg_catalog.unnest(pgfence.pgfence_next_tokens('{t,f,t,t}')) AS t", 3},
}

// TestTokenSurvivesCrashWhenCoveredByUnflushedWAL: a token handed out by a
// committed draw is never handed out again after a crash, also when the
// WAL record that covers it belongs to another transaction, still open and
// not flushed (000006, 000008). Transaction A draws right after a
// checkpoint, so that nextval() writes a record logging 32 values ahead,
// and stays open; B draws the next value, which that record covers, and
// commits; the server then crashes (immediate shutdown, nothing flushed)
// and restarts, and the next draw must be greater than B's. The WAL writer
// sleeps 10s, so only B's commit can flush A's record. B draws with each
// of draws (pgfence_next_tokens: three tokens, the first covered by A's
// record). The negative control is B drawing with a bare nextval(): after
// the crash the sequence is back where the checkpoint left it and hands
// out B's token again.
func TestTokenSurvivesCrashWhenCoveredByUnflushedWAL(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	c, srv := pgtest.NewCluster(t, &pgtest.ClusterOptions{Settings: map[string]string{
		"fsync": "on", "synchronous_commit": "on", "wal_writer_delay": "10s", "autovacuum": "off",
	}})
	db := srv.NewDB(t)

	// crashAfter returns B's (greatest) token and the first token drawn
	// after the crash.
	crashAfter := func(draw string, tokens int64) (committed, next int64) {
		t.Helper()
		a, err := pgx.Connect(ctx, db.URL)
		require.NoError(t, err)
		defer a.Close(ctx)
		b, err := pgx.Connect(ctx, db.URL)
		require.NoError(t, err)
		defer b.Close(ctx)
		_, err = a.Exec(ctx, "CHECKPOINT")
		require.NoError(t, err)
		tx, err := a.Begin(ctx)
		require.NoError(t, err)
		var open int64
		require.NoError(t, tx.QueryRow(ctx, "SELECT pgfence.pgfence_next_token()").Scan(&open))
		require.NoError(t, b.QueryRow(ctx, draw).Scan(&committed))
		// B draws the next value (one step of the sequence, tokenStep, on)
		// and, for several tokens, the ones after it in its block.
		require.Equal(t, open+tokenStep+tokens-1, committed, "B's values are ones the record A wrote covers")

		require.NoError(t, c.Crash(syscall.SIGQUIT)) // a's and b's connections die with it
		require.NoError(t, c.Start(ctx))
		conn, err := pgx.Connect(ctx, db.URL)
		require.NoError(t, err)
		defer conn.Close(ctx)
		require.NoError(t, conn.QueryRow(ctx, "SELECT pgfence.pgfence_next_token()").Scan(&next))
		return committed, next
	}

	for _, d := range draws {
		committed, next := crashAfter(d.sql, d.tokens)
		t.Logf("%s: committed %d, first after the crash %d", d.name, committed, next)
		require.Greater(t, next, committed, "%s: a committed token was handed out again after a crash", d.name)
	}

	committed, next := crashAfter(bareDraw, 1)
	t.Logf("negative control, a bare nextval: committed %d, first after the crash %d", committed, next)
	require.LessOrEqual(t, next, committed, "the control must hand a committed token out again")
}

// TestTokenDrawFlushesOnlyWhenNeeded: draws in autocommit whose covering
// WAL is already flushed write nothing and do not wait for the disk
// (000008, and 000009 for pgfence_next_tokens): about one nextval() in 32,
// the one that writes the record, makes its statement flush. The negative
// control is the draw of 000006, which flushed on every commit. The count is the server's WAL flushes over the
// draws, on a cluster of the test's own so that nothing else flushes.
func TestTokenDrawFlushesOnlyWhenNeeded(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	_, srv := pgtest.NewCluster(t, &pgtest.ClusterOptions{Settings: map[string]string{
		"fsync": "on", "synchronous_commit": "on", "autovacuum": "off",
	}})
	db := srv.NewDB(t)
	f := flushCounter{t: t, ctx: ctx, conn: db.Conn(t)}
	const n = 96

	for _, d := range draws {
		got := f.flushes(d.sql, n)
		t.Logf("%s: %d WAL flushes for %d statements", d.name, got, n)
		require.LessOrEqual(t, got, int64(n/8), d.name)
	}

	require.NoError(t, migrations.DownTo(ctx, migrations.Target{URL: db.URL}, nil, 7))
	old := f.flushes("SELECT pgfence.pgfence_next_token()", n)
	t.Logf("negative control, the draw of 000006: %d WAL flushes for %d draws", old, n)
	// Each draw's commit flushes; a flush the WAL writer made just
	// before one of them may spare it, hence the margin.
	require.GreaterOrEqual(t, old, int64(n*3/4))
}

// TestTokenDrawWaitsForSynchronousStandby: where synchronous standbys are
// named, every draw writes its WAL record, so that its commit waits for
// them (000008, 000009): a flush on the primary alone would not keep the token
// through a failover. Counted as in TestTokenDrawFlushesOnlyWhenNeeded, on
// a primary with a synchronous standby. The negative control is the same
// primary with synchronous_standby_names emptied: the draws flush rarely.
func TestTokenDrawWaitsForSynchronousStandby(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	c, srv := pgtest.NewCluster(t, &pgtest.ClusterOptions{Settings: map[string]string{
		"fsync": "on", "synchronous_commit": "on", "autovacuum": "off",
	}})
	pgtest.NewStandby(t, c, &pgtest.StandbyOptions{Synchronous: true})
	db := srv.NewDB(t)
	conn := db.Conn(t)
	var names, state string
	require.NoError(t, conn.QueryRow(ctx, "SELECT current_setting('synchronous_standby_names'), "+
		"(SELECT sync_state FROM pg_stat_replication)").Scan(&names, &state))
	require.NotEmpty(t, names)
	require.Equal(t, "sync", state)
	f := flushCounter{t: t, ctx: ctx, conn: conn}
	const n = 96

	for _, d := range draws {
		got := f.flushes(d.sql, n)
		t.Logf("synchronous standby named, %s: %d WAL flushes for %d statements", d.name, got, n)
		require.GreaterOrEqual(t, got, int64(n*3/4), d.name)
	}

	// The control: the same server (the test's own, discarded after it)
	// with no synchronous standby named. Reloaded settings apply to a
	// session between its statements.
	_, err := conn.Exec(ctx, "ALTER SYSTEM SET synchronous_standby_names = ''")
	require.NoError(t, err)
	_, err = conn.Exec(ctx, "SELECT pg_catalog.pg_reload_conf()")
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		err := conn.QueryRow(ctx, "SELECT current_setting('synchronous_standby_names')").Scan(&names)
		return err == nil && names == ""
	}, 10*time.Second, 10*time.Millisecond)
	for _, d := range draws {
		alone := f.flushes(d.sql, n)
		t.Logf("negative control, no synchronous standby named, %s: %d WAL flushes for %d statements", d.name, alone, n)
		require.LessOrEqual(t, alone, int64(n/8), d.name)
	}
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

	requireRevertsTo(t, db, 5)
}

// TestMigration000008: the token function keeps its pinned search_path;
// reverting 000008 leaves exactly what 000007 left, compared with an
// install that stopped at version 7, and Up restores version 8.
func TestMigration000008(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	db := pgtest.NewDB(t)
	var config []string
	require.NoError(t, db.Pool.QueryRow(ctx,
		`SELECT p.proconfig FROM pg_proc p WHERE p.oid = 'pgfence.pgfence_next_token()'::regprocedure`).Scan(&config))
	require.Equal(t, []string{"search_path=pg_catalog, pgfence, pg_temp"}, config)

	requireRevertsTo(t, db, 7)
}
