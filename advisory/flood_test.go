package advisory_test

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence/advisory"
	"github.com/pgfence/pgfence/internal/pgtest"
)

// floodAttempts has a waiter of key wait, armed for wake-ups, while a
// role with no pgfence grant sends n forged notifications naming the key,
// and returns the attempts the waiter made meanwhile and how long the
// flood lasted. configure adjusts the waiter.
func floodAttempts(t *testing.T, n int, configure func(*advisory.Locker)) (attempts int64, elapsed time.Duration) {
	t.Helper()
	ctx := context.Background()
	db := pgtest.NewDB(t)
	key := advisory.Name("flooded")
	held, err := newHolder(t, db).TryAcquireKey(ctx, key, nil)
	require.NoError(t, err)
	w := newWaiter(t, db, "flood", false)
	var refused atomic.Int64
	advisory.SetOnRefused(w, func() { refused.Add(1) })
	configure(w)

	wctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		_, err := w.AcquireKey(wctx, key, nil)
		done <- err
	}()
	require.Eventually(t, func() bool {
		return advisory.Registered(w, key) && len(interestHolders(t, db.Pool, key)) == 1
	}, 30*time.Second, 5*time.Millisecond, "the waiter is armed for wake-ups")

	forger := newRole(t, db, "forger")
	fpool := db.NewPool(t, func(c *pgxpool.Config) { c.ConnConfig.User = forger; c.MaxConns = 1 })
	payload := strconv.FormatInt(key.Int64(), 10)
	before := refused.Load()
	start := time.Now()
	for range n {
		_, err := fpool.Exec(ctx, "SELECT pg_catalog.pg_notify($1, $2)", advisory.NotifyChannel, payload)
		require.NoError(t, err)
	}
	elapsed = time.Since(start)
	attempts = refused.Load() - before
	cancel()
	require.Error(t, <-done)
	require.NoError(t, held.Release(ctx))
	return attempts, elapsed
}

// A flood of forged notifications costs a waiting Locker at most one
// attempt per 25ms; without the bound (the control) it costs many more.
func TestForgedNotificationFlood(t *testing.T) {
	t.Parallel()
	const n = 5000
	attempts, elapsed := floodAttempts(t, n, func(*advisory.Locker) {})
	bound := int64(elapsed/(25*time.Millisecond)) + 2
	t.Logf("bounded: %d attempts for %d notifications in %v (bound %d)", attempts, n, elapsed, bound)
	require.LessOrEqual(t, attempts, bound)

	ctlAttempts, ctlElapsed := floodAttempts(t, n, func(w *advisory.Locker) { advisory.SetWakeGap(w, 0) })
	ctlBound := int64(ctlElapsed/(25*time.Millisecond)) + 2
	t.Logf("control: %d attempts for %d notifications in %v (bound %d)", ctlAttempts, n, ctlElapsed, ctlBound)
	require.Greater(t, ctlAttempts, 2*ctlBound, "without the bound, the flood costs many more attempts")
}

// The first wake-up after a quiet spell, as after a real unlock, is not
// delayed by the bound, however long it is.
func TestFirstWakeNotDelayed(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.NewDB(t)
	key := advisory.Name("wake-first")
	held, err := newHolder(t, db).TryAcquireKey(ctx, key, nil)
	require.NoError(t, err)
	w := newWaiter(t, db, "wake-first", false)
	advisory.SetWakeGap(w, time.Hour)
	waits := make(chan time.Duration, 8)
	advisory.SetOnWake(w, func(d time.Duration) { waits <- d })

	done := make(chan error, 1)
	go func() {
		l, err := w.AcquireKey(ctx, key, nil)
		if err == nil {
			err = l.Release(ctx)
		}
		done <- err
	}()
	require.Eventually(t, func() bool {
		return advisory.Registered(w, key) && len(interestHolders(t, db.Pool, key)) == 1
	}, 30*time.Second, 5*time.Millisecond)
	require.NoError(t, held.Release(ctx))
	require.LessOrEqual(t, <-waits, time.Duration(0), "the wake-up after the unlock waits for nothing")
	require.NoError(t, <-done)
}
