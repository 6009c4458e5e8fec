//go:build chaos

package chaos_test

import (
	"context"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/test/chaos"
)

// crash crashes c with SIGKILL (even i) or SIGQUIT (odd i) and starts it
// again on the same data directory.
func crash(t *testing.T, ctx context.Context, c *pgtest.Cluster, i int) {
	require.NoError(t, c.Crash(crashSignal(i)))
	require.NoError(t, c.Start(ctx))
}

func crashSignal(i int) syscall.Signal {
	if i%2 == 1 {
		return syscall.SIGQUIT
	}
	return syscall.SIGKILL
}

// The guarded workload while the server is crashed and restarted: tokens
// drawn before a crash are never reissued, and the register stays
// linearizable (the server commits synchronously, the default).
func TestServerCrashGuardedWorkload(t *testing.T) {
	t.Parallel()
	ctx := ctxFor(t, 3*time.Minute)
	c, s := pgtest.NewCluster(t, nil)
	db := s.NewDB(t)
	pool := db.NewPool(t, func(cfg *pgxpool.Config) { cfg.MaxConns = 8 })
	reg, err := chaos.NewSQLRegister(ctx, pool, "chaos_register", true)
	require.NoError(t, err)
	lk, err := chaos.NewSimLocker(pool, 3*time.Millisecond)
	require.NoError(t, err)

	ops, dur := soak(0, 3*time.Second)
	wctx, stop := context.WithCancel(ctx)
	wait := nemesis(wctx, time.Second, func(i int) { crash(t, ctx, c, i) })
	h, err := chaos.Run(ctx, chaos.WorkloadConfig{
		Locker: lk, Register: reg, Workers: 4, Ops: ops, Duration: dur,
		MaxSleep: 6 * time.Millisecond, OpTimeout: 2 * time.Second, Seed: 3,
	})
	stop()
	crashes := wait()
	require.NoError(t, err)
	final := finalState(t, ctx, reg)
	t.Logf("crashes: %d; acquires ok %d; unknown writes %d", crashes,
		h.Count(chaos.Acquire, chaos.Ok), h.Count(chaos.Write, chaos.Unknown))
	require.Positive(t, crashes)
	verdict(t, h, &chaos.CheckOpts{Name: "server-crash-guarded", Final: &final.Value, Claim: true}, false)
}

// On a server with synchronous_commit=off, tokens from pgfence_next_token()
// survive crashes (the function forces a durable commit), while plain
// nextval() on the same sequence is reissued after a crash: the negative
// control showing why pgfence_next_token() exists.
func TestServerCrashTokensSyncCommitOff(t *testing.T) {
	t.Parallel()
	ctx := ctxFor(t, 3*time.Minute)
	c, s := pgtest.NewCluster(t, &pgtest.ClusterOptions{Settings: map[string]string{
		"synchronous_commit": "off",
		// Keep the WAL writer from flushing other work behind our back,
		// so what is durable is what a commit made durable.
		"wal_writer_delay": "10s",
		"autovacuum":       "off",
	}})
	db := s.NewDB(t)

	const rounds, perRound = 4, 10
	rec := chaos.NewRecorder()
	for i := 0; i < rounds; i++ {
		conn := connectURL(t, ctx, c.URL(db.Name))
		drawTokens(t, ctx, rec, conn, i, perRound, "")
		crash(t, ctx, c, i)
	}
	conn := connectURL(t, ctx, c.URL(db.Name))
	drawTokens(t, ctx, rec, conn, rounds, perRound, "")
	verdict(t, rec.History(), &chaos.CheckOpts{Name: "server-crash-sync-commit-off-pgfence_next_token"}, false)

	// Negative control: plain nextval(), no transaction id, nothing forces
	// its WAL to disk before the crash.
	neg := chaos.NewRecorder()
	reissuedRounds := 0
	for i := 0; i < rounds; i++ {
		conn := connectURL(t, ctx, c.URL(db.Name))
		before := len(chaos.CheckTokensUnique(neg.History()))
		// More than 32 draws: a sequence logs 32 values ahead, so fewer
		// can stay inside a window made durable earlier.
		plainNextval(t, ctx, neg, conn, i, 40)
		crash(t, ctx, c, i)
		conn = connectURL(t, ctx, c.URL(db.Name))
		plainNextval(t, ctx, neg, conn, i, 1)
		h := neg.History()
		reissued := len(chaos.CheckTokensUnique(h)) > before
		if reissued {
			reissuedRounds++
		}
		t.Logf("plain nextval() round %d (%s): last token before crash %d, first after %d, reissued=%v",
			i, crashSignal(i), h[len(h)-2].Token, h[len(h)-1].Token, reissued)
	}
	t.Logf("plain nextval(): a token was reissued after %d of %d crashes", reissuedRounds, rounds)
	verdict(t, neg.History(), &chaos.CheckOpts{Name: "negative-control-plain-nextval-sync-commit-off"}, true)
}

func plainNextval(t *testing.T, ctx context.Context, rec *chaos.Recorder, conn *pgx.Conn, p, n int) {
	t.Helper()
	for i := 0; i < n; i++ {
		op := rec.Invoke(chaos.Op{Process: p, Kind: chaos.Acquire, Name: "tokens"})
		var tok int64
		require.NoError(t, conn.QueryRow(ctx, "SELECT pg_catalog.nextval('pgfence.pgfence_leases_fence_seq'::pg_catalog.regclass)").Scan(&tok))
		op.Complete(chaos.Ok, func(o *chaos.Op) { o.Token = tok })
	}
}
