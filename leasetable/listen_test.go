package leasetable_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence"
	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/leasetable"
)

// listenerQueries returns the last statement of the LISTEN connections of the
// database: "LISTEN ..." while subscribed, "UNLISTEN ..." after, naming
// NotifyChannel (the Locker's grant channel, which follows it in the same
// statement, is cut off).
func listenerQueries(t *testing.T, db *pgtest.DB) []string {
	t.Helper()
	rows, err := db.Pool.Query(context.Background(), `SELECT query FROM pg_stat_activity
		WHERE datname = current_database() AND (query LIKE 'LISTEN %' OR query LIKE 'UNLISTEN %') ORDER BY pid`)
	require.NoError(t, err)
	defer rows.Close()
	var qs []string
	for rows.Next() {
		var q string
		require.NoError(t, rows.Scan(&q))
		q, _, _ = strings.Cut(q, ";")
		qs = append(qs, q)
	}
	require.NoError(t, rows.Err())
	return qs
}

// TestListenOnlyWhileWaiting: a Locker's LISTEN connection is subscribed
// only while one of its calls waits for a release, and for about a second
// after (listenLinger); a Locker with nothing waiting is not signalled by
// the releases of the database. Control: while a call waits, asking
// again (as the linger's end does) keeps it subscribed.
func TestListenOnlyWhileWaiting(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.NewDB(t)
	waiter := newLocker(t, db.NewPool(t, nil), nil)
	leasetable.TrackListenAsks(waiter)
	holder := newLocker(t, db.Pool, &leasetable.Config{TTL: time.Minute})

	// An Acquire that is granted at once opens the connection, which does
	// not stay subscribed.
	warm, err := waiter.Acquire(ctx, "warm", nil)
	require.NoError(t, err)
	require.NoError(t, warm.Release(ctx))
	require.Eventually(t, func() bool {
		qs := listenerQueries(t, db)
		return len(qs) == 1 && qs[0] == `UNLISTEN "pgfence_lease_released"` && !waiter.Stats().Listening
	}, 30*time.Second, 10*time.Millisecond, "the idle Locker unsubscribed")

	// A waiting call subscribes it, for as long as it waits (the control:
	// asked again while the call waits, with no linger left from before
	// (the warm-up never waited), the connection stays subscribed).
	l, err := holder.TryAcquire(ctx, "x", nil)
	require.NoError(t, err)
	got := acquireAsync(waiter, "x", 30*time.Second)
	require.Eventually(t, func() bool { return waiter.Stats().Listening }, 30*time.Second, 5*time.Millisecond)
	asked, _ := leasetable.ListenAsked(waiter)
	leasetable.KickListen(waiter)
	var stay bool
	require.Eventually(t, func() bool {
		var n int64
		n, stay = leasetable.ListenAsked(waiter)
		return n > asked
	}, 30*time.Second, 5*time.Millisecond, "asked again")
	require.True(t, stay, "told to stay subscribed while a call waits")
	require.True(t, waiter.Stats().Listening)
	require.Equal(t, []string{`LISTEN "pgfence_lease_released"`}, listenerQueries(t, db))
	require.NoError(t, l.Release(ctx))
	r := <-got
	require.NoError(t, r.err)
	require.NoError(t, r.l.Release(ctx))

	// Once no call waits, it unsubscribes again.
	require.Eventually(t, func() bool { return !waiter.Stats().Listening }, 30*time.Second, 10*time.Millisecond)
	require.Equal(t, []string{`UNLISTEN "pgfence_lease_released"`}, listenerQueries(t, db))
}

// TestReleaseBeforeSubscribingIsNotMissed: a release committed after a
// waiter's refused attempt but before its Locker's LISTEN connection
// subscribed is announced to nobody there; the subscription wakes the
// waiter, which tries again and takes the lease at once, not at the
// holder's expiry. Negative control: when subscribing wakes nobody, the
// waiter sleeps until its WaitTimeout (taking the name's interest key, which
// also wakes it, is switched off too).
func TestReleaseBeforeSubscribingIsNotMissed(t *testing.T) {
	t.Parallel()
	for _, wake := range []bool{true, false} {
		name := "woken"
		if !wake {
			name = "control: not woken"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			db := pgtest.NewDB(t)
			waiter := newLocker(t, db.NewPool(t, nil), nil)
			holder := newLocker(t, db.Pool, &leasetable.Config{TTL: time.Minute})
			if !wake {
				leasetable.SetNoListenWake(waiter)
				leasetable.SetNoArmWake(waiter)
			}
			// The holder's lease is released as the waiter first waits for
			// notifications: after its refusal, before it subscribes.
			var (
				l    pgfence.Lease
				once sync.Once
			)
			leasetable.SetOnListen(waiter, func() {
				once.Do(func() { require.NoError(t, l.Release(ctx)) })
			})
			// The LISTEN connection is open, and unsubscribed, before the
			// wait (an Acquire granted at once does not wait).
			warm, err := waiter.Acquire(ctx, "warm", nil)
			require.NoError(t, err)
			require.NoError(t, warm.Release(ctx))
			require.Eventually(t, func() bool {
				qs := listenerQueries(t, db)
				return len(qs) == 1 && qs[0] == `UNLISTEN "pgfence_lease_released"`
			}, 30*time.Second, 10*time.Millisecond)

			l, err = holder.TryAcquire(ctx, "x", nil)
			require.NoError(t, err)
			r := <-acquireAsync(waiter, "x", 3*time.Second)
			if wake {
				require.NoError(t, r.err)
				require.Greater(t, r.l.Token(), l.Token())
				require.NoError(t, r.l.Release(ctx))
				return
			}
			require.ErrorIs(t, r.err, pgfence.ErrNotAcquired, "the release was missed")
			require.ErrorIs(t, r.err, context.DeadlineExceeded)
		})
	}
}
