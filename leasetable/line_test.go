package leasetable_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence"
	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/leasetable"
)

// inLine counts the sessions holding (granted) or waiting for (not
// granted) the line key of semaphore sem.
func inLine(t *testing.T, db *pgtest.DB, sem string, granted bool) int {
	t.Helper()
	var n int
	require.NoError(t, db.Pool.QueryRow(context.Background(), `
SELECT count(*) FROM pg_catalog.pg_locks l,
    (SELECT `+leasetable.LineKeySQL+` AS k) h
WHERE l.locktype = 'advisory' AND l.objsubid = 1 AND l.mode = 'ExclusiveLock' AND l.granted = $2
  AND l.database = (SELECT oid FROM pg_catalog.pg_database WHERE datname = pg_catalog.current_database())
  AND l.classid::bigint = (h.k >> 32) & 4294967295 AND l.objid::bigint = h.k & 4294967295`, sem, granted).Scan(&n))
	return n
}

// waitInLine waits until want sessions hold (granted) or wait for the line
// key of sem.
func waitInLine(t *testing.T, db *pgtest.DB, sem string, granted bool, want int) {
	t.Helper()
	require.Eventually(t, func() bool { return inLine(t, db, sem, granted) == want },
		20*time.Second, 10*time.Millisecond, "%d sessions in the line of %q (granted %v)", want, sem, granted)
}

// queuedProbe asks for a permit of sem outside the line, as a caller of
// another Locker would, and reports whether it was refused because callers
// wait in the line. It takes nothing when the permit is held.
func queuedProbe(t *testing.T, db *pgtest.DB, sem string) bool {
	t.Helper()
	var acquired, queued bool
	require.NoError(t, db.Pool.QueryRow(context.Background(),
		`SELECT acquired, queued FROM pgfence.pgfence_acquire_permit($1, 1, 'probe', 1000000, false)`, sem).Scan(&acquired, &queued))
	require.False(t, acquired, "the probe found the permit free")
	return queued
}

// TestPermitLineAcrossLockers: a caller that waits for a permit in one
// Locker is not overtaken by a caller of another Locker that asks after it,
// even one that asks right after the release. Negative control: without the
// database's line, the newcomer takes the permit ahead of the waiter.
func TestPermitLineAcrossLockers(t *testing.T) {
	t.Parallel()
	run := func(t *testing.T, line bool) (bargedIn bool) {
		ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
		defer cancel()
		db := pgtest.NewDB(t)
		a := newLocker(t, db.NewPool(t, nil), &leasetable.Config{Owner: "waiter"})
		b := newLocker(t, db.NewPool(t, nil), &leasetable.Config{Owner: "newcomer"})
		// The waiter is woken only by its retry at the permit's expiry,
		// so that a newcomer right after the release always asks first:
		// no interest key, and its LISTEN connection's subscribing, which
		// may come after the release on a loaded machine, wakes no one.
		leasetable.SetNoInterest(a)
		leasetable.SetNoListenWake(a)
		waiting := make(chan struct{})
		var once sync.Once
		leasetable.SetOnListen(a, func() { once.Do(func() { close(waiting) }) })
		if !line {
			leasetable.SetNoDBLine(a)
		}
		held, err := b.TryAcquirePermit(ctx, "s", 1, &leasetable.AcquireOpts{TTL: 2 * time.Second})
		require.NoError(t, err)
		got := make(chan error, 1)
		var waited pgfence.Lease
		go func() {
			var err error
			waited, err = a.AcquirePermit(ctx, "s", 1, nil)
			got <- err
		}()
		select { // refused, a waits for the release
		case <-waiting:
		case <-ctx.Done():
			t.Fatal("the waiter never waited")
		}
		if line {
			// Its LISTEN connection listens from its first wait on, and
			// the line with it.
			waitInLine(t, db, "s", true, 1)
		}
		require.NoError(t, held.Release(ctx))
		// Short-lived too: the waiter retries at this one's expiry.
		l, err := b.TryAcquirePermit(ctx, "s", 1, &leasetable.AcquireOpts{TTL: 2 * time.Second})
		if err == nil {
			bargedIn = true
			require.NoError(t, l.Release(ctx))
		} else {
			require.ErrorIs(t, err, pgfence.ErrNotAcquired)
			require.ErrorContains(t, err, "callers are waiting for a permit")
		}
		require.NoError(t, <-got)
		require.NoError(t, waited.Release(ctx))
		if line {
			waitInLine(t, db, "s", true, 0) // left the line once served
		}
		return bargedIn
	}
	t.Run("line", func(t *testing.T) {
		t.Parallel()
		require.False(t, run(t, true), "a newcomer took the permit ahead of a caller waiting in the line")
	})
	t.Run("control", func(t *testing.T) {
		t.Parallel()
		require.True(t, run(t, false), "control: without the line the newcomer goes first")
	})
}

// TestPermitLineOrderAcrossLockers: callers of three Lockers that began to
// wait one after the other are served in that order, one per release.
func TestPermitLineOrderAcrossLockers(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	db := pgtest.NewDB(t)
	holder := newLocker(t, db.NewPool(t, nil), &leasetable.Config{Owner: "holder"})
	held, err := holder.TryAcquirePermit(ctx, "o", 1, nil)
	require.NoError(t, err)
	served := make(chan string, 3)
	failed := make(chan error, 3)
	released := make(chan error, 3)
	for i, owner := range []string{"first", "second", "third"} {
		k := newLocker(t, db.NewPool(t, nil), &leasetable.Config{Owner: owner})
		go func() {
			l, err := k.AcquirePermit(ctx, "o", 1, nil)
			if err != nil {
				failed <- err
				return
			}
			served <- owner
			time.Sleep(20 * time.Millisecond)
			released <- l.Release(ctx)
		}()
		// One session holds the line; the others wait for it in order.
		waitInLine(t, db, "o", true, 1)
		waitInLine(t, db, "o", false, i)
	}
	require.NoError(t, held.Release(ctx))
	for _, want := range []string{"first", "second", "third"} {
		select {
		case got := <-served:
			require.Equal(t, want, got)
		case err := <-failed:
			require.NoError(t, err)
		case <-ctx.Done():
			t.Fatal("not served in time")
		}
	}
	for range 3 {
		require.NoError(t, <-released)
	}
}

// TestPermitLinePausedHead: a process at the head of a line that stops
// answering (no pings) loses its place once its session has been idle for
// the line's idle timeout, so newcomers are no longer refused. Negative
// control: a head that pings keeps refusing them.
func TestPermitLinePausedHead(t *testing.T) {
	t.Parallel()
	run := func(t *testing.T, ping bool) (stillQueued bool) {
		ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
		defer cancel()
		db := pgtest.NewDB(t)
		crashedPermit(t, db, "p", 1, 20*time.Second)
		a := newLocker(t, db.NewPool(t, nil), &leasetable.Config{Owner: "paused"})
		if !ping {
			leasetable.SetNoDBLinePing(a)
		}
		go func() { _, _ = a.AcquirePermit(ctx, "p", 1, nil) }()
		waitInLine(t, db, "p", true, 1)
		require.True(t, queuedProbe(t, db, "p"), "newcomers are refused while the head waits")
		if !ping {
			// The server ends the silent session after the line's idle
			// timeout (5s).
			return !assert.Eventually(t, func() bool { return !queuedProbe(t, db, "p") }, 20*time.Second, 100*time.Millisecond)
		}
		time.Sleep(8 * time.Second) // past the idle timeout: a live head is still there
		return queuedProbe(t, db, "p")
	}
	t.Run("paused", func(t *testing.T) {
		t.Parallel()
		require.False(t, run(t, false), "a paused head still blocks the line")
	})
	t.Run("control", func(t *testing.T) {
		t.Parallel()
		require.True(t, run(t, true), "control: a live head keeps its place")
	})
}
