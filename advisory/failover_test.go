package advisory_test

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"sync/atomic"
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
	"github.com/pgfence/pgfence/migrations"
)

// TestFailoverToSynchronousStandby crashes a primary (SIGKILL of the
// postmaster) under a holder and promotes its synchronous standby, with
// the Locker's pool on a multi-host URL (target_session_attrs=read-write)
// as an HA deployment has it. The holder is told its lock is lost; waits
// started then, during the outage, ride through it and get their locks on the
// new primary, with tokens above every token granted before. It logs how
// long the holder took to learn of the loss, how long after the crash the
// standby was writable, and how long after that the waits got their locks.
// With retries off (the negative control) a wait fails during the outage.
// The maintenance database holds pgfence's schema, so that the crashed
// primary needs no cleanup.
func TestFailoverToSynchronousStandby(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c, _ := pgtest.NewCluster(t, nil)
	require.NoError(t, migrations.Up(ctx, migrations.Target{URL: c.URL("postgres")}, nil))
	sb := pgtest.NewStandby(t, c, &pgtest.StandbyOptions{Synchronous: true})

	primary, err := pgx.ParseConfig(c.URL("postgres"))
	require.NoError(t, err)
	standby, err := pgx.ParseConfig(sb.URL("postgres"))
	require.NoError(t, err)
	u := url.URL{Scheme: "postgres", User: url.UserPassword(primary.User, primary.Password),
		Host: fmt.Sprintf("%s:%d,%s:%d", primary.Host, primary.Port, standby.Host, standby.Port), Path: "/postgres",
		RawQuery: "sslmode=disable&target_session_attrs=read-write&connect_timeout=2"}
	pcfg, err := pgxpool.ParseConfig(u.String())
	require.NoError(t, err)
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	// One session: once the holder is told, the Locker has no session left
	// on the old primary, whose backends outlive its postmaster for a
	// moment (a lock granted there is lost at once: safe, but not what
	// this test is about).
	l := newLocker(t, pool, &advisory.Config{ApplicationName: "pgfence-failover", MaxSessions: 1})
	noRetry := newLocker(t, pool, &advisory.Config{ApplicationName: "pgfence-failover-control"})
	advisory.SetNoRetry(noRetry)

	held, err := l.TryAcquire(ctx, "held", nil)
	require.NoError(t, err)
	before, err := l.TryAcquire(ctx, "before", nil)
	require.NoError(t, err)
	require.NoError(t, before.Release(ctx))
	lostAt := make(chan time.Time, 1)
	go func() { <-held.Done(); lostAt <- time.Now() }()

	crashed := time.Now()
	require.NoError(t, c.Crash(syscall.SIGKILL))
	var learned time.Time
	select {
	case learned = <-lostAt:
	case <-time.After(30 * time.Second):
		t.Fatal("the holder was not told of the loss")
	}
	require.ErrorIs(t, held.Err(), pgfence.ErrLeaseLost)
	type result struct {
		lk  pgfence.Lease
		err error
		at  time.Time
	}
	got := make(chan result, 2)
	for _, name := range []string{"held", "before"} {
		go func() {
			lk, err := l.Acquire(ctx, name, &pgfence.AcquireOpts{WaitTimeout: 2 * time.Minute})
			got <- result{lk, err, time.Now()}
		}()
	}
	// Negative control: without retries, a wait fails during the outage.
	_, err = noRetry.Acquire(ctx, "control", &pgfence.AcquireOpts{WaitTimeout: 2 * time.Minute})
	require.ErrorIs(t, err, pgfence.ErrUnavailable)
	require.NoError(t, sb.Promote(ctx))
	writable := time.Now()

	for range 2 {
		r := <-got
		require.NoError(t, r.err)
		require.NoError(t, r.lk.Err())
		require.Greater(t, r.lk.Token(), before.Token(), "the synchronous standby had every token")
		t.Logf("%q granted on the new primary %v after it was writable", r.lk.Name(), r.at.Sub(writable).Round(time.Millisecond))
		require.NoError(t, r.lk.Release(ctx))
	}
	t.Logf("the holder learned of the loss %v after the crash; the standby was writable %v after it",
		learned.Sub(crashed).Round(time.Millisecond), writable.Sub(crashed).Round(time.Millisecond))
}

// TestSessionOnStandbyIsDropped points a Locker at a hot standby (as a
// load balancer may during a failover): advisory locks are granted there,
// but the token draw fails (read-only, SQLSTATE 25006), so nothing is
// handed out, and the session is dropped so that each retry dials again.
// TryAcquire gives up with ErrUnavailable wrapping the server's error; a
// wait rides on until the standby is promoted, then gets the lock. (Other
// server errors keep the session: see TestLockTableFull.) New refuses
// the standby itself (ErrUnsafeServer) and, on its primary, warns of the
// asynchronous standby (a Warn and a ServerWarning event).
func TestSessionOnStandbyIsDropped(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c, srv := pgtest.NewCluster(t, nil)
	db := srv.NewDB(t)
	sb := pgtest.NewStandby(t, c, nil)

	// New refuses the standby.
	onStandby, err := pgxpool.ParseConfig(db.TCPURL)
	require.NoError(t, err)
	onStandby.ConnConfig.Port = uint16(sb.Port)
	standbyPool, err := pgxpool.NewWithConfig(ctx, onStandby)
	require.NoError(t, err)
	t.Cleanup(standbyPool.Close)
	_, err = advisory.New(ctx, standbyPool, nil)
	require.ErrorIs(t, err, pgfence.ErrUnsafeServer)
	require.ErrorContains(t, err, "standby in recovery")

	// On the primary it warns of the asynchronous standby; then the server
	// the Locker's sessions dial turns into that standby (the pool's
	// connections, and New's checks, stay on the primary).
	var demoted atomic.Bool
	pcfg, err := pgxpool.ParseConfig(db.TCPURL)
	require.NoError(t, err)
	pcfg.ConnConfig.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		if demoted.Load() {
			addr = fmt.Sprintf("127.0.0.1:%d", sb.Port)
		}
		return (&net.Dialer{}).DialContext(ctx, network, addr)
	}
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	h := &recordHandler{}
	warned := make(chan pgfence.ServerWarning, 1)
	l := newLocker(t, pool, &advisory.Config{ApplicationName: "pgfence-standby", Logger: slog.New(h),
		Observer: pgfence.ObserverFunc(func(_ context.Context, e pgfence.Event) {
			if w, ok := e.(pgfence.ServerWarning); ok {
				warned <- w
			}
		})})
	w := <-warned
	require.Equal(t, "async_standby", w.Reason)
	require.Equal(t, pgfence.StrategyAdvisory, w.Kind)
	require.Equal(t, 1, h.countLevel(slog.LevelWarn))
	demoted.Store(true)
	const opened = "pgfence: advisory: lock session opened"

	_, err = l.TryAcquire(ctx, "ro", nil)
	require.ErrorIs(t, err, pgfence.ErrUnavailable)
	var pgErr *pgconn.PgError
	require.ErrorAs(t, err, &pgErr)
	require.Equal(t, "25006", pgErr.Code)
	require.Greater(t, h.count(opened), 1, "each retry dialed a new session")
	require.Zero(t, l.Stats().Held)

	got := make(chan error, 1)
	go func() {
		lk, err := l.Acquire(ctx, "ro", &pgfence.AcquireOpts{WaitTimeout: 2 * time.Minute})
		if err == nil {
			err = lk.Release(ctx)
		}
		got <- err
	}()
	require.NoError(t, sb.Promote(ctx))
	require.NoError(t, <-got)
}
