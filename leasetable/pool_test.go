package leasetable_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence"
	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/leasetable"
)

const smallPoolWarn = "the pool has MaxConns 1"

// A pool of one: New warns; a TryAcquire inside the caller's own
// transaction (which holds the only connection) fails after QueryTimeout
// with an error naming the exhausted pool, instead of waiting for as long
// as its context lasts; a renewal that cannot get the connection is
// reported as such, and the lease is lost at its local deadline; a release
// fails after QueryTimeout, with a Warn, and succeeds when tried again. Control:
// with MaxConns 2, no warning, and the same TryAcquire succeeds.
func TestPoolOfOne(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	db := pgtest.NewDB(t)
	const queryTimeout = 300 * time.Millisecond

	t.Run("MaxConns 1", func(t *testing.T) {
		pool := db.NewPool(t, func(c *pgxpool.Config) { c.MaxConns = 1 })
		logs := newLogWatch()
		logs.count(smallPoolWarn)
		k := newLocker(t, pool, &leasetable.Config{TTL: time.Second, QueryTimeout: queryTimeout, Logger: logs.logger()})
		require.Equal(t, 1, logs.count(smallPoolWarn), "New warns")

		tx, err := pool.Begin(ctx)
		require.NoError(t, err)
		_, err = k.TryAcquire(context.Background(), "in-tx", nil) // no deadline of its own
		require.ErrorIs(t, err, context.DeadlineExceeded)
		require.ErrorContains(t, err, "pool exhausted: MaxConns 1, acquired 1")
		require.NoError(t, tx.Rollback(ctx))

		l, err := k.TryAcquire(ctx, "renewed", nil)
		require.NoError(t, err)
		c, err := pool.Acquire(ctx) // the caller's long query on the only connection
		require.NoError(t, err)
		waitFor(t, l.Done(), "the lease to be lost")
		c.Release()
		// The renewal's last attempt waits for the connection until the
		// lease's local deadline, the moment it is lost: it may get the
		// connection just released and have its statement cut by that
		// deadline, which closes the connection, and the pool dials another
		// (in the container path it took past QueryTimeout). Wait for a
		// connection without QueryTimeout's bound, so that the acquire below
		// does not race that attempt.
		c, err = pool.Acquire(ctx)
		require.NoError(t, err)
		c.Release()
		require.ErrorIs(t, l.Err(), pgfence.ErrLeaseLost)
		require.Contains(t, logs.warnings(), "renewal could not get a connection from the pool within")
		require.Contains(t, logs.warnings(), "pool exhausted: MaxConns 1, acquired 1")

		l, err = k.TryAcquire(ctx, "released", nil)
		require.NoError(t, err)
		c, err = pool.Acquire(ctx)
		require.NoError(t, err)
		held := c
		t.Cleanup(func() { // before the pool's Close, which waits for it, should a check below fail
			if held != nil {
				held.Release()
			}
		})
		warned := logs.next("release could not get a connection from the pool")
		require.ErrorIs(t, l.Release(ctx), context.DeadlineExceeded, "bounded by QueryTimeout")
		waitFor(t, warned, "the release's warning")
		c.Release()
		held = nil
		_ = l.Release(ctx) // a later call tries again (and reports ErrNotHeld: the first call ended the lease locally)
		other := newLocker(t, db.Pool, nil)
		l, err = other.TryAcquire(ctx, "released", nil)
		require.NoError(t, err, "the retried release freed the row")
		require.NoError(t, l.Release(ctx))
	})

	t.Run("control: MaxConns 2", func(t *testing.T) {
		pool := db.NewPool(t, func(c *pgxpool.Config) { c.MaxConns = 2 })
		logs := newLogWatch()
		logs.count(smallPoolWarn)
		k := newLocker(t, pool, &leasetable.Config{TTL: time.Second, QueryTimeout: queryTimeout, Logger: logs.logger()})
		require.Zero(t, logs.count(smallPoolWarn))
		tx, err := pool.Begin(ctx)
		require.NoError(t, err)
		l, err := k.TryAcquire(ctx, "in-tx", nil)
		require.NoError(t, err)
		require.NoError(t, tx.Rollback(ctx))
		require.NoError(t, l.Release(ctx))
	})
}

// TestLateRenewalNotSent: a renewal stops waiting for the pool's connection
// once less time is left before the lease's local deadline than the
// Locker's fastest renewal round trip, and sends nothing then, so the
// connection survives the lease's loss. The renewal is made slow for
// certain (another transaction holds the lease's table lock) and the
// fastest round trip is set to 2s; the test holds the pool's only
// connection, which the renewal waits for from 500ms on, and hands it back
// 1.5s before the deadline (a time target, not an ordering: the renewal
// waits for the connection, and in the control takes it, whenever it comes
// before the deadline; the 1.5s leave the control time to send on a loaded
// machine). Negative control: a Locker that sends late
// renewals takes the connection, has its statement cut at the deadline,
// and pgx closes the connection with it (the pool dials a new one). Also:
// an answered renewal records its round trip as the fastest so far.
func TestLateRenewalNotSent(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	db := pgtest.NewDB(t)

	// run loses a lease as described and reports whether the pool's
	// connection afterwards is the one it had before.
	run := func(t *testing.T, name string, sendLate bool) (same bool) {
		pool := db.NewPool(t, func(c *pgxpool.Config) { c.MaxConns = 1 })
		k := newLocker(t, pool, &leasetable.Config{TTL: 3 * time.Second, RenewInterval: 500 * time.Millisecond,
			SafetyMargin: 300 * time.Millisecond, QueryTimeout: 10 * time.Second})
		leasetable.SetFastestRenewal(k, 2*time.Second)
		if sendLate {
			leasetable.SetSendLateRenewals(k)
		}
		l, err := k.TryAcquire(ctx, name, nil)
		require.NoError(t, err)
		blocker, err := db.Pool.Begin(ctx)
		require.NoError(t, err)
		defer func() { _ = blocker.Rollback(ctx) }()
		// A table lock, which the renewal waits for (a row lock it would
		// skip, reporting the lease busy).
		_, err = blocker.Exec(ctx, "LOCK TABLE pgfence.pgfence_leases IN EXCLUSIVE MODE")
		require.NoError(t, err)
		c, err := pool.Acquire(ctx)
		require.NoError(t, err)
		pid := c.Conn().PgConn().PID()
		time.Sleep(time.Until(l.Expiry().Add(-1500 * time.Millisecond)))
		c.Release()
		waitFor(t, l.Done(), "the lease to be lost")
		require.ErrorIs(t, l.Err(), pgfence.ErrLeaseLost)
		require.NoError(t, blocker.Rollback(ctx))
		// A statement cut at the deadline has its connection closed by
		// then or moments later (pgx closes it asynchronously): wait for
		// the pool to hold no closed connection before looking.
		require.Eventually(t, func() bool {
			c, err := pool.Acquire(ctx)
			if err != nil {
				return false
			}
			defer c.Release()
			return !c.Conn().IsClosed()
		}, 10*time.Second, 10*time.Millisecond)
		c, err = pool.Acquire(ctx)
		require.NoError(t, err)
		defer c.Release()
		return c.Conn().PgConn().PID() == pid
	}
	require.True(t, run(t, "late", false), "the connection survives")
	require.False(t, run(t, "late-sent", true), "negative control: the cut statement's connection is closed")

	k := newLocker(t, db.Pool, nil)
	l, err := k.TryAcquire(ctx, "timed", nil)
	require.NoError(t, err)
	require.Zero(t, leasetable.FastestRenewal(k))
	start := time.Now()
	require.NoError(t, l.Renew(ctx))
	took := time.Since(start)
	require.Greater(t, leasetable.FastestRenewal(k), time.Duration(0))
	require.LessOrEqual(t, leasetable.FastestRenewal(k), took)
	require.NoError(t, l.Release(ctx))
}
