package advisory_test

import (
	"context"
	"log/slog"
	"net"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence"
	"github.com/pgfence/pgfence/advisory"
	"github.com/pgfence/pgfence/internal/pgtest"
)

// TestRideThroughRestart stops the server (a fast shutdown, as in a
// switchover, or SIGKILL of the postmaster, as in a crash) under a holder
// and a waiter, then starts it again. The holder is told its lock is lost;
// a waiting Acquire rides through the outage and gets the lock once the
// server is back; TryAcquire and a short WaitTimeout give up with
// ErrUnavailable wrapping the connection error. With retries off (the
// negative control), the waiting Acquire fails during the outage. The test
// logs how long the holder took to learn of the loss and how long after
// the restart the waiter got the lock, with the default
// SessionCheckInterval and QueryTimeout.
func TestRideThroughRestart(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		stop func(c *pgtest.Cluster) error
	}{
		{"fast shutdown", func(c *pgtest.Cluster) error { return c.Stop() }},
		{"postmaster SIGKILL", func(c *pgtest.Cluster) error { return c.Crash(syscall.SIGKILL) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			c, srv := pgtest.NewCluster(t, nil)
			db := srv.NewDB(t)
			h := &recordHandler{}
			l := newLocker(t, db.NewPool(t, nil), &advisory.Config{ApplicationName: "pgfence-ride", Logger: slog.New(h)})
			noRetry := newLocker(t, db.NewPool(t, nil), &advisory.Config{ApplicationName: "pgfence-ride-control"})
			advisory.SetNoRetry(noRetry)

			held, err := l.TryAcquireKey(ctx, advisory.Name("held"), nil)
			require.NoError(t, err)
			// The control's session is open before the outage, as l's is.
			warm, err := noRetry.TryAcquireKey(ctx, advisory.Name("warm"), nil)
			require.NoError(t, err)
			lostAt := make(chan time.Time, 1)
			go func() { <-held.Done(); lostAt <- time.Now() }()

			stopped := time.Now()
			require.NoError(t, tc.stop(c))
			var learned time.Time
			select {
			case learned = <-lostAt:
			case <-time.After(30 * time.Second):
				t.Fatal("the holder was not told of the loss")
			}
			require.ErrorIs(t, held.Err(), pgfence.ErrLeaseLost)
			waitDone(t, warm)
			t.Logf("%s: the holder learned of the loss %v after the shutdown began (SessionCheckInterval %v, QueryTimeout %v)",
				tc.name, learned.Sub(stopped).Round(time.Millisecond), advisory.DefaultSessionCheckInterval, advisory.DefaultQueryTimeout)

			// While the server is down.
			start := time.Now()
			_, err = l.TryAcquireKey(ctx, advisory.Name("try"), nil)
			require.ErrorIs(t, err, pgfence.ErrUnavailable)
			var connectErr *pgconn.ConnectError
			require.ErrorAs(t, err, &connectErr, "the last cause is wrapped")
			t.Logf("TryAcquire gave up after %v: %v", time.Since(start).Round(time.Millisecond), err)
			_, err = l.AcquireKey(ctx, advisory.Name("short"), &advisory.AcquireOpts{WaitTimeout: 300 * time.Millisecond})
			require.ErrorIs(t, err, pgfence.ErrUnavailable)
			require.ErrorIs(t, err, pgfence.ErrNotAcquired, "a WaitTimeout end matches as without an outage")
			require.ErrorIs(t, err, context.DeadlineExceeded)
			require.ErrorAs(t, err, &connectErr)

			// Negative control: without retries, the wait fails at once.
			_, err = noRetry.AcquireKey(ctx, advisory.Name("wait"), &advisory.AcquireOpts{WaitTimeout: time.Minute})
			require.ErrorIs(t, err, pgfence.ErrUnavailable)
			require.NotErrorIs(t, err, context.DeadlineExceeded, "it did not wait")

			type result struct {
				lk  *advisory.Lease
				err error
				at  time.Time
			}
			const dialFailed = "pgfence: advisory: cannot open lock session"
			failedDials := h.count(dialFailed)
			got := make(chan result, 1)
			go func() {
				lk, err := l.AcquireKey(ctx, advisory.Name("wait"), &advisory.AcquireOpts{WaitTimeout: 2 * time.Minute})
				got <- result{lk, err, time.Now()}
			}()
			// The waiter is waiting: it failed an attempt already.
			require.Eventually(t, func() bool { return h.count(dialFailed) > failedDials }, 30*time.Second, time.Millisecond)
			require.Equal(t, 1, l.Stats().Waiting)

			require.NoError(t, c.Start(ctx))
			ready := time.Now()
			r := <-got
			require.NoError(t, r.err)
			require.NoError(t, r.lk.Err())
			require.Greater(t, r.lk.Token(), held.Token())
			t.Logf("%s: the waiter got the lock %v after the restarted server accepted connections",
				tc.name, r.at.Sub(ready).Round(time.Millisecond))
			require.NoError(t, r.lk.Release(ctx))
			require.Zero(t, l.Stats().Waiting)
		})
	}
}

// TestPromptLossWhenServerEndsSession terminates the backends of two
// Lockers' sessions, whose periodic checks are an hour apart. The
// watchdog's look at the idle socket notices at once that the server ended
// the session, and the holder is told; with that look turned off (the
// negative control) the holder is not told until a check runs.
func TestPromptLossWhenServerEndsSession(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.NewDB(t)
	slow := func(app string) *advisory.Config {
		return &advisory.Config{
			ApplicationName:      app,
			SessionCheckInterval: time.Hour,
			TCPKeepalivesIdle:    3 * time.Hour,
			TCPUserTimeout:       3 * time.Hour,
		}
	}
	l := newLocker(t, db.Pool, slow("pgfence-peek"))
	control := newLocker(t, db.NewPool(t, nil), slow("pgfence-peek-control"))
	advisory.SetNoPeek(control)

	lk, err := l.TryAcquireKey(ctx, advisory.Name("peek"), nil)
	require.NoError(t, err)
	lkC, err := control.TryAcquireKey(ctx, advisory.Name("peek-control"), nil)
	require.NoError(t, err)
	terminated := time.Now()
	_, err = db.Pool.Exec(ctx, `SELECT pg_terminate_backend(pid, 5000) FROM pg_stat_activity
		WHERE datname = current_database() AND application_name IN ('pgfence-peek', 'pgfence-peek-control')`)
	require.NoError(t, err)
	waitDone(t, lk)
	t.Logf("the holder learned of the loss %v after pg_terminate_backend was sent", time.Since(terminated).Round(time.Millisecond))
	require.ErrorIs(t, lk.Err(), pgfence.ErrLeaseLost)

	require.NoError(t, lkC.Err(), "negative control: not told before a check")
	require.Zero(t, heldAdvisoryLocks(t, db.Pool), "both sessions are gone on the server")
	require.ErrorIs(t, lkC.Renew(ctx), pgfence.ErrLeaseLost, "a check then tells")
}

// TestAcquireLeavesADialThatHangs blackholes the database behind a proxy,
// so that dialing a lock session hangs (the TCP connection is accepted,
// the startup message never answered). An Acquire whose WaitTimeout is
// far shorter than the dial's bound (QueryTimeout) returns at its
// WaitTimeout, while the dial is still in flight: a host that does not
// answer does not eat the caller's deadline.
func TestAcquireLeavesADialThatHangs(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.NewDB(t)
	proxy, pool := proxiedPool(t, db, func(c *pgxpool.Config) { c.MinConns = 0 })
	h := &recordHandler{}
	l := newLocker(t, pool, &advisory.Config{
		ApplicationName:   "pgfence-hung-dial",
		QueryTimeout:      time.Minute, // the dial's bound
		TCPKeepalivesIdle: time.Hour,
		TCPUserTimeout:    time.Hour,
		Logger:            slog.New(h),
	})
	const dialFailed = "pgfence: advisory: cannot open lock session"

	before := proxy.Conns() // the pool's
	proxy.Blackhole(true)
	_, err := l.AcquireKey(ctx, advisory.Name("hung-dial"), &advisory.AcquireOpts{WaitTimeout: 200 * time.Millisecond})
	require.ErrorIs(t, err, pgfence.ErrNotAcquired)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.Zero(t, h.count(dialFailed), "the dial is still in flight: the caller did not wait for it")
	require.Equal(t, before+1, proxy.Conns(), "the lock session's dial")

	// Once the network is back, the poisoned connection is closed and the
	// dial fails; the next acquire dials again and gets the lock.
	proxy.Blackhole(false)
	select {
	case <-h.logged(dialFailed):
	case <-time.After(30 * time.Second):
		t.Fatal("the dial did not end")
	}
	lk, err := l.AcquireKey(ctx, advisory.Name("hung-dial"), &advisory.AcquireOpts{WaitTimeout: 30 * time.Second})
	require.NoError(t, err)
	require.NoError(t, lk.Release(ctx))
}

// TestLossOnNetworkCut blackholes the network between a holder and the
// server (a proxy drops every byte, the connection stays open), with the
// default SessionCheckInterval and QueryTimeout: the holder is told when
// its session check times out, and logs how long that took. A holder on a
// direct connection to the same server (the control) keeps its lock.
func TestLossOnNetworkCut(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.NewDB(t)
	proxy, pool := proxiedPool(t, db, nil)
	l := newLocker(t, pool, &advisory.Config{ApplicationName: "pgfence-cut"})
	direct := newLocker(t, db.Pool, nil)

	lk, err := l.TryAcquire(ctx, "cut", nil)
	require.NoError(t, err)
	control, err := direct.TryAcquire(ctx, "direct", nil)
	require.NoError(t, err)
	cut := time.Now()
	proxy.Blackhole(true)
	waitDone(t, lk)
	t.Logf("the holder learned of the loss %v after the network was cut (SessionCheckInterval %v + QueryTimeout %v at most)",
		time.Since(cut).Round(time.Millisecond), advisory.DefaultSessionCheckInterval, advisory.DefaultQueryTimeout)
	require.ErrorIs(t, lk.Err(), pgfence.ErrLeaseLost)
	require.ErrorContains(t, lk.Err(), "liveness check failed")
	require.NoError(t, control.Err(), "the control's session is unaffected")
	proxy.Blackhole(false)

	// The client closed its side; the proxy passes the close on, and the
	// server frees the lock.
	lkO, err := direct.Acquire(ctx, "cut", &pgfence.AcquireOpts{WaitTimeout: 30 * time.Second})
	require.NoError(t, err)
	require.Greater(t, lkO.Token(), lk.Token())
	require.NoError(t, lkO.Release(ctx))
	require.NoError(t, control.Release(ctx))
}

// proxiedPool returns a proxy in front of db's server (over TCP) and a pool
// on db that connects through it; configure, when not nil, edits the
// pool's configuration further. The proxy is closed when t ends.
func proxiedPool(t *testing.T, db *pgtest.DB, configure func(*pgxpool.Config)) (*pgtest.Proxy, *pgxpool.Pool) {
	t.Helper()
	cc, err := pgx.ParseConfig(db.TCPURL)
	require.NoError(t, err)
	proxy, err := pgtest.NewProxy(net.JoinHostPort(cc.Host, strconv.Itoa(int(cc.Port))))
	require.NoError(t, err)
	t.Cleanup(func() { _ = proxy.Close() })
	pool := db.NewTCPPool(t, func(c *pgxpool.Config) {
		c.ConnConfig.Host, c.ConnConfig.Port, c.ConnConfig.Fallbacks = "127.0.0.1", uint16(proxy.Port()), nil
		if configure != nil {
			configure(c)
		}
	})
	return proxy, pool
}
