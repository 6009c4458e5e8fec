package advisory_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence"
	"github.com/pgfence/pgfence/advisory"
	"github.com/pgfence/pgfence/internal/pgtest"
)

// Wake-up tests make a waiter's polls rare: its first pause is 8s (4-8s
// with the jitter) and MaxPollInterval 10s, so after its first failed
// attempt it does not poll again within its WaitTimeout of 3s. It can only
// acquire within that bound when a notification wakes it. (With a first
// pause of 6s, 3-6s, the poll timer cleared the WaitTimeout only by the
// first attempt's duration plus a jitter that can be near zero.)
const (
	wakeFirstPause  = 8 * time.Second
	wakeMaxPoll     = 10 * time.Second
	wakeWaitTimeout = 3 * time.Second
)

// wakeConfig is the configuration of a waiting Locker in wake-up tests.
func wakeConfig(appName string, disableListen bool) *advisory.Config {
	cfg := fastConfig(appName)
	cfg.MaxPollInterval = wakeMaxPoll
	cfg.DisableListen = disableListen
	return cfg
}

// newWaiter returns a Locker on its own pool whose waits poll rarely.
func newWaiter(t *testing.T, db *pgtest.DB, appName string, disableListen bool) *advisory.Locker {
	t.Helper()
	l := newLocker(t, db.NewPool(t, nil), wakeConfig(appName, disableListen))
	advisory.SetFirstPause(l, wakeFirstPause)
	advisory.SetNoPark(l) // these tests wait by polling and wake-ups
	return l
}

// newHolder returns a Locker on db's pool with the default Config: its
// every Release looks for waiters to notify, however briefly the lock was
// held.
func newHolder(t *testing.T, db *pgtest.DB) *advisory.Locker {
	t.Helper()
	return newLocker(t, db.Pool, nil)
}

// interestHolders returns the pids of the sessions holding the interest
// lock of key (shared), as taken by waiting Acquire calls.
func interestHolders(t testing.TB, pool *pgxpool.Pool, key advisory.Key) []int32 {
	t.Helper()
	rows, err := pool.Query(context.Background(), `
		SELECT pid FROM pg_locks
		WHERE locktype = 'advisory' AND granted AND objsubid = 2 AND mode = 'ShareLock'
		  AND classid = $1::bigint::oid
		  AND objid = ((((($2::bigint # ($2::bigint >> 32)) & 4294967295) - 2147483648)::int4)::bigint & 4294967295)::oid
		  AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
		ORDER BY pid`, int64(advisory.InterestClassID), key.Int64())
	return collectPIDs(t, rows, err)
}

// waitInterest waits until exactly n sessions hold key's interest lock
// (n = 0: until nobody does) and returns the holders.
func waitInterest(t testing.TB, pool *pgxpool.Pool, key advisory.Key, n int) []int32 {
	t.Helper()
	var pids []int32
	require.Eventually(t, func() bool {
		pids = interestHolders(t, pool, key)
		return len(pids) == n
	}, 20*time.Second, 5*time.Millisecond, "interest lock of %v held by %d sessions", key, n)
	return pids
}

type lockResult struct {
	lk  *advisory.Lease
	err error
}

// lockAsync runs l.AcquireKey in a goroutine.
func lockAsync(ctx context.Context, l *advisory.Locker, key advisory.Key, opts *advisory.AcquireOpts) <-chan lockResult {
	ch := make(chan lockResult, 1)
	go func() {
		lk, err := l.AcquireKey(ctx, key, opts)
		ch <- lockResult{lk, err}
	}()
	return ch
}

// result waits for a lockAsync result; the bound only guards against
// hanging.
func result(t testing.TB, ch <-chan lockResult) lockResult {
	t.Helper()
	select {
	case r := <-ch:
		return r
	case <-time.After(30 * time.Second):
		t.Fatal("AcquireKey did not return")
		return lockResult{}
	}
}

func TestWakeAcrossLockers(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		shared bool
	}{{"exclusive", false}, {"shared", true}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			db := pgtest.NewDB(t)
			holder := newHolder(t, db)
			waiter := newWaiter(t, db, "wake-"+tc.name, false)
			key := advisory.Name("wake:" + tc.name)

			lk, err := holder.TryAcquireKey(ctx, key, nil)
			require.NoError(t, err)
			opts := &advisory.AcquireOpts{Shared: tc.shared, WaitTimeout: wakeWaitTimeout}
			res := lockAsync(ctx, waiter, key, opts)
			waitInterest(t, db.Pool, key, 1)
			require.NoError(t, lk.Release(ctx))

			r := result(t, res)
			require.NoError(t, r.err, "woken by the Release's NOTIFY before the next poll")
			require.Equal(t, tc.shared, r.lk.Shared())
			require.Greater(t, r.lk.Token(), lk.Token())
			require.NoError(t, r.lk.Release(ctx))
			waitInterest(t, db.Pool, key, 0)
		})
	}
}

// TestWakeDisabled is the negative control of TestWakeAcrossLockers: the
// same wait without wake-ups polls too rarely to see the release within its
// WaitTimeout.
func TestWakeDisabled(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.NewDB(t)
	holder := newHolder(t, db)
	waiter := newWaiter(t, db, "wake-disabled", true)
	key := advisory.Name("wake:disabled")

	lk, err := holder.TryAcquireKey(ctx, key, nil)
	require.NoError(t, err)
	refused := make(chan struct{}, 1)
	advisory.SetOnRefused(waiter, func() {
		select {
		case refused <- struct{}{}:
		default:
		}
	})
	res := lockAsync(ctx, waiter, key, &advisory.AcquireOpts{WaitTimeout: wakeWaitTimeout})
	// The waiter's first refused attempt (after any transient failure,
	// which is retried at once) is followed by a pause past its
	// WaitTimeout. Release once the waiter has counted that refusal.
	select {
	case <-refused:
	case <-time.After(20 * time.Second):
		t.Fatal("the waiter was never refused")
	}
	require.Empty(t, interestHolders(t, db.Pool, key))
	require.NoError(t, lk.Release(ctx))

	r := result(t, res)
	require.ErrorIs(t, r.err, pgfence.ErrNotAcquired)
	require.Zero(t, sessionCount(t, db.Pool, "wake-disabled-listen"), "no LISTEN connection")
}

func TestWakeCancelledWaitReleasesInterest(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.NewDB(t)
	holder := newHolder(t, db)
	waiter := newWaiter(t, db, "wake-cancel", false)
	key := advisory.ID(1 << 40)

	lk, err := holder.TryAcquireKey(ctx, key, nil)
	require.NoError(t, err)
	wctx, cancel := context.WithCancel(ctx)
	res := lockAsync(wctx, waiter, key, nil)
	pids := waitInterest(t, db.Pool, key, 1)
	cancel()
	r := result(t, res)
	require.ErrorIs(t, r.err, context.Canceled)
	waitInterest(t, db.Pool, key, 0)

	// The LISTEN connection stays for the next waiter, which takes the
	// interest lock again on it and is woken.
	res = lockAsync(ctx, waiter, key, &advisory.AcquireOpts{WaitTimeout: wakeWaitTimeout})
	require.Equal(t, pids, waitInterest(t, db.Pool, key, 1))
	require.NoError(t, lk.Release(ctx))
	r = result(t, res)
	require.NoError(t, r.err)
	require.NoError(t, r.lk.Release(ctx))
}

// TestWakeWaitersShareInterest has two waiters of one Locker on one key:
// they share one interest lock, which stays while either waits.
func TestWakeWaitersShareInterest(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.NewDB(t)
	holder := newHolder(t, db)
	waiter := newWaiter(t, db, "wake-share", false)
	key := advisory.ID(-42)

	lk, err := holder.TryAcquireKey(ctx, key, nil)
	require.NoError(t, err)
	opts := &advisory.AcquireOpts{WaitTimeout: wakeWaitTimeout}
	first := lockAsync(ctx, waiter, key, opts)
	waitInterest(t, db.Pool, key, 1)
	second := lockAsync(ctx, waiter, key, opts)
	// The second waiter's attempt fails, as the key is held elsewhere;
	// wait until it, too, has registered (in-process, on the same lock).
	require.Eventually(t, func() bool { return advisory.Waiters(waiter, key) == 2 },
		20*time.Second, time.Millisecond)
	require.Len(t, interestHolders(t, db.Pool, key), 1)
	require.NoError(t, lk.Release(ctx))

	// One waiter wins; the other, in this Locker, is woken by its Release.
	var got lockResult
	select {
	case got = <-first:
	case got = <-second:
	case <-time.After(30 * time.Second):
		t.Fatal("no waiter acquired")
	}
	require.NoError(t, got.err)
	require.NoError(t, got.lk.Release(ctx))
	for _, ch := range []<-chan lockResult{first, second} {
		select {
		case r := <-ch:
			require.NoError(t, r.err)
			require.NoError(t, r.lk.Release(ctx))
		default:
		}
	}
	waitInterest(t, db.Pool, key, 0)
}

// TestWakeListenConnectionLost kills the LISTEN connection while a waiter
// is registered: the Locker reconnects, takes the interest lock again, and
// the waiter is still woken by the Release.
func TestWakeListenConnectionLost(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.NewDB(t)
	holder := newHolder(t, db)
	waiter := newWaiter(t, db, "wake-lost", false)
	key := advisory.Name("wake:lost")

	lk, err := holder.TryAcquireKey(ctx, key, nil)
	require.NoError(t, err)
	res := lockAsync(ctx, waiter, key, &advisory.AcquireOpts{WaitTimeout: 2 * wakeWaitTimeout})
	old := waitInterest(t, db.Pool, key, 1)
	var killed bool
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT pg_terminate_backend($1)`, old[0]).Scan(&killed))
	require.True(t, killed)
	require.Eventually(t, func() bool {
		pids := interestHolders(t, db.Pool, key)
		return len(pids) == 1 && pids[0] != old[0]
	}, 20*time.Second, 5*time.Millisecond, "the interest lock is taken again on a new LISTEN connection")
	require.NoError(t, lk.Release(ctx))
	r := result(t, res)
	require.NoError(t, r.err)
	require.NoError(t, r.lk.Release(ctx))
}

// TestWakeReleaseNotifiesOnlyWaitedKeys listens on the channel: a Release of
// a key nobody waits for sends nothing, one of a waited key sends its key.
func TestWakeReleaseNotifiesOnlyWaitedKeys(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.NewDB(t)
	holder := newHolder(t, db)
	waiter := newWaiter(t, db, "wake-only", false)
	quiet, waited := advisory.ID(1<<41), advisory.ID(1<<41+1)

	listener := db.Conn(t)
	_, err := listener.Exec(ctx, "LISTEN "+advisory.NotifyChannel)
	require.NoError(t, err)

	lkQuiet, err := holder.TryAcquireKey(ctx, quiet, nil)
	require.NoError(t, err)
	lkWaited, err := holder.TryAcquireKey(ctx, waited, nil)
	require.NoError(t, err)
	res := lockAsync(ctx, waiter, waited, &advisory.AcquireOpts{WaitTimeout: wakeWaitTimeout})
	waitInterest(t, db.Pool, waited, 1)
	require.NoError(t, lkQuiet.Release(ctx))
	require.NoError(t, lkWaited.Release(ctx))

	// Notifications arrive in commit order: the first is the waited key's.
	wctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	n, err := listener.WaitForNotification(wctx)
	require.NoError(t, err)
	require.Equal(t, strconv.FormatInt(waited.Int64(), 10), n.Payload)
	r := result(t, res)
	require.NoError(t, r.err)
	require.NoError(t, r.lk.Release(ctx))
}

// TestWakeCloseWhileRegistered closes a Locker whose AcquireKey waits with
// interest registered: AcquireKey returns ErrClosed, and TestMain checks that no
// goroutine (LISTEN loop, pgconn cleanup) is left.
func TestWakeCloseWhileRegistered(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.NewDB(t)
	holder := newHolder(t, db)
	waiter := newWaiter(t, db, "wake-close", false)
	key := advisory.Name("wake:close")

	lk, err := holder.TryAcquireKey(ctx, key, nil)
	require.NoError(t, err)
	res := lockAsync(ctx, waiter, key, nil)
	waitInterest(t, db.Pool, key, 1)
	waiter.Close()
	r := result(t, res)
	require.ErrorIs(t, r.err, pgfence.ErrClosed)
	waitInterest(t, db.Pool, key, 0)
	require.NoError(t, lk.Release(ctx))
}

// TestWakeListenConnectionIdleClosed checks that the LISTEN connection is
// closed once no Acquire has waited for SessionIdleTimeout, and opened again
// by the next wait, which is still woken.
func TestWakeListenConnectionIdleClosed(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.NewDB(t)
	holder := newHolder(t, db)
	cfg := wakeConfig("wake-idle", false)
	cfg.SessionIdleTimeout = 200 * time.Millisecond
	waiter := newLocker(t, db.NewPool(t, nil), cfg)
	advisory.SetFirstPause(waiter, wakeFirstPause)
	advisory.SetNoPark(waiter)
	key := advisory.Name("wake:idle")

	for range 2 {
		lk, err := holder.TryAcquireKey(ctx, key, nil)
		require.NoError(t, err)
		res := lockAsync(ctx, waiter, key, &advisory.AcquireOpts{WaitTimeout: wakeWaitTimeout})
		waitInterest(t, db.Pool, key, 1)
		require.Equal(t, 1, sessionCount(t, db.Pool, "wake-idle-listen"))
		require.NoError(t, lk.Release(ctx))
		r := result(t, res)
		require.NoError(t, r.err)
		require.NoError(t, r.lk.Release(ctx))
		require.Eventually(t, func() bool { return sessionCount(t, db.Pool, "wake-idle-listen") == 0 },
			20*time.Second, 10*time.Millisecond, "the idle LISTEN connection is closed")
	}
}

// TestWakeShortHoldDoesNotNotify is the negative control of the wake-up
// tests: a Release of a lock held less than the Locker's notify threshold
// (a test hook, here an hour; 0 by default) does not look for waiters, and
// a registered waiter then learns of the release only by polling.
func TestWakeShortHoldDoesNotNotify(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.NewDB(t)
	holder := newLocker(t, db.Pool, nil)
	advisory.SetNotifyAfterHeld(holder, time.Hour)
	waiter := newWaiter(t, db, "wake-short", false)
	var refused atomic.Int64
	advisory.SetOnRefused(waiter, func() { refused.Add(1) })
	key := advisory.Name("wake:short")

	lk, err := holder.TryAcquireKey(ctx, key, nil)
	require.NoError(t, err)
	res := lockAsync(ctx, waiter, key, &advisory.AcquireOpts{WaitTimeout: wakeWaitTimeout})
	waitInterest(t, db.Pool, key, 1)
	// Once its interest lock is held the waiter tries again at once (to
	// close the race with a release sent before it was armed): release
	// only after that attempt, too, was refused, or it could take the key
	// without any notification.
	require.Eventually(t, func() bool { return refused.Load() >= 2 }, 20*time.Second, time.Millisecond)
	require.NoError(t, lk.Release(ctx))
	r := result(t, res)
	require.ErrorIs(t, r.err, pgfence.ErrNotAcquired)
}

// TestWakeDefaultHolder uses a holder with the default Config: its Release,
// right after the waiter registered, wakes the waiter, however briefly the
// lock was held.
func TestWakeDefaultHolder(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.NewDB(t)
	holder := newLocker(t, db.Pool, nil)
	waiter := newWaiter(t, db, "wake-default", false)
	key := advisory.Name("wake:default")

	lk, err := holder.TryAcquireKey(ctx, key, nil)
	require.NoError(t, err)
	res := lockAsync(ctx, waiter, key, &advisory.AcquireOpts{WaitTimeout: wakeWaitTimeout})
	waitInterest(t, db.Pool, key, 1)
	require.NoError(t, lk.Release(ctx))
	r := result(t, res)
	require.NoError(t, r.err)
	require.NoError(t, r.lk.Release(ctx))
}

// TestWakeLocalWaitersAskOnce: many calls of one Locker waiting for a key
// that another session holds ask the server for it about once, not once
// each: the others wait behind the one asking, share its refusal, and
// register for the wake-up. The control spreads the same waiters over as
// many Lockers, each of which must ask, so the count can tell the two
// apart. Then the holder's Release hands the key to one of the waiters.
func TestWakeLocalWaitersAskOnce(t *testing.T) {
	t.Parallel()
	const waiters = 20
	for _, tc := range []struct {
		name    string
		lockers int
		atMost  int64 // lock requests sent before the Release
		atLeast int64
	}{
		// One request refused, and at most one more when the interest
		// lock is armed (an attempt at once closes the race with a
		// Release sent before it); never one per waiter.
		{"one Locker", 1, 3, 1},
		{"control: a Locker per waiter", waiters, 3 * waiters, waiters},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			db := pgtest.NewDB(t)
			holder := newHolder(t, db)
			key := advisory.Name("wake:ask-once")
			var requests atomic.Int64
			lockers := make([]*advisory.Locker, tc.lockers)
			for i := range lockers {
				lockers[i] = newWaiter(t, db, "wake-ask-once-"+strconv.Itoa(i), false)
				advisory.SetOnBatch(lockers[i], func(locks, _ int) { requests.Add(int64(locks)) })
			}
			lk, err := holder.TryAcquireKey(ctx, key, nil)
			require.NoError(t, err)
			results := make([]<-chan lockResult, waiters)
			for i := range results {
				results[i] = lockAsync(ctx, lockers[i%len(lockers)], key, nil)
			}
			require.Eventually(t, func() bool {
				n := 0
				for _, l := range lockers {
					n += advisory.Waiters(l, key)
				}
				return n == waiters
			}, 20*time.Second, 5*time.Millisecond, "every waiter registered")
			waitInterest(t, db.Pool, key, tc.lockers)
			got := requests.Load()
			require.GreaterOrEqual(t, got, tc.atLeast)
			require.LessOrEqual(t, got, tc.atMost, "lock requests sent by %d waiters over %d Lockers", waiters, tc.lockers)

			require.NoError(t, lk.Release(ctx))
			// One waiter gets the key, well before any poll (the first is
			// 4-8s after the refusal); the others still wait.
			first := make(chan lockResult, waiters)
			for _, ch := range results {
				go func() {
					select {
					case r := <-ch:
						first <- r
					case <-ctx.Done():
					}
				}()
			}
			select {
			case r := <-first:
				require.NoError(t, r.err)
				require.NoError(t, r.lk.Release(ctx))
			case <-time.After(wakeWaitTimeout):
				t.Fatal("no waiter was handed the key after the Release")
			}
		})
	}
}

// TestLineWakesOneCall: calls of one Locker waiting for a key wait in a
// line, and each release (in this Locker or another) wakes the call at its
// head, not every waiting call. Twenty calls take the key in turn after
// another Locker releases it, each releasing it at once; the wait loops
// they go round in all are counted. The control turns the line off: every
// release and notification then wakes every call still waiting.
func TestLineWakesOneCall(t *testing.T) {
	t.Parallel()
	const waiters = 20
	for _, tc := range []struct {
		name    string
		noLine  bool
		atMost  int64
		atLeast int64
	}{
		// A call goes round once to take the head of the line, once when
		// the call before it releases the key, and once or twice for the
		// notifications of this Locker's own releases (60-75 seen).
		{"line", false, 5 * waiters, waiters},
		// Every call is woken by the releases that come while it waits
		// (up to waiters²/2 in all; 170-310 seen, fewer when wake-ups
		// coalesce on a busy machine): above the line's range.
		{"control: no line", true, 1 << 30, 5*waiters + 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			db := pgtest.NewDB(t)
			holder := newHolder(t, db)
			w := newWaiter(t, db, "wake-line", false)
			if tc.noLine {
				advisory.SetNoLine(w)
			}
			var rounds atomic.Int64
			advisory.SetOnRound(w, func() { rounds.Add(1) })
			key := advisory.Name("wake:line")
			lk, err := holder.TryAcquireKey(ctx, key, nil)
			require.NoError(t, err)
			done := make(chan error, waiters)
			for range waiters {
				go func() {
					l, err := w.AcquireKey(ctx, key, &advisory.AcquireOpts{WaitTimeout: 30 * time.Second})
					if err == nil {
						err = l.Release(ctx)
					}
					done <- err
				}()
			}
			require.Eventually(t, func() bool { return advisory.Waiters(w, key) == waiters && advisory.Registered(w, key) },
				20*time.Second, 5*time.Millisecond, "every call waiting")
			waitInterest(t, db.Pool, key, 1)
			rounds.Store(0)
			require.NoError(t, lk.Release(ctx))
			for range waiters {
				require.NoError(t, <-done)
			}
			got := rounds.Load()
			t.Logf("%d wait rounds for %d calls", got, waiters)
			require.GreaterOrEqual(t, got, tc.atLeast)
			require.LessOrEqual(t, got, tc.atMost)
		})
	}
}

// TestLineHeadLeaves: when the call at the head of a line leaves without
// the key (its ctx ends), the next call takes the head and the line's
// registration with it: the holder's Release in another Locker still wakes
// it by NOTIFY, well before its first poll, and then the call after it.
func TestLineHeadLeaves(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.NewDB(t)
	holder := newHolder(t, db)
	w := newWaiter(t, db, "wake-line-leave", false)
	key := advisory.Name("wake:line-leave")
	lk, err := holder.TryAcquireKey(ctx, key, nil)
	require.NoError(t, err)

	headCtx, cancelHead := context.WithCancel(ctx)
	head := lockAsync(headCtx, w, key, nil)
	require.Eventually(t, func() bool { return advisory.Waiters(w, key) == 1 && advisory.Registered(w, key) },
		20*time.Second, time.Millisecond, "the first call heads the line")
	waitInterest(t, db.Pool, key, 1)
	opts := &advisory.AcquireOpts{WaitTimeout: wakeWaitTimeout + 5*time.Second}
	second := lockAsync(ctx, w, key, opts)
	require.Eventually(t, func() bool { return advisory.Waiters(w, key) == 2 }, 20*time.Second, time.Millisecond)
	third := lockAsync(ctx, w, key, opts)
	require.Eventually(t, func() bool { return advisory.Waiters(w, key) == 3 }, 20*time.Second, time.Millisecond)

	cancelHead()
	require.ErrorIs(t, result(t, head).err, context.Canceled)
	require.Equal(t, 2, advisory.Waiters(w, key))
	require.True(t, advisory.Registered(w, key), "the registration stays with the line")
	require.Len(t, interestHolders(t, db.Pool, key), 1)

	released := time.Now()
	require.NoError(t, lk.Release(ctx))
	r := result(t, second)
	require.NoError(t, r.err)
	require.Less(t, time.Since(released), wakeWaitTimeout, "woken by the NOTIFY, not by a poll (4-8s)")
	require.NoError(t, r.lk.Release(ctx))
	r = result(t, third)
	require.NoError(t, r.err)
	require.NoError(t, r.lk.Release(ctx))
	waitInterest(t, db.Pool, key, 0)
}

// TestWakeBetweenAttemptAndSleep: a release notified after a registered
// waiter's refused attempt, before it sleeps, wakes it: it sleeps on the
// wake channel it took before the attempt. The release comes in the
// waiter's second refusal (the first registers the line), and the waiter
// goes to sleep only once the notification has woken its line. The
// control sleeps on the channel it takes after the attempt and misses the
// notification: its WaitTimeout ends before its next poll.
func TestWakeBetweenAttemptAndSleep(t *testing.T) {
	t.Parallel()
	for _, late := range []bool{false, true} {
		t.Run(fmt.Sprintf("late=%t", late), func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			db := pgtest.NewDB(t)
			holder := newHolder(t, db)
			w := newWaiter(t, db, "wake-between", false)
			if late {
				advisory.SetLateWakeChannel(w)
			}
			key := advisory.Name("wake:between")
			lk, err := holder.TryAcquireKey(ctx, key, nil)
			require.NoError(t, err)
			var refusals atomic.Int32
			releaseErr := make(chan error, 1)
			notified := make(chan struct{}, 1)
			advisory.SetOnNotified(w, func() {
				select {
				case notified <- struct{}{}:
				default:
				}
			})
			advisory.SetOnRefused(w, func() {
				if refusals.Add(1) != 2 {
					return
				}
				err := lk.Release(ctx)
				if err == nil {
					select { // the notification has woken the line before it sleeps
					case <-notified:
					case <-time.After(20 * time.Second):
						err = errors.New("the release's notification never came")
					}
				}
				releaseErr <- err
			})
			r := result(t, lockAsync(ctx, w, key, &advisory.AcquireOpts{WaitTimeout: wakeWaitTimeout}))
			select {
			case err := <-releaseErr:
				require.NoError(t, err)
			default:
				t.Fatal("the waiter was refused fewer than twice: the holder never released")
			}
			if late {
				require.ErrorIs(t, r.err, pgfence.ErrNotAcquired, "control: the notification was missed")
				return
			}
			require.NoError(t, r.err, "woken by the notification that came before the sleep")
			require.NoError(t, r.lk.Release(ctx))
		})
	}
}
