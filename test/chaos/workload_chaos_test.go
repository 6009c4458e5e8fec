//go:build chaos

package chaos_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/test/chaos"
)

// runRegister runs the workload with a SimLocker on a fresh database.
func runRegister(t *testing.T, guarded bool, ttl, maxSleep time.Duration, ops int) (chaos.History, chaos.RegisterState) {
	t.Helper()
	ctx := ctxFor(t, 3*time.Minute)
	db := pgtest.NewDB(t)
	reg, err := chaos.NewSQLRegister(ctx, db.Pool, "chaos_register", guarded)
	require.NoError(t, err)
	lk, err := chaos.NewSimLocker(db.Pool, ttl)
	require.NoError(t, err)
	ops, dur := soak(ops, 0)
	h, err := chaos.Run(ctx, chaos.WorkloadConfig{
		Locker: lk, Register: reg, Workers: 4, Ops: ops, Duration: dur, MaxSleep: maxSleep, Seed: 7,
	})
	require.NoError(t, err)
	return h, finalState(t, ctx, reg)
}

func TestWorkloadGuardedNoOverlap(t *testing.T) {
	t.Parallel()
	h, final := runRegister(t, true, time.Minute, 2*time.Millisecond, 60)
	require.Equal(t, int64(h.Count(chaos.Write, chaos.Ok)), final.Value)
	verdict(t, h, &chaos.CheckOpts{Name: "simlock-guarded-no-overlap", Final: &final.Value, Claim: true}, false)
}

// Holders sleep up to 4x the TTL, so grants overlap: the guarded register
// must fence the stale holders and stay linearizable.
func TestWorkloadGuardedOverlappingHolders(t *testing.T) {
	t.Parallel()
	h, final := runRegister(t, true, 2*time.Millisecond, 8*time.Millisecond, 120)
	fenced := 0
	for _, op := range h {
		if op.Fenced {
			fenced++
		}
	}
	t.Logf("fenced operations: %d of %d", fenced, len(h))
	verdict(t, h, &chaos.CheckOpts{Name: "simlock-guarded-overlap", Final: &final.Value, Claim: true}, false)
}

// Negative control: the same overlapping holders with unguarded writes lose
// updates and move the row's token backwards; the checker must say so.
func TestWorkloadUnguardedOverlappingHoldersIsDetected(t *testing.T) {
	t.Parallel()
	h, final := runRegister(t, false, 2*time.Millisecond, 8*time.Millisecond, 120)
	verdict(t, h, &chaos.CheckOpts{Name: "negative-control-unguarded", Final: &final.Value}, true)
}

func TestRunRejectsBadConfig(t *testing.T) {
	t.Parallel()
	ctx := ctxFor(t, time.Minute)
	_, err := chaos.Run(ctx, chaos.WorkloadConfig{})
	require.ErrorContains(t, err, "needs a Locker and a Register")
	db := pgtest.NewDB(t)
	reg, err := chaos.NewSQLRegister(ctx, db.Pool, "r", true)
	require.NoError(t, err)
	lk, err := chaos.NewSimLocker(db.Pool, time.Second)
	require.NoError(t, err)
	_, err = chaos.Run(ctx, chaos.WorkloadConfig{Locker: lk, Register: reg})
	require.ErrorContains(t, err, "needs Ops or Duration")
	_, err = chaos.Run(ctx, chaos.WorkloadConfig{Locker: lk, Register: reg, Ops: -1})
	require.ErrorContains(t, err, "must not be negative")
	_, err = chaos.NewSimLocker(db.Pool, 0)
	require.Error(t, err)
	_, err = chaos.NewSQLRegister(ctx, db.Pool, "", true)
	require.Error(t, err)
}
