package advisory_test

import (
	"context"
	"strconv"
	"strings"
	"sync/atomic"
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

// parkedBackends counts the backends with application_name app that wait
// for an advisory lock in the server: parked waits.
func parkedBackends(t testing.TB, pool *pgxpool.Pool, app string) int {
	t.Helper()
	var n int
	require.NoError(t, pool.QueryRow(context.Background(), `
		SELECT count(*) FROM pg_stat_activity
		WHERE datname = current_database() AND application_name = $1
		  AND wait_event_type = 'Lock' AND wait_event = 'advisory'`, app).Scan(&n))
	return n
}

// waitParked waits until n backends with application_name app are parked.
func waitParked(t testing.TB, pool *pgxpool.Pool, app string, n int) {
	t.Helper()
	require.Eventually(t, func() bool { return parkedBackends(t, pool, app) == n }, 20*time.Second, 5*time.Millisecond,
		"%d parked backends of %s", n, app)
}

// unhurriedParks raises deadlock_timeout to 5 minutes for the sessions
// that open on db from now on, so that with unhurriedParkConfig their
// parked wait statements last a minute (their lock_timeout is the shorter
// of SessionCheckInterval and half of deadlock_timeout): none is sent
// again, or ends, within a test unless cancelled.
func unhurriedParks(t testing.TB, db *pgtest.DB) {
	t.Helper()
	_, err := db.Pool.Exec(context.Background(),
		`DO $$ BEGIN EXECUTE format('ALTER DATABASE %I SET deadlock_timeout = ''5min''', current_database()); END $$`)
	require.NoError(t, err)
}

// unhurriedParkConfig is a Config with application_name app whose parked
// waits last a minute on a database prepared by unhurriedParks (its TCP
// settings satisfy Config's check against SessionCheckInterval).
func unhurriedParkConfig(app string) *advisory.Config {
	return &advisory.Config{ApplicationName: app,
		SessionCheckInterval: time.Minute, TCPUserTimeout: 5 * time.Minute, TCPKeepalivesIdle: 3 * time.Minute}
}

// sessionPIDs returns the backend pids of the sessions with
// application_name app.
func sessionPIDs(t testing.TB, pool *pgxpool.Pool, app string) []int32 {
	t.Helper()
	rows, err := pool.Query(context.Background(), `SELECT pid FROM pg_stat_activity
		WHERE datname = current_database() AND application_name = $1 ORDER BY pid`, app)
	require.NoError(t, err)
	pids, err := pgx.CollectRows(rows, pgx.RowTo[int32])
	require.NoError(t, err)
	return pids
}

// TestParkedHandOver: a waiting AcquireKey whose key another Locker holds
// waits in the server, on a session of its Locker, without registering
// for wake-ups; the holder's Release hands the lock over with a larger
// token and no notification. Negative control: with parking off, the
// waiter registers for wake-ups and no backend waits in the server.
func TestParkedHandOver(t *testing.T) {
	t.Parallel()
	for _, park := range []bool{true, false} {
		name := "parked"
		if !park {
			name = "control: parking off"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			db := pgtest.NewDB(t)
			holder := newLocker(t, db.Pool, nil)
			app := "park-handover-" + strconv.FormatBool(park)
			waiter := newLocker(t, db.NewPool(t, nil), &advisory.Config{ApplicationName: app})
			if !park {
				advisory.SetNoPark(waiter)
			}
			key := advisory.Name("park:handover")
			lk, err := holder.TryAcquireKey(ctx, key, nil)
			require.NoError(t, err)
			res := lockAsync(ctx, waiter, key, nil)
			if park {
				waitParked(t, db.Pool, app, 1)
				require.False(t, advisory.Registered(waiter, key), "a parked wait needs no wake-up")
			} else {
				require.Eventually(t, func() bool { return advisory.Registered(waiter, key) }, 20*time.Second, 5*time.Millisecond)
				require.Zero(t, parkedBackends(t, db.Pool, app))
			}
			require.NoError(t, lk.Release(ctx))
			r := result(t, res)
			require.NoError(t, r.err)
			require.Greater(t, r.lk.Token(), lk.Token())
			require.Equal(t, sessionPIDs(t, db.Pool, app), holderPIDs(t, db.Pool, key))
			require.NoError(t, r.lk.Release(ctx))
			require.Zero(t, heldAdvisoryLocks(t, db.Pool))
		})
	}
}

// TestParkedWaitsEndInOrder: Lockers parked on one key are granted it in
// the order their wait statements began, one Release each. The statements
// are not sent again here (their lock_timeout, SessionCheckInterval or
// half of deadlock_timeout, is raised to a minute): a statement sent again
// joins the back of the server's line, so with the defaults the order
// holds only within half a second (TestParkedWaitSentAgainLosesItsPlace).
func TestParkedWaitsEndInOrder(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.NewDB(t)
	unhurriedParks(t, db)
	holder := newLocker(t, db.Pool, nil)
	key := advisory.Name("park:order")
	lk, err := holder.TryAcquireKey(ctx, key, nil)
	require.NoError(t, err)
	const n = 3
	results := make([]<-chan lockResult, n)
	for i := range results {
		app := "park-order-" + strconv.Itoa(i)
		w := newLocker(t, db.NewPool(t, nil), unhurriedParkConfig(app))
		results[i] = lockAsync(ctx, w, key, nil)
		waitParked(t, db.Pool, app, 1)
	}
	prev := lk
	for i, ch := range results {
		require.NoError(t, prev.Release(ctx))
		r := result(t, ch)
		require.NoError(t, r.err, "waiter %d", i)
		require.Greater(t, r.lk.Token(), prev.Token())
		prev = r.lk
	}
	require.NoError(t, prev.Release(ctx))
}

// TestParkedWaitCancelled: a parked wait that its ctx or WaitTimeout ends
// is cancelled in the server (its lock_timeout, a minute here, would
// outlast result's bound) and keeps its session, which holds nothing; the
// Locker parks on it again. Closing the Locker ends a parked wait with
// ErrClosed.
func TestParkedWaitCancelled(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.NewDB(t)
	holder := newLocker(t, db.Pool, nil)
	app := "park-cancel"
	// Parked statements run for a minute here unless cancelled, more than
	// result waits.
	unhurriedParks(t, db)
	waiter := newLocker(t, db.NewPool(t, nil), unhurriedParkConfig(app))
	key := advisory.Name("park:cancel")
	lk, err := holder.TryAcquireKey(ctx, key, nil)
	require.NoError(t, err)

	// The waiter's session is open before the waits.
	warm, err := waiter.TryAcquireKey(ctx, advisory.Name("park:warm"), nil)
	require.NoError(t, err)
	require.NoError(t, warm.Release(ctx))
	pids := sessionPIDs(t, db.Pool, app)
	require.Len(t, pids, 1)

	timed := lockAsync(ctx, waiter, key, &advisory.AcquireOpts{WaitTimeout: 300 * time.Millisecond})
	requireWaitTimedOut(t, result(t, timed).err, "a parked wait")
	require.Equal(t, pids, sessionPIDs(t, db.Pool, app), "the parked session was kept")

	cctx, cancel := context.WithCancel(ctx)
	res := lockAsync(cctx, waiter, key, nil)
	waitParked(t, db.Pool, app, 1)
	cancel()
	require.ErrorIs(t, result(t, res).err, context.Canceled)
	require.Equal(t, pids, sessionPIDs(t, db.Pool, app), "the same session, kept")
	require.Equal(t, 1, advisory.Sessions(waiter))
	// The waits left nothing held: the holder's lock is the only one, and
	// once released the key is free.
	require.Equal(t, 1, heldAdvisoryLocks(t, db.Pool))
	require.NoError(t, lk.Release(ctx))
	require.Zero(t, heldAdvisoryLocks(t, db.Pool))

	lk, err = holder.TryAcquireKey(ctx, key, nil)
	require.NoError(t, err)
	res = lockAsync(ctx, waiter, key, nil)
	waitParked(t, db.Pool, app, 1)
	closed := make(chan struct{})
	go func() { waiter.Close(); close(closed) }()
	require.ErrorIs(t, result(t, res).err, pgfence.ErrClosed, "Close cancels the parked wait")
	select {
	case <-closed:
	case <-time.After(30 * time.Second):
		t.Fatal("Close did not return")
	}
	require.NoError(t, lk.Release(ctx))
	require.Zero(t, heldAdvisoryLocks(t, db.Pool))
}

// TestParkedWaitRunsAgain: a parked wait longer than SessionCheckInterval
// (its lock_timeout) is run again, and granted when the holder releases.
func TestParkedWaitRunsAgain(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.NewDB(t)
	holder := newLocker(t, db.Pool, nil)
	app := "park-again"
	var waits atomic.Int64
	cfg := &advisory.Config{ApplicationName: app, SessionCheckInterval: 50 * time.Millisecond}
	waiter := newLocker(t, db.NewPool(t, func(c *pgxpool.Config) { c.ConnConfig.Tracer = countParks{&waits} }), cfg)
	key := advisory.Name("park:again")
	lk, err := holder.TryAcquireKey(ctx, key, nil)
	require.NoError(t, err)
	res := lockAsync(ctx, waiter, key, nil)
	require.Eventually(t, func() bool { return waits.Load() >= 4 }, 20*time.Second, 5*time.Millisecond)
	require.NoError(t, lk.Release(ctx))
	r := result(t, res)
	require.NoError(t, r.err)
	require.NoError(t, r.lk.Release(ctx))
}

// TestParkedWaitSentAgainLosesItsPlace: a parked wait statement that its
// lock_timeout ends is sent again and joins the back of the server's line,
// so a Locker that parked later, and waits on, is granted the key first:
// parked waits are not served in FIFO order across Lockers. Negative
// control: when the first wait is not sent again, it is granted first.
func TestParkedWaitSentAgainLosesItsPlace(t *testing.T) {
	t.Parallel()
	for _, again := range []bool{true, false} {
		name := "sent again"
		if !again {
			name = "control: not sent again"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			db := pgtest.NewDB(t)
			unhurriedParks(t, db)
			holder := newLocker(t, db.Pool, nil)
			key := advisory.Name("park:place")
			lk, err := holder.TryAcquireKey(ctx, key, nil)
			require.NoError(t, err)

			first := unhurriedParkConfig("park-place-first")
			if again {
				first.SessionCheckInterval = 50 * time.Millisecond
			}
			var firstWaits atomic.Int64
			a := newLocker(t, db.NewPool(t, func(c *pgxpool.Config) { c.ConnConfig.Tracer = countParks{&firstWaits} }), first)
			resA := lockAsync(ctx, a, key, nil)
			waitParked(t, db.Pool, first.ApplicationName, 1)

			second := unhurriedParkConfig("park-place-second")
			b := newLocker(t, db.NewPool(t, nil), second)
			resB := lockAsync(ctx, b, key, nil)
			waitParked(t, db.Pool, second.ApplicationName, 1)
			if again {
				// A's statement was sent again after B's began waiting.
				sent := firstWaits.Load()
				require.Eventually(t, func() bool { return firstWaits.Load() >= sent+2 }, 20*time.Second, 5*time.Millisecond)
			} else {
				require.Equal(t, int64(1), firstWaits.Load())
			}

			require.NoError(t, lk.Release(ctx))
			var winner, other lockResult
			var otherCh <-chan lockResult
			select {
			case winner = <-resA:
				require.False(t, again, "the wait sent again was granted first")
				otherCh = resB
			case winner = <-resB:
				require.True(t, again, "the first wait, never sent again, was overtaken")
				otherCh = resA
			case <-time.After(30 * time.Second):
				t.Fatal("no wait was granted")
			}
			require.NoError(t, winner.err)
			require.Greater(t, winner.lk.Token(), lk.Token())
			require.NoError(t, winner.lk.Release(ctx))
			other = result(t, otherCh)
			require.NoError(t, other.err)
			require.Greater(t, other.lk.Token(), winner.lk.Token())
			require.NoError(t, other.lk.Release(ctx))
		})
	}
}

// countParks counts the parked wait statements sent.
type countParks struct{ n *atomic.Int64 }

func (c countParks) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	if strings.Contains(d.SQL, "pg_advisory_lock(") {
		c.n.Add(1)
	}
	return ctx
}

func (countParks) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// TestParkLeavesASession: at most MaxSessions-1 sessions are parked, so
// other keys keep a session: with MaxSessions 2, a Locker parked for one
// key takes another key at once, and a second waiting key waits by
// wake-ups instead. MaxSessions 1 never parks.
func TestParkLeavesASession(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.NewDB(t)
	holder := newLocker(t, db.Pool, nil)
	k1, k2, k3 := advisory.Name("park:one"), advisory.Name("park:two"), advisory.Name("park:three")
	h1, err := holder.TryAcquireKey(ctx, k1, nil)
	require.NoError(t, err)
	h3, err := holder.TryAcquireKey(ctx, k3, nil)
	require.NoError(t, err)

	app := "park-leaves"
	waiter := newLocker(t, db.NewPool(t, nil), &advisory.Config{ApplicationName: app, MaxSessions: 2})
	res1 := lockAsync(ctx, waiter, k1, nil)
	waitParked(t, db.Pool, app, 1)
	tctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	l2, err := waiter.TryAcquireKey(tctx, k2, nil)
	require.NoError(t, err, "another key gets a session while one is parked")
	res3 := lockAsync(ctx, waiter, k3, nil)
	require.Eventually(t, func() bool { return advisory.Registered(waiter, k3) }, 20*time.Second, 5*time.Millisecond,
		"the second waiting key waits by wake-ups")
	require.Equal(t, 1, parkedBackends(t, db.Pool, app))
	require.Equal(t, 2, advisory.Sessions(waiter))

	require.NoError(t, h1.Release(ctx))
	require.NoError(t, h3.Release(ctx))
	for _, res := range []<-chan lockResult{res1, res3} {
		r := result(t, res)
		require.NoError(t, r.err)
		require.NoError(t, r.lk.Release(ctx))
	}
	require.NoError(t, l2.Release(ctx))

	one := "park-max-one"
	single := newLocker(t, db.NewPool(t, nil), &advisory.Config{ApplicationName: one, MaxSessions: 1})
	h1, err = holder.TryAcquireKey(ctx, k1, nil)
	require.NoError(t, err)
	res1 = lockAsync(ctx, single, k1, nil)
	require.Eventually(t, func() bool { return advisory.Registered(single, k1) }, 20*time.Second, 5*time.Millisecond)
	require.Zero(t, parkedBackends(t, db.Pool, one))
	require.NoError(t, h1.Release(ctx))
	r := result(t, res1)
	require.NoError(t, r.err)
	require.NoError(t, r.lk.Release(ctx))
}

// TestParkedGrantTokenFails: when the token draw fails after the server
// granted a parked wait (PF002: the sequence was given a cache), the lock
// is released on the spot and the error returned; the key is free.
func TestParkedGrantTokenFails(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.NewDB(t)
	holder := newLocker(t, db.Pool, nil)
	app := "park-token-fails"
	waiter := newLocker(t, db.NewPool(t, nil), &advisory.Config{ApplicationName: app})
	key := advisory.Name("park:token")
	lk, err := holder.TryAcquireKey(ctx, key, nil)
	require.NoError(t, err)
	res := lockAsync(ctx, waiter, key, &advisory.AcquireOpts{WaitTimeout: 10 * time.Second})
	waitParked(t, db.Pool, app, 1)
	const seq = "pgfence.pgfence_leases_fence_seq"
	_, err = db.Pool.Exec(ctx, "ALTER SEQUENCE "+seq+" CACHE 2")
	require.NoError(t, err)
	defer func() {
		_, err := db.Pool.Exec(ctx, "ALTER SEQUENCE "+seq+" CACHE 1")
		require.NoError(t, err)
	}()
	require.NoError(t, lk.Release(ctx))
	r := result(t, res)
	var pgErr *pgconn.PgError
	require.ErrorAs(t, r.err, &pgErr)
	require.Equal(t, "PF002", pgErr.Code)
	require.Zero(t, heldAdvisoryLocks(t, db.Pool), "the grant was released")
	require.Len(t, sessionPIDs(t, db.Pool, app), 1, "the session was kept")
}

// TestParkedSessionTerminated: a parked session the server ends makes the
// wait retry on a new session, which is granted the lock at the release.
func TestParkedSessionTerminated(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.NewDB(t)
	holder := newLocker(t, db.Pool, nil)
	app := "park-terminated"
	waiter := newLocker(t, db.NewPool(t, nil), &advisory.Config{ApplicationName: app})
	key := advisory.Name("park:terminated")
	lk, err := holder.TryAcquireKey(ctx, key, nil)
	require.NoError(t, err)
	res := lockAsync(ctx, waiter, key, nil)
	waitParked(t, db.Pool, app, 1)
	old := sessionPIDs(t, db.Pool, app)
	_, err = db.Pool.Exec(ctx, "SELECT pg_terminate_backend($1)", old[0])
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		pids := sessionPIDs(t, db.Pool, app)
		return parkedBackends(t, db.Pool, app) == 1 && len(pids) == 1 && pids[0] != old[0]
	}, 20*time.Second, 5*time.Millisecond, "parked again on a new session")
	require.NoError(t, lk.Release(ctx))
	r := result(t, res)
	require.NoError(t, r.err)
	require.NoError(t, r.lk.Release(ctx))
}
