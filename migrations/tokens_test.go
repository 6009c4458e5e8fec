package migrations_test

import (
	"context"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence/internal/install"
	"github.com/pgfence/pgfence/internal/pgtest"
)

// tokenStep is the token sequence's increment: the size of the block of
// tokens one value covers.
const tokenStep = install.TokenStep

// TestNextTokens: pgfence_next_tokens draws a token for each true position
// of its argument, in order, after every token drawn before and before
// every token drawn after, and NULL elsewhere; an empty array gives an
// empty one and NULL gives NULL. More than 65536 positions are refused
// before anything is drawn.
func TestNextTokens(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	db := pgtest.NewDB(t)
	draw := func() int64 {
		t.Helper()
		var tok int64
		require.NoError(t, db.Pool.QueryRow(ctx, "SELECT pgfence.pgfence_next_token()").Scan(&tok))
		return tok
	}
	tokens := func(wanted []*bool) []*int64 {
		t.Helper()
		var got []*int64
		require.NoError(t, db.Pool.QueryRow(ctx, "SELECT pgfence.pgfence_next_tokens($1)", wanted).Scan(&got))
		return got
	}
	yes, no := true, false

	// The sequence steps by a block (tokenStep): a single draw takes one
	// value; a call hands out consecutive tokens from one value per block.
	before := draw()
	got := tokens([]*bool{&yes, &no, nil, &yes, &yes})
	require.Len(t, got, 5)
	require.Nil(t, got[1])
	require.Nil(t, got[2])
	require.Equal(t, before+tokenStep, *got[0])
	require.Equal(t, before+tokenStep+1, *got[3])
	require.Equal(t, before+tokenStep+2, *got[4])
	require.Equal(t, before+2*tokenStep, draw())

	require.Equal(t, []*int64{nil, nil}, tokens([]*bool{&no, &no}))
	require.Equal(t, before+3*tokenStep, draw(), "no position wanted, no token drawn")
	require.Empty(t, tokens([]*bool{}))
	require.NotNil(t, tokens([]*bool{}), "an empty array, not NULL")
	var null []*int64
	require.NoError(t, db.Pool.QueryRow(ctx, "SELECT pgfence.pgfence_next_tokens(NULL)").Scan(&null))
	require.Nil(t, null)

	require.Len(t, tokens(make([]*bool, 65536)), 65536, "the limit itself is accepted")
	var tooMany []*int64
	err := db.Pool.QueryRow(ctx, "SELECT pgfence.pgfence_next_tokens(array_fill(true, ARRAY[65537]))").Scan(&tooMany)
	requireSQLState(t, err, "22023")
	require.ErrorContains(t, err, "at most 65536")
	require.Equal(t, before+4*tokenStep, draw(), "the refused call drew nothing")

	// More than a block: a new value for each block, the tokens consecutive
	// across them, every one at or below pgfence_last_token and below the
	// next draw.
	many := make([]*bool, 2500)
	for i := range many {
		many[i] = &yes
	}
	base := before + 5*tokenStep
	got = tokens(many)
	for i, tok := range got {
		require.Equal(t, base+int64(i), *tok, "position %d", i+1)
	}
	var last int64
	require.NoError(t, db.Pool.QueryRow(ctx, "SELECT pgfence.pgfence_last_token()").Scan(&last))
	require.Equal(t, base+3*tokenStep-1, last, "the top of the last value's block")
	require.Equal(t, base+3*tokenStep, draw(), "three values drawn for 2500 tokens")
}

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
// returning its greatest token: pgfence_next_token() and
// pgfence_next_tokens, here drawing three tokens in one call.
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
// not flushed. Transaction A draws right after a
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
// WAL is already flushed write nothing and do not wait for the disk: about
// one nextval() in 32, the one that writes the record, makes its statement
// flush. The negative control is a pgfence_next_token that writes its WAL
// record on every draw, whose commits all flush. The count is the server's
// WAL flushes over the draws, on a cluster of the test's own so that
// nothing else flushes.
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

	weaken(t, db, edit{"pgfence_next_token()", "IF pg_catalog.current_setting('synchronous_standby_names') <> ''",
		"IF true OR pg_catalog.current_setting('synchronous_standby_names') <> ''"})
	old := f.flushes("SELECT pgfence.pgfence_next_token()", n)
	t.Logf("negative control, a draw that always writes WAL: %d WAL flushes for %d draws", old, n)
	// Each draw's commit flushes; a flush the WAL writer made just
	// before one of them may spare it, hence the margin.
	require.GreaterOrEqual(t, old, int64(n*3/4))
}

// TestTokenDrawWaitsForSynchronousStandby: where synchronous standbys are
// named, every draw writes its WAL record, so that its commit waits for
// them: a flush on the primary alone would not keep the token
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

// TestRenewalWaitsForSynchronousStandby: a renewal's commit waits for the
// synchronous standbys even in a session with synchronous_commit off, as a
// token draw's does: an acknowledged renewal lost in a failover would let
// another client take a lease its holder still believes it holds. On a
// primary whose named standby never connects, the renewal waits (SyncRep)
// until it is cancelled; the negative control, a pgfence_renew without the
// raise, commits at once.
func TestRenewalWaitsForSynchronousStandby(t *testing.T) {
	t.Parallel()
	for _, control := range []bool{false, true} {
		t.Run(map[bool]string{false: "renew", true: "control"}[control], func(t *testing.T) {
			t.Parallel()
			ctx := testCtx(t)
			_, srv := pgtest.NewCluster(t, &pgtest.ClusterOptions{Settings: map[string]string{
				"fsync": "on", "synchronous_commit": "off", "autovacuum": "off",
			}})
			db := srv.NewDB(t)
			if control {
				weaken(t, db, edit{"pgfence_renew(text[], bigint[], text[], bigint[])",
					"PERFORM pg_catalog.set_config('synchronous_commit', 'on', true);", "NULL;"})
			}
			var token int64
			var secret string
			require.NoError(t, db.Pool.QueryRow(ctx,
				"SELECT fence, secret FROM pgfence.pgfence_acquire('{job}', 'holder', '{60000000}')").Scan(&token, &secret))

			exec(t, db, "ALTER SYSTEM SET synchronous_standby_names = 'missing_standby'", "SELECT pg_catalog.pg_reload_conf()")
			conn := db.Conn(t)
			require.Eventually(t, func() bool {
				var names string
				err := conn.QueryRow(ctx, "SELECT current_setting('synchronous_standby_names')").Scan(&names)
				return err == nil && names == "missing_standby"
			}, 10*time.Second, 10*time.Millisecond)
			var pid int32
			require.NoError(t, conn.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid))

			done := make(chan error, 1)
			go func() {
				_, err := conn.Exec(ctx, "SELECT * FROM pgfence.pgfence_renew('{job}', $1, $2, '{60000000}')",
					[]int64{token}, []string{secret})
				done <- err
			}()
			if control {
				require.NoError(t, <-done, "control: without the raise, the renewal commits without the standby")
				return
			}
			require.Eventually(t, func() bool {
				var waiting bool
				err := db.Pool.QueryRow(ctx, "SELECT EXISTS (SELECT FROM pg_stat_activity WHERE pid = $1 AND wait_event = 'SyncRep')",
					pid).Scan(&waiting)
				return err == nil && waiting
			}, 30*time.Second, 10*time.Millisecond, "the renewal's commit waits for the synchronous standby")
			_, err := db.Pool.Exec(ctx, "SELECT pg_cancel_backend($1)", pid)
			require.NoError(t, err)
			require.NoError(t, <-done) // committed locally, with a warning
		})
	}
}
