//go:build chaos

package chaos_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/test/chaos"
)

func TestTerminateBackends(t *testing.T) {
	t.Parallel()
	ctx := ctxFor(t, time.Minute)
	db := pgtest.NewDB(t)
	victim := db.NewPool(t, func(c *pgxpool.Config) {
		c.ConnConfig.RuntimeParams["application_name"] = "chaos-victim"
	})
	conn, err := victim.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	n, err := chaos.TerminateBackends(ctx, db.Pool, db.Name, "chaos-victim")
	require.NoError(t, err)
	require.Equal(t, 1, n)
	_, err = conn.Exec(ctx, "SELECT 1")
	require.Error(t, err)
	// The admin pool's own connections were spared.
	_, err = db.Pool.Exec(ctx, "SELECT 1")
	require.NoError(t, err)
	_, err = chaos.TerminateBackends(ctx, nil, db.Name, "")
	require.Error(t, err)
}

// The guarded workload while the register's connections are killed with
// pg_terminate_backend every few milliseconds.
func TestConnectionKillGuardedWorkload(t *testing.T) {
	t.Parallel()
	ctx := ctxFor(t, 3*time.Minute)
	db := pgtest.NewDB(t)
	holders := db.NewPool(t, func(c *pgxpool.Config) {
		c.MaxConns = 6
		c.ConnConfig.RuntimeParams["application_name"] = "chaos-holder"
	})
	reg, err := chaos.NewSQLRegister(ctx, holders, "chaos_register", true)
	require.NoError(t, err)
	admin, err := chaos.NewSQLRegister(ctx, db.Pool, "chaos_register", true)
	require.NoError(t, err)
	lk, err := chaos.NewSimLocker(db.Pool, 3*time.Millisecond)
	require.NoError(t, err)

	ops, dur := soak(200, 0)
	wctx, stop := context.WithCancel(ctx)
	killed := 0
	wait := nemesis(wctx, 20*time.Millisecond, func(int) {
		n, err := chaos.TerminateBackends(ctx, db.Pool, db.Name, "chaos-holder")
		if err == nil {
			killed += n
		}
	})
	h, err := chaos.Run(ctx, chaos.WorkloadConfig{
		Locker: lk, Register: reg, Workers: 4, Ops: ops, Duration: dur,
		MaxSleep: 6 * time.Millisecond, OpTimeout: 2 * time.Second, Seed: 5,
	})
	stop()
	rounds := wait()
	require.NoError(t, err)
	final := finalState(t, ctx, admin)
	t.Logf("kill rounds: %d, backends terminated: %d, failed/unknown register ops: %d/%d", rounds, killed,
		h.Count(chaos.Read, chaos.Fail)+h.Count(chaos.Write, chaos.Fail),
		h.Count(chaos.Read, chaos.Unknown)+h.Count(chaos.Write, chaos.Unknown))
	require.Positive(t, killed)
	verdict(t, h, &chaos.CheckOpts{Name: "connection-kill-guarded", Final: &final.Value, Claim: true}, false)
}
