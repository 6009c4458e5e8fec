package leasetable_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/leasetable"
)

// An AtLeast release wakes a waiter of another Locker: the release moves the
// row's expiry forward to acquired_at + AtLeast, and the waiter, which had
// planned its retry at the old expiry, takes the lease at the AtLeast end.
// Negative control: without the release's notification (before 0.1.0's
// fix, pgfence_release notified only rows freed at once), the waiter
// acquires at the old expiry and the first assertion fails.
func TestAtLeastReleaseWakesRemoteWaiter(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	db := pgtest.NewDB(t)
	const ttl, atLeast = 4 * time.Second, 600 * time.Millisecond
	holder := newLocker(t, db.Pool, &leasetable.Config{TTL: ttl})
	logs := newLogWatch()
	waiter := newLocker(t, db.NewPool(t, nil), &leasetable.Config{TTL: ttl, Logger: logs.logger()})

	// Warm up the waiter's LISTEN connection, so that no reconnect wakes it
	// during the measured wait.
	warm, err := holder.TryAcquire(ctx, "warm-up", nil)
	require.NoError(t, err)
	listening := logs.next("LISTEN connection ready")
	got := acquireAsync(waiter, "warm-up", 10*time.Second)
	waitFor(t, listening, "the listener")
	require.NoError(t, warm.Release(ctx))
	r := <-got
	require.NoError(t, r.err)
	require.NoError(t, r.l.Release(ctx))

	l, err := holder.TryAcquire(ctx, "at-least", &leasetable.AcquireOpts{AtLeast: atLeast})
	require.NoError(t, err)
	before, ok, err := holder.Get(ctx, "at-least")
	require.NoError(t, err)
	require.True(t, ok)
	waiting := logs.next("waiting for lease")
	got = acquireAsync(waiter, "at-least", 30*time.Second)
	waitFor(t, waiting, "the waiter to wait")
	require.NoError(t, l.Release(ctx))
	r = <-got
	require.NoError(t, r.err)
	defer func() { require.NoError(t, r.l.Release(ctx)) }()
	acquiredAt := r.l.(*leasetable.Lease).AcquiredAt()
	atLeastEnd := l.(*leasetable.Lease).AcquiredAt().Add(atLeast)
	require.True(t, acquiredAt.Before(before.ExpiresAt),
		"the waiter acquired at %v, not before the old expiry %v: the AtLeast release did not wake it", acquiredAt, before.ExpiresAt)
	require.False(t, acquiredAt.Before(atLeastEnd), "acquired at %v, before the AtLeast end %v", acquiredAt, atLeastEnd)
	t.Logf("waiter acquired %v after the AtLeast end (database clock); the old expiry was %v later",
		acquiredAt.Sub(atLeastEnd), before.ExpiresAt.Sub(atLeastEnd))
}

// Hand-over between two callers of one Locker without LISTEN: the release
// wakes the local waiter, which takes the lease long before the released
// lease's expiry (the TTL is far longer than the whole test's bound on
// each hand-over).
func TestLocalHandOverWithoutListen(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	db := pgtest.NewDB(t)
	logs := newLogWatch()
	k := newLocker(t, db.Pool, &leasetable.Config{TTL: 20 * time.Second, DisableListen: true, Logger: logs.logger()})
	l, err := k.TryAcquire(ctx, "local", nil)
	require.NoError(t, err)
	var worst time.Duration
	for i := range 5 {
		waiting := logs.next("waiting for lease")
		got := acquireAsync(k, "local", 30*time.Second)
		waitFor(t, waiting, "the waiter to wait")
		released := time.Now()
		require.NoError(t, l.Release(ctx))
		r := <-got
		require.NoError(t, r.err, "hand-over %d", i)
		worst = max(worst, time.Since(released))
		next := r.l.(*leasetable.Lease)
		require.Greater(t, next.Token(), l.Token())
		require.True(t, next.AcquiredAt().Before(l.(*leasetable.Lease).AcquiredAt().Add(20*time.Second)))
		l = next
	}
	require.NoError(t, l.Release(ctx))
	t.Logf("slowest of 5 hand-overs with DisableListen: %v (from Release to the waiter's Acquire returning)", worst)
}
