package leasetable_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence"
	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/leasetable"
)

// restartBundle is a dedicated server that a test stops and starts, with
// a database and a pool on it.
type restartBundle struct {
	cluster *pgtest.Cluster
	db      *pgtest.DB
	pool    *pgxpool.Pool
}

func setupRestart(t *testing.T) *restartBundle {
	t.Helper()
	c, srv := pgtest.NewCluster(t, nil)
	db := srv.NewDB(t)
	pool := db.NewPool(t, func(c *pgxpool.Config) { c.ConnConfig.ConnectTimeout = 2 * time.Second })
	return &restartBundle{cluster: c, db: db, pool: pool}
}

// TestAcquireRidesThroughARestart: while the server is down (a fast
// shutdown, as in a switchover), Acquire retries and is granted once the
// server is back; TryAcquire gives up after QueryTimeout with
// ErrUnavailable wrapping the cause; an Acquire whose WaitTimeout ends
// during the outage matches ErrUnavailable, ErrNotAcquired and
// DeadlineExceeded. Negative control: without retries, Acquire fails at
// the first error, which is no ErrUnavailable.
func TestAcquireRidesThroughARestart(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setupRestart(t)
	logs := newLogWatch()
	k := newLocker(t, b.pool, &leasetable.Config{QueryTimeout: 500 * time.Millisecond, Logger: logs.logger()})
	noRetry, err := leasetable.New(ctx, b.pool, &leasetable.Config{QueryTimeout: 500 * time.Millisecond})
	require.NoError(t, err)
	leasetable.SetNoRetry(noRetry)
	t.Cleanup(noRetry.Close)

	require.NoError(t, b.cluster.Stop())

	_, err = k.TryAcquire(ctx, "try", nil)
	require.ErrorIs(t, err, pgfence.ErrUnavailable)
	require.NotErrorIs(t, err, pgfence.ErrNotAcquired)
	require.True(t, strings.Contains(err.Error(), "connect"), "the cause is kept: %v", err)

	_, err = k.Acquire(ctx, "timeout", &leasetable.AcquireOpts{WaitTimeout: 300 * time.Millisecond})
	require.ErrorIs(t, err, pgfence.ErrUnavailable)
	require.ErrorIs(t, err, pgfence.ErrNotAcquired)
	require.ErrorIs(t, err, context.DeadlineExceeded)

	_, err = noRetry.Acquire(ctx, "control", &leasetable.AcquireOpts{WaitTimeout: time.Minute})
	require.Error(t, err, "negative control: the first error is returned")
	require.NotErrorIs(t, err, pgfence.ErrUnavailable)
	require.NotErrorIs(t, err, pgfence.ErrNotAcquired)

	retrying := logs.next("acquire failed; retrying")
	got := acquireAsync(k, "rides", time.Minute)
	waitFor(t, retrying, "a failed attempt")
	require.NoError(t, b.cluster.Start(ctx))
	up := time.Now()
	r := <-got
	require.NoError(t, r.err)
	t.Logf("first grant %v after the server accepted connections again", time.Since(up).Round(time.Millisecond))
	require.NoError(t, r.l.Err())
	require.NoError(t, r.l.Release(ctx))
}

// TestReleaseIsRetriedInTheBackground: a Release while the server is down
// returns ErrUnavailable and is retried in the background; once the
// server is back the lease is free long before its TTL. Negative control:
// without retries, the row is still held after the restart.
func TestReleaseIsRetriedInTheBackground(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, retried := range []bool{true, false} {
		t.Run(map[bool]string{true: "retried", false: "control"}[retried], func(t *testing.T) {
			b := setupRestart(t)
			logs := newLogWatch()
			k := newLocker(t, b.pool, &leasetable.Config{
				TTL: time.Minute, QueryTimeout: 300 * time.Millisecond, Logger: logs.logger(), DisableListen: true,
			})
			if !retried {
				leasetable.SetNoRetry(k)
			}
			l, err := k.TryAcquire(ctx, "held", nil)
			require.NoError(t, err)
			require.NoError(t, b.cluster.Stop())
			released := logs.next("released after retrying")
			err = l.Release(ctx)
			require.Error(t, err)
			require.Equal(t, retried, errors.Is(err, pgfence.ErrUnavailable), "%v", err)
			require.ErrorIs(t, l.Err(), pgfence.ErrNotHeld, "released locally at once")
			require.NoError(t, b.cluster.Start(ctx))
			up := time.Now()

			if retried {
				waitFor(t, released, "the background release")
				t.Logf("released %v after the server accepted connections again", time.Since(up).Round(time.Millisecond))
				require.NoError(t, l.Release(ctx), "a later Release learns the outcome")
			}
			var held bool
			require.NoError(t, b.db.Pool.QueryRow(ctx,
				"SELECT expires_at > now() FROM pgfence.pgfence_leases WHERE name = 'held'").Scan(&held))
			require.Equal(t, !retried, held)
		})
	}
}

// delayAcquires is a tracer that holds every acquire statement's end
// (before its result is used) for delay, as a commit waiting for a slow
// synchronous standby would.
type delayAcquires struct{ delay atomic.Int64 }

type sqlKey struct{}

func (d *delayAcquires) TraceQueryStart(ctx context.Context, _ *pgx.Conn, q pgx.TraceQueryStartData) context.Context {
	return context.WithValue(ctx, sqlKey{}, q.SQL)
}

func (d *delayAcquires) TraceQueryEnd(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryEndData) {
	if sql, _ := ctx.Value(sqlKey{}).(string); strings.Contains(sql, "pgfence_acquire(") {
		time.Sleep(time.Duration(d.delay.Load()))
	}
}

// TestLateGrantIsNotReturned: a grant whose answer arrives after the
// lease's local deadline is given back and reported as not acquired,
// never returned with Done closed; the negative control is the same
// acquire answered in time.
func TestLateGrantIsNotReturned(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.NewDB(t)
	tracer := &delayAcquires{}
	pool := db.NewPool(t, func(c *pgxpool.Config) { c.ConnConfig.Tracer = tracer })
	k := newLocker(t, pool, &leasetable.Config{TTL: 200 * time.Millisecond, DisableListen: true})

	held := func() bool {
		var held bool
		require.NoError(t, db.Pool.QueryRow(ctx,
			"SELECT expires_at > now() FROM pgfence.pgfence_leases WHERE name = 'late'").Scan(&held))
		return held
	}
	tracer.delay.Store(int64(400 * time.Millisecond))
	_, err := k.TryAcquire(ctx, "late", nil)
	require.ErrorIs(t, err, pgfence.ErrNotAcquired)
	require.ErrorContains(t, err, "past its local deadline")
	require.False(t, held(), "given back")

	// Acquire keeps trying; each late grant is given back. The last
	// attempt may still be in flight when the wait ends: Close waits for
	// it (and its give-back).
	other, err := leasetable.New(ctx, pool, &leasetable.Config{TTL: 200 * time.Millisecond, DisableListen: true})
	require.NoError(t, err)
	_, err = other.Acquire(ctx, "late", &leasetable.AcquireOpts{WaitTimeout: time.Second})
	require.ErrorIs(t, err, pgfence.ErrNotAcquired)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	other.Close()
	require.False(t, held(), "given back")

	tracer.delay.Store(0)
	l, err := k.TryAcquire(ctx, "late", nil)
	require.NoError(t, err, "negative control: answered in time")
	require.NoError(t, l.Err())
	require.NoError(t, l.Release(ctx))
}

// TestRenewalAttemptTimesOutOnADeadConnection: when the pool's
// connections stall silently (a cut without a reset), a renewal attempt
// costs QueryTimeout, not the lease: the next attempt opens a new
// connection and the lease is kept. Negative control: with a QueryTimeout
// longer than the TTL, the one attempt hangs until the local deadline and
// the lease is lost.
func TestRenewalAttemptTimesOutOnADeadConnection(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, kept := range []bool{true, false} {
		t.Run(map[bool]string{true: "kept", false: "control"}[kept], func(t *testing.T) {
			db := pgtest.NewDB(t)
			proxy, proxied := newDBProxy(t, db)
			pool := db.NewPool(t, func(c *pgxpool.Config) {
				c.ConnConfig = proxied
				// Room for new connections beside the stalled ones: a full
				// pool fails at once by design, which is not this test.
				c.MaxConns = 4
			})
			t.Cleanup(proxy.close)
			logs := newLogWatch()
			timeout := 400 * time.Millisecond
			if !kept {
				timeout = time.Minute
			}
			k := newLocker(t, pool, &leasetable.Config{
				TTL: 4 * time.Second, RenewInterval: 500 * time.Millisecond, SafetyMargin: 500 * time.Millisecond,
				QueryTimeout: timeout, Logger: logs.logger(), DisableListen: true,
			})
			l, err := k.TryAcquire(ctx, "stalled", nil)
			require.NoError(t, err)
			waitFor(t, logs.next("lease renewed"), "a renewal")
			failed := logs.next("renewal failed")
			proxy.stallOpen()
			if kept {
				waitFor(t, failed, "an attempt on a stalled connection")
				waitFor(t, logs.next("lease renewed"), "a renewal on a new connection")
				require.NoError(t, l.Err())
				require.NoError(t, l.Release(ctx))
				return
			}
			waitFor(t, l.Done(), "the loss")
			require.ErrorIs(t, l.Err(), pgfence.ErrLeaseLost)
		})
	}
}

// TestListenComesBackAfterARestart: after a restart, the waiter's LISTEN
// connection is back and a release by another Locker wakes it, well
// before the holder's TTL would have.
func TestListenComesBackAfterARestart(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setupRestart(t)
	holdRec := newRecorder()
	holder := newLocker(t, b.pool, &leasetable.Config{TTL: time.Minute, QueryTimeout: time.Second, Observer: holdRec})
	logs := newLogWatch()
	rec := newRecorder()
	waiter := newLocker(t, b.db.NewPool(t, nil), &leasetable.Config{QueryTimeout: time.Second, Logger: logs.logger(), Observer: rec})

	l, err := holder.TryAcquire(ctx, "contended", nil)
	require.NoError(t, err)
	// A lease whose TTL outlasts the outage is kept: its renewals fail
	// while the server is down, and succeed once it is back.
	kept, err := holder.TryAcquire(withReq("acq-kept"), "kept", &leasetable.AcquireOpts{TTL: 6 * time.Second})
	require.NoError(t, err)
	ready := logs.next("LISTEN connection ready")
	waiting := logs.next("waiting for lease")
	got := acquireAsync(waiter, "contended", 40*time.Second)
	waitFor(t, ready, "the listener")
	waitFor(t, waiting, "the waiter")

	failed := logs.next("LISTEN connection failed")
	require.NoError(t, b.cluster.Stop())
	waitFor(t, failed, "the LISTEN connection to fail")
	ev := rec.await(t, "ListenLost", func(r recorded) bool { _, ok := r.e.(pgfence.ListenLost); return ok })
	require.Error(t, ev.e.(pgfence.ListenLost).Err)
	require.Empty(t, ev.req)
	ev = holdRec.await(t, "RenewalFailed kept", isEvent[pgfence.RenewalFailed]("kept"))
	require.Equal(t, "acq-kept", ev.req)
	require.Equal(t, 1, ev.e.(pgfence.RenewalFailed).Attempt)
	require.Error(t, ev.e.(pgfence.RenewalFailed).Err)
	renewed := holdRec.count(isEvent[pgfence.Renewed]("kept"))

	back := logs.next("LISTEN connection ready")
	require.NoError(t, b.cluster.Start(ctx))
	up := time.Now()
	waitFor(t, back, "the listener back")
	t.Logf("LISTEN back %v after the server accepted connections again", time.Since(up).Round(time.Millisecond))
	ev = rec.await(t, "ListenRestored", func(r recorded) bool { _, ok := r.e.(pgfence.ListenRestored); return ok })
	t.Logf("ListenRestored: down %v", ev.e.(pgfence.ListenRestored).Down.Round(time.Millisecond))
	require.Positive(t, ev.e.(pgfence.ListenRestored).Down)
	require.True(t, waiter.Stats().Listening)

	holdRec.await(t, "kept renewed after the outage", func(r recorded) bool {
		return isEvent[pgfence.Renewed]("kept")(r) && holdRec.countLocked(isEvent[pgfence.Renewed]("kept")) > renewed
	})
	require.NoError(t, kept.Err(), "kept through the outage")
	require.NoError(t, kept.Release(ctx))
	require.Positive(t, holder.Stats().RenewalFailures)

	require.NoError(t, l.Release(ctx))
	r := <-got
	require.NoError(t, r.err, "woken by the release, not the holder's TTL")
	require.NoError(t, r.l.Release(ctx))
}

// TestReadOnlyConnectionsAreReplaced: while the pool's sessions are
// read-only (connections to a primary demoted to a standby), acquires fail
// with read_only_sql_transaction, retried and then reported as
// ErrUnavailable; the connections they failed on are closed, so once new
// sessions are writable (the pool reconnects to the new primary) the next
// acquire succeeds at once. Negative control: with the connections kept,
// the pool hands the read-only session out again and the acquire still
// fails.
func TestReadOnlyConnectionsAreReplaced(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, replaced := range []bool{true, false} {
		t.Run(map[bool]string{true: "replaced", false: "control"}[replaced], func(t *testing.T) {
			db := pgtest.NewDB(t)
			var readOnly atomic.Bool
			readOnly.Store(true)
			pool := db.NewPool(t, func(c *pgxpool.Config) {
				c.MaxConns = 4
				c.MinConns = 0
				c.BeforeConnect = func(_ context.Context, cc *pgx.ConnConfig) error {
					if readOnly.Load() {
						cc.RuntimeParams["default_transaction_read_only"] = "on"
					} else {
						delete(cc.RuntimeParams, "default_transaction_read_only")
					}
					return nil
				}
			})
			k := newLocker(t, pool, &leasetable.Config{QueryTimeout: 300 * time.Millisecond, DisableListen: true})
			if !replaced {
				leasetable.SetKeepStale(k)
			}
			_, err := k.TryAcquire(ctx, "ro", nil)
			require.ErrorIs(t, err, pgfence.ErrUnavailable)
			var pgErr *pgconn.PgError
			require.ErrorAs(t, err, &pgErr)
			require.Equal(t, "25006", pgErr.Code)

			readOnly.Store(false) // the new primary
			l, err := k.TryAcquire(ctx, "ro", nil)
			if !replaced {
				require.ErrorIs(t, err, pgfence.ErrUnavailable, "negative control: the read-only session is reused")
				return
			}
			require.NoError(t, err)
			require.NoError(t, l.Release(ctx))
		})
	}
}

// TestAcquireAttemptEndsOnADeadConnection: an acquire statement stuck on
// a connection that died silently (a cut without a reset) is cancelled
// once no answer could come in time any more (the lease's TTL after it
// was sent), and retried on a new connection, while the caller's
// WaitTimeout lasts. Negative control: without retries, the attempt's
// own error is returned, before the WaitTimeout: the attempt was bounded.
func TestAcquireAttemptEndsOnADeadConnection(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, retried := range []bool{true, false} {
		t.Run(map[bool]string{true: "retried", false: "control"}[retried], func(t *testing.T) {
			db := pgtest.NewDB(t)
			proxy, proxied := newDBProxy(t, db)
			pool := db.NewPool(t, func(c *pgxpool.Config) {
				c.ConnConfig = proxied
				// Room for new connections beside the stalled ones: a full
				// pool fails at once by design, which is not this test.
				c.MaxConns = 4
			})
			t.Cleanup(proxy.close)
			k := newLocker(t, pool, &leasetable.Config{TTL: time.Second, QueryTimeout: 500 * time.Millisecond, DisableListen: true})
			if !retried {
				leasetable.SetNoRetry(k)
			}
			// Warm the pool, so that the next acquire takes an open
			// connection.
			l, err := k.TryAcquire(ctx, "warm", nil)
			require.NoError(t, err)
			require.NoError(t, l.Release(ctx))
			// Every connection back in the pool before the stall, so the
			// next acquire takes a stalled one rather than dialing anew.
			require.Eventually(t, func() bool {
				st := pool.Stat()
				return st.TotalConns() > 0 && st.IdleConns() == st.TotalConns()
			}, 10*time.Second, time.Millisecond)
			proxy.stallOpen()
			l, err = k.Acquire(ctx, "stalled", &leasetable.AcquireOpts{WaitTimeout: 30 * time.Second})
			if !retried {
				require.Error(t, err)
				require.NotErrorIs(t, err, pgfence.ErrNotAcquired, "negative control: ended by the attempt's bound, not the WaitTimeout: %v", err)
				return
			}
			require.NoError(t, err)
			require.NoError(t, l.Err())
			// The Release may take the pool's other connection, stalled
			// too: then it rightly reports ErrUnavailable and retries in
			// the background. This test is about the acquire.
			if err := l.Release(ctx); err != nil {
				require.ErrorIs(t, err, pgfence.ErrUnavailable)
			}
		})
	}
}

// TestStalledListenIsCheckedAfterAnError: when everything between the
// Locker and the server stalls silently (a cut without a reset), the
// renewal that fails makes the Locker check its LISTEN connection at once,
// rather than after ListenCheckInterval (a minute here): the connection
// is replaced, and a release by another Locker wakes the waiter.
func TestStalledListenIsCheckedAfterAnError(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.NewDB(t)
	proxy, proxied := newDBProxy(t, db)
	pool := db.NewPool(t, func(c *pgxpool.Config) { c.ConnConfig = proxied.Copy() })
	t.Cleanup(proxy.close)
	logs := newLogWatch()
	k := newLocker(t, pool, &leasetable.Config{
		TTL: 3 * time.Second, RenewInterval: 300 * time.Millisecond, SafetyMargin: 300 * time.Millisecond,
		QueryTimeout: 300 * time.Millisecond, ListenCheckInterval: time.Minute, Logger: logs.logger(),
	})
	holder := newLocker(t, db.Pool, &leasetable.Config{TTL: time.Minute})

	contended, err := holder.TryAcquire(ctx, "contended", nil)
	require.NoError(t, err)
	mine, err := k.TryAcquire(ctx, "mine", nil)
	require.NoError(t, err)
	ready, waiting := logs.next("LISTEN connection ready"), logs.next("waiting for lease")
	got := acquireAsync(k, "contended", 30*time.Second)
	waitFor(t, ready, "the listener")
	waitFor(t, waiting, "the waiter")
	waitFor(t, logs.next("lease renewed"), "a renewal")

	failed, back := logs.next("LISTEN connection failed"), logs.next("LISTEN connection ready")
	proxy.stallOpen()
	stalled := time.Now()
	waitFor(t, failed, "the LISTEN connection replaced")
	t.Logf("LISTEN connection found dead %v after the stall", time.Since(stalled).Round(time.Millisecond))
	require.Contains(t, logs.warnings(), "after an error of another statement", "by the suspect check, not the periodic one")
	waitFor(t, back, "the listener back")
	t.Logf("LISTEN back %v after the stall", time.Since(stalled).Round(time.Millisecond))

	require.NoError(t, contended.Release(ctx))
	r := <-got
	require.NoError(t, r.err, "woken by the release on the new LISTEN connection")
	require.NoError(t, r.l.Release(ctx))
	require.NoError(t, mine.Err(), "the lease outlived the stall")
	// The Release may take one of the pool's connections opened before
	// the stall, stalled too: then it rightly reports ErrUnavailable and
	// retries in the background. This test is about the LISTEN connection.
	if err := mine.Release(ctx); err != nil {
		require.ErrorIs(t, err, pgfence.ErrUnavailable)
	}
}
