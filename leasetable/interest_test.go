package leasetable_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence"
	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/leasetable"
)

// releaseCounter counts the notifications on leasetable.NotifyChannel in
// a session of its own.
type releaseCounter struct {
	t      *testing.T
	db     *pgtest.DB
	conn   *pgx.Conn
	marker int
}

func newReleaseCounter(t *testing.T, db *pgtest.DB) *releaseCounter {
	t.Helper()
	conn, err := pgx.Connect(t.Context(), db.URL)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	_, err = conn.Exec(t.Context(), "LISTEN "+leasetable.NotifyChannel)
	require.NoError(t, err)
	return &releaseCounter{t: t, db: db, conn: conn}
}

// since returns how many release notifications were sent since the last
// call: it counts up to a marker notification it sends itself, which
// arrives after every notification committed before it.
func (c *releaseCounter) since() int {
	c.t.Helper()
	c.marker++
	marker := fmt.Sprintf("marker-%d", c.marker)
	_, err := c.db.Pool.Exec(c.t.Context(), "SELECT pg_notify($1, $2)", leasetable.NotifyChannel, marker)
	require.NoError(c.t, err)
	n := 0
	for {
		msg, err := c.conn.WaitForNotification(c.t.Context())
		require.NoError(c.t, err)
		switch {
		case msg.Payload == marker:
			return n
		case !strings.HasPrefix(msg.Payload, "\x1fpgfence-listen-probe "): // a LISTEN connection's self-test
			n++
		}
	}
}

// interestKeys returns how many interest keys sessions of db hold shared.
func interestKeys(t *testing.T, db *pgtest.DB) int {
	t.Helper()
	var n int
	require.NoError(t, db.Pool.QueryRow(t.Context(), `SELECT count(*) FROM pg_locks
		WHERE locktype = 'advisory' AND classid = $1 AND objsubid = 2 AND mode = 'ShareLock' AND granted
		  AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`,
		uint32(leasetable.InterestClassID)).Scan(&n))
	return n
}

// TestUncontendedCyclesNotifyNobody: 300 acquire/release cycles nobody
// waits for send no notification, even while another Locker of the
// database listens and waits for another name; a release someone waits for
// (here a Locker of another pool) sends one. Negative control: a release
// that a waiter without an interest key waits for sends none.
func TestUncontendedCyclesNotifyNobody(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	db := pgtest.NewDB(t)
	count := newReleaseCounter(t, db)
	holder := newLocker(t, db.Pool, &leasetable.Config{TTL: time.Minute})
	other := newLocker(t, db.NewPool(t, nil), nil)

	blocker, err := holder.TryAcquire(ctx, "elsewhere", nil)
	require.NoError(t, err)
	elsewhere := acquireAsync(other, "elsewhere", time.Minute)
	require.Eventually(t, func() bool { return other.Stats().Listening }, 30*time.Second, 5*time.Millisecond)

	for range 300 {
		l, err := holder.TryAcquire(ctx, "quiet", nil)
		require.NoError(t, err)
		require.NoError(t, l.Release(ctx))
	}
	require.Zero(t, count.since(), "uncontended releases notify nobody")

	require.NoError(t, blocker.Release(ctx))
	r := <-elsewhere
	require.NoError(t, r.err)
	require.Equal(t, 1, count.since(), "a release someone waited for notifies")
	require.Eventually(t, func() bool { return interestKeys(t, db) == 0 }, 30*time.Second, 5*time.Millisecond)
	require.NoError(t, r.l.Release(ctx))
	require.Zero(t, count.since(), "nobody waits any more")

	// The control: a waiter that takes no interest key, listening and
	// waiting, is not notified of the release (the waiter above was). What
	// it then does depends on when its own attempts ran, so only the
	// notification is checked.
	deaf := newLocker(t, db.NewPool(t, nil), nil)
	leasetable.SetNoInterest(deaf)
	l, err := holder.TryAcquire(ctx, "quiet", nil)
	require.NoError(t, err)
	got := acquireAsync(deaf, "quiet", 3*time.Second)
	require.Eventually(t, func() bool { return deaf.Stats().Listening && leasetable.Waiters(deaf, "quiet") == 1 },
		30*time.Second, 5*time.Millisecond)
	require.NoError(t, l.Release(ctx))
	require.Zero(t, count.since(), "control: without an interest key a waiter's release notifies nobody")
	r = <-got
	if r.err == nil {
		require.NoError(t, r.l.Release(ctx))
	}
}

// TestReleaseAsWaiterRegisters forces the race of a release with a waiter
// that is registering: the holder (another Locker) releases after the
// waiter's refused attempt, while its Locker's LISTEN connection, already
// subscribed for another name, is about to take the name's interest key.
// The release finds no interest and notifies nobody; taking the key wakes
// the waiter, whose next attempt takes the lease at once rather than at
// the holder's expiry (a minute). Negative control: when taking the key
// wakes nobody, the waiter waits for its WaitTimeout.
func TestReleaseAsWaiterRegisters(t *testing.T) {
	t.Parallel()
	for _, wake := range []bool{true, false} {
		t.Run(fmt.Sprintf("wake=%t", wake), func(t *testing.T) {
			t.Parallel()
			ctx := t.Context()
			db := pgtest.NewDB(t)
			count := newReleaseCounter(t, db)
			holder := newLocker(t, db.Pool, &leasetable.Config{TTL: time.Minute})
			waiter := newLocker(t, db.NewPool(t, nil), nil)
			leasetable.SetNoListenWake(waiter) // the LISTEN connection is subscribed before the race anyway
			if !wake {
				leasetable.SetNoArmWake(waiter)
			}
			var (
				l       pgfence.Lease
				mu      sync.Mutex
				armed   = make(chan struct{})
				release = false
			)
			leasetable.SetOnArm(waiter, func(names []string) {
				mu.Lock()
				defer mu.Unlock()
				if release && slices.Contains(names, "x") {
					release = false
					require.NoError(t, l.Release(ctx))
					close(armed)
				}
			})

			// The waiter's LISTEN connection listens, for "other".
			blocker, err := holder.TryAcquire(ctx, "other", nil)
			require.NoError(t, err)
			other := acquireAsync(waiter, "other", time.Minute)
			require.Eventually(t, func() bool { return waiter.Stats().Listening }, 30*time.Second, 5*time.Millisecond)

			l, err = holder.TryAcquire(ctx, "x", nil)
			require.NoError(t, err)
			mu.Lock()
			release = true
			mu.Unlock()
			r := <-acquireAsync(waiter, "x", 3*time.Second)
			waitFor(t, armed, "the release in the race")
			require.Zero(t, count.since(), "the release found no interest")
			if wake {
				require.NoError(t, r.err)
				require.Greater(t, r.l.Token(), l.Token())
				require.NoError(t, r.l.Release(ctx))
			} else {
				require.ErrorIs(t, r.err, pgfence.ErrNotAcquired, "control: the waiter missed the release")
				require.ErrorIs(t, r.err, context.DeadlineExceeded)
			}
			require.NoError(t, blocker.Release(ctx))
			r = <-other
			require.NoError(t, r.err)
			require.NoError(t, r.l.Release(ctx))
		})
	}
}

// TestInterestKeyOnlyWhileWaiting: a Locker holds a name's interest key
// only while a call waits for it (and for interestLinger after), so that
// releases after the wait notify nobody.
func TestInterestKeyOnlyWhileWaiting(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	db := pgtest.NewDB(t)
	holder := newLocker(t, db.Pool, &leasetable.Config{TTL: time.Minute})
	waiter := newLocker(t, db.NewPool(t, nil), nil)
	keys := func() int { return interestKeys(t, db) }
	l, err := holder.TryAcquire(ctx, "x", nil)
	require.NoError(t, err)
	got := acquireAsync(waiter, "x", time.Minute)
	require.Eventually(t, func() bool { return keys() == 1 }, 30*time.Second, 5*time.Millisecond, "the waiter's key")
	require.NoError(t, l.Release(ctx))
	r := <-got
	require.NoError(t, r.err)
	require.Eventually(t, func() bool { return keys() == 0 }, 30*time.Second, 5*time.Millisecond, "released once nobody waits")
	require.NoError(t, r.l.Release(ctx))
}
