package advisory_test

import (
	"context"
	"errors"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence"
	"github.com/pgfence/pgfence/advisory"
	"github.com/pgfence/pgfence/internal/pgtest"
)

// batchResult is one queued acquire's outcome.
type batchResult struct {
	l   *advisory.Lease
	err error
}

// batchSetup is a Locker with one session, opened, whose lock statements'
// sizes are recorded.
type batchSetup struct {
	db      *pgtest.DB
	k       *advisory.Locker
	mu      sync.Mutex
	sizes   []int // lock requests per turn
	unlocks []int // unlocks per turn
}

func newBatchSetup(t *testing.T, appName string) *batchSetup {
	t.Helper()
	ctx := context.Background()
	b := &batchSetup{db: pgtest.NewDB(t)}
	cfg := fastConfig(appName)
	cfg.MaxSessions = 1
	b.k = newLocker(t, b.db.Pool, cfg)
	warm, err := b.k.TryAcquireKey(ctx, advisory.ID(1), nil) // opens the session
	require.NoError(t, err)
	require.NoError(t, warm.Release(ctx))
	advisory.SetOnBatch(b.k, func(locks, unlocks int) {
		b.mu.Lock()
		b.sizes = append(b.sizes, locks)
		b.unlocks = append(b.unlocks, unlocks)
		b.mu.Unlock()
	})
	return b
}

// queue starts a TryAcquireKey of key and waits until it is queued on the
// session (whose turn the test holds), or until it returned at once.
func (b *batchSetup) queue(t *testing.T, key advisory.Key, shared bool) <-chan batchResult {
	t.Helper()
	want := advisory.Pending(b.k) + 1
	out := make(chan batchResult, 1)
	go func() {
		l, err := b.k.TryAcquireKey(context.Background(), key, &advisory.AcquireOpts{Shared: shared})
		out <- batchResult{l, err}
	}()
	require.Eventually(t, func() bool { return advisory.Pending(b.k) == want || len(out) == 1 },
		10*time.Second, time.Millisecond, "the acquire did not queue")
	return out
}

// batchSizes returns the number of lock requests of each turn that had
// any.
func (b *batchSetup) batchSizes() []int {
	b.mu.Lock()
	defer b.mu.Unlock()
	var out []int
	for _, n := range b.sizes {
		if n > 0 {
			out = append(out, n)
		}
	}
	return out
}

// unlockSizes returns the number of unlocks of each turn that had any.
func (b *batchSetup) unlockSizes() []int {
	b.mu.Lock()
	defer b.mu.Unlock()
	var out []int
	for _, n := range b.unlocks {
		if n > 0 {
			out = append(out, n)
		}
	}
	return out
}

// TestCombinedGrants checks that acquires queued on one session run in one
// statement and each get the answer they would get alone: a free key is
// granted with its own token, a key held by another session is refused, a
// shared key asked twice is granted twice, and a second exclusive request
// for a key already requested never reaches the statement.
func TestCombinedGrants(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := newBatchSetup(t, "pgfence-batch-grants")
	other := newLocker(t, b.db.Pool, nil)
	keyA, keyB, keyC, keyD := advisory.ID(11), advisory.ID(12), advisory.ID(13), advisory.ID(14)
	held, err := other.TryAcquireKey(ctx, keyB, nil)
	require.NoError(t, err)
	before := b.k.Stats()

	giveBack := advisory.HoldTurn(b.k)
	a := b.queue(t, keyA, false)
	a2 := b.queue(t, keyA, false) // refused in this Locker, without a round trip
	r := <-a2
	require.ErrorIs(t, r.err, pgfence.ErrNotAcquired)
	bb := b.queue(t, keyB, false)
	c1 := b.queue(t, keyC, true)
	c2 := b.queue(t, keyC, true)
	d := b.queue(t, keyD, false)
	require.Equal(t, 5, advisory.Pending(b.k))
	giveBack()

	ra, rb, rc1, rc2, rd := <-a, <-bb, <-c1, <-c2, <-d
	require.Equal(t, []int{5}, b.batchSizes(), "one statement for the five requests")
	require.NoError(t, ra.err)
	require.ErrorIs(t, rb.err, pgfence.ErrNotAcquired)
	require.NoError(t, rc1.err)
	require.NoError(t, rc2.err)
	require.NoError(t, rd.err)
	require.True(t, rc1.l.Shared())
	require.True(t, rc2.l.Shared())
	tokens := map[int64]bool{held.Token(): true}
	for _, l := range []*advisory.Lease{ra.l, rc1.l, rc2.l, rd.l} {
		require.False(t, tokens[l.Token()], "each grant has its own token")
		require.Greater(t, l.Token(), held.Token())
		tokens[l.Token()] = true
	}
	// One sequence value for the statement's tokens:
	// consecutive, in the order of the requests.
	for i, l := range []*advisory.Lease{rc1.l, rc2.l, rd.l} {
		require.Equal(t, ra.l.Token()+int64(i)+1, l.Token(), "the statement's tokens come from one value's block")
	}
	pid := advisory.SessionPID(b.k)
	for _, key := range []advisory.Key{keyA, keyC, keyD} {
		require.Equal(t, []int32{pid}, holderPIDs(t, b.db.Pool, key))
	}
	after := b.k.Stats()
	require.Equal(t, before.Acquired+4, after.Acquired)
	require.Equal(t, before.NotAcquired+2, after.NotAcquired)
	require.Equal(t, 4, after.Held)

	// Each shared grant is a hold of its own: releasing one keeps the other.
	require.NoError(t, rc1.l.Release(ctx))
	require.Equal(t, []int32{pid}, holderPIDs(t, b.db.Pool, keyC))
	// The exclusive key is held: another Locker is refused it.
	_, err = other.TryAcquireKey(ctx, keyA, nil)
	require.ErrorIs(t, err, pgfence.ErrNotAcquired)
	for _, l := range []*advisory.Lease{ra.l, rc2.l, rd.l, held} {
		require.NoError(t, l.Release(ctx))
	}
	require.Zero(t, heldAdvisoryLocks(t, b.db.Pool))
}

// TestServerGrantsAKeyTwiceInOneStatement is the negative control of
// TestCombinedGrants' second request for keyA: the server grants an
// exclusive key twice in one statement of one session (session locks are
// re-entrant), so only the Locker's own check keeps such a request out of
// a combined statement.
func TestServerGrantsAKeyTwiceInOneStatement(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.NewDB(t)
	conn, err := db.Pool.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	var granted int
	require.NoError(t, conn.QueryRow(ctx,
		`SELECT pg_catalog.count(*) FILTER (WHERE pg_catalog.pg_try_advisory_lock(k)) FROM pg_catalog.unnest(ARRAY[21, 21]::pg_catalog.int8[]) AS k`).Scan(&granted))
	require.Equal(t, 2, granted, "both requests won")
	_, err = conn.Exec(ctx, `SELECT pg_catalog.pg_advisory_unlock_all()`)
	require.NoError(t, err)
}

// TestCombinedGrantsServerError checks a combined statement that the server
// fails (here the token draw refuses a sequence that may skip tokens,
// PF002, after the first grant): the grants it left are undone and each
// request runs alone, getting the error it would get alone, and the session
// keeps working. Once the sequence is sound again (the control), the same
// requests are granted.
func TestCombinedGrantsServerError(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := newBatchSetup(t, "pgfence-batch-error")
	seq := pgfence.DefaultSchema + ".pgfence_leases_fence_seq"
	_, err := b.db.Pool.Exec(ctx, "ALTER SEQUENCE "+seq+" CACHE 2")
	require.NoError(t, err)
	keys := []advisory.Key{advisory.ID(31), advisory.ID(32), advisory.ID(33)}

	run := func() []batchResult {
		giveBack := advisory.HoldTurn(b.k)
		var outs []<-chan batchResult
		for _, key := range keys {
			outs = append(outs, b.queue(t, key, false))
		}
		giveBack()
		var rs []batchResult
		for _, o := range outs {
			rs = append(rs, <-o)
		}
		return rs
	}
	pid := advisory.SessionPID(b.k)
	for _, r := range run() {
		var pgErr *pgconn.PgError
		require.True(t, errors.As(r.err, &pgErr), "%v", r.err)
		require.Equal(t, "PF002", pgErr.Code)
		require.NotErrorIs(t, r.err, pgfence.ErrNotAcquired)
	}
	require.Equal(t, []int{3}, b.batchSizes())
	require.Zero(t, heldAdvisoryLocks(t, b.db.Pool), "the failed statement's grants are undone")
	require.Equal(t, pid, advisory.SessionPID(b.k), "the session is kept")

	_, err = b.db.Pool.Exec(ctx, "ALTER SEQUENCE "+seq+" CACHE 1")
	require.NoError(t, err)
	for _, r := range run() {
		require.NoError(t, r.err)
		require.NoError(t, r.l.Release(ctx))
	}
	require.Equal(t, []int{3, 3}, b.batchSizes())
}

// TestCombinedGrantsSessionDies checks that when the session dies under a
// combined statement every request of it fails transiently and is retried
// on a new session, where each is granted; with retries off (the control)
// each returns an error matching pgfence.ErrUnavailable and holds nothing.
func TestCombinedGrantsSessionDies(t *testing.T) {
	t.Parallel()
	for _, retry := range []bool{true, false} {
		name := "retried"
		if !retry {
			name = "no retry"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			b := newBatchSetup(t, "pgfence-batch-dies")
			if !retry {
				advisory.SetNoRetry(b.k)
			}
			keys := []advisory.Key{advisory.ID(41), advisory.ID(42), advisory.ID(43)}
			pid := advisory.SessionPID(b.k)
			giveBack := advisory.HoldTurn(b.k)
			var outs []<-chan batchResult
			for _, key := range keys {
				outs = append(outs, b.queue(t, key, false))
			}
			var ok bool
			require.NoError(t, b.db.Pool.QueryRow(ctx, "SELECT pg_terminate_backend($1, 5000)", pid).Scan(&ok))
			require.True(t, ok)
			giveBack()
			for i, o := range outs {
				r := <-o
				if !retry {
					require.ErrorIs(t, r.err, pgfence.ErrUnavailable)
					continue
				}
				require.NoError(t, r.err)
				require.NotEqual(t, []int32{pid}, holderPIDs(t, b.db.Pool, keys[i]))
				require.Len(t, holderPIDs(t, b.db.Pool, keys[i]), 1)
				require.NoError(t, r.l.Release(ctx))
			}
			require.Equal(t, 3, b.batchSizes()[0])
			require.Zero(t, heldAdvisoryLocks(t, b.db.Pool))
		})
	}
}

// TestCombinedUnlocks checks that Releases queued on one session run in one
// statement, each released, and that the statement wakes a waiter of
// another Locker with NOTIFY. The control: the same releases of locks held
// too briefly to look for waiters do not wake it, which it then sees only
// after its WaitTimeout (it polls too rarely).
func TestCombinedUnlocks(t *testing.T) {
	t.Parallel()
	for _, notify := range []bool{true, false} {
		name := "notify"
		if !notify {
			name = "no notify"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			app := "pgfence-batch-unlock-" + strings.ReplaceAll(name, " ", "-")
			b := newBatchSetup(t, app)
			if notify {
				advisory.SetNotifyAfterHeld(b.k, 0)
			} else {
				advisory.SetNotifyAfterHeld(b.k, time.Hour)
			}
			waiter := newWaiter(t, b.db, app+"-waiter", false)
			keys := []advisory.Key{advisory.ID(51), advisory.ID(52), advisory.ID(53)}
			var leases []*advisory.Lease
			for _, key := range keys {
				l, err := b.k.TryAcquireKey(ctx, key, nil)
				require.NoError(t, err)
				leases = append(leases, l)
			}
			res := lockAsync(ctx, waiter, keys[0], &advisory.AcquireOpts{WaitTimeout: wakeWaitTimeout})
			waitInterest(t, b.db.Pool, keys[0], 1)
			before := b.k.Stats()

			giveBack := advisory.HoldTurn(b.k)
			errs := make(chan error, len(leases))
			for i, l := range leases {
				go func() { errs <- l.Release(ctx) }()
				require.Eventually(t, func() bool { return advisory.Pending(b.k) == i+1 }, 10*time.Second, time.Millisecond)
			}
			giveBack()
			for range leases {
				require.NoError(t, <-errs)
			}
			require.Equal(t, []int{3}, b.unlockSizes(), "one statement for the three unlocks")
			after := b.k.Stats()
			require.Equal(t, before.Released+3, after.Released)
			require.Zero(t, after.Held)
			for _, l := range leases {
				require.ErrorIs(t, l.Err(), pgfence.ErrNotHeld)
			}

			r := result(t, res)
			if !notify {
				require.ErrorIs(t, r.err, pgfence.ErrNotAcquired)
				require.Zero(t, heldAdvisoryLocks(t, b.db.Pool))
				return
			}
			require.NoError(t, r.err, "woken by the combined statement's NOTIFY before the next poll")
			require.Greater(t, r.lk.Token(), leases[0].Token())
			require.NoError(t, r.lk.Release(ctx))
			require.Zero(t, heldAdvisoryLocks(t, b.db.Pool))
		})
	}
}

// TestMixedTurnLockStatementFails checks a turn that runs an unlock and
// lock requests when the lock statement fails (PF002, as in
// TestCombinedGrantsServerError): the unlock stands and its Release
// succeeds, its notification, committed by the unlock's own statement, is
// delivered (a LISTEN connection of the test receives it), each lock
// request gets the error it would get alone, and the session is kept.
func TestMixedTurnLockStatementFails(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := newBatchSetup(t, "pgfence-batch-mixed")
	advisory.SetNotifyAfterHeld(b.k, 0)
	waiter := newWaiter(t, b.db, "pgfence-batch-mixed-waiter", false)
	keyU := advisory.ID(61)
	u, err := b.k.TryAcquireKey(ctx, keyU, nil)
	require.NoError(t, err)
	res := lockAsync(ctx, waiter, keyU, &advisory.AcquireOpts{WaitTimeout: wakeWaitTimeout})
	waitInterest(t, b.db.Pool, keyU, 1)

	listen, err := b.db.Pool.Acquire(ctx)
	require.NoError(t, err)
	defer listen.Release()
	_, err = listen.Exec(ctx, "LISTEN "+advisory.NotifyChannel)
	require.NoError(t, err)
	seq := pgfence.DefaultSchema + ".pgfence_leases_fence_seq"
	_, err = b.db.Pool.Exec(ctx, "ALTER SEQUENCE "+seq+" CACHE 2")
	require.NoError(t, err)
	pid := advisory.SessionPID(b.k)
	locks0, unlocks0 := len(b.batchSizes()), len(b.unlockSizes())

	giveBack := advisory.HoldTurn(b.k)
	g1 := b.queue(t, advisory.ID(62), false)
	g2 := b.queue(t, advisory.ID(63), false)
	released := make(chan error, 1)
	go func() { released <- u.Release(ctx) }()
	require.Eventually(t, func() bool { return advisory.Pending(b.k) == 3 }, 10*time.Second, time.Millisecond)
	giveBack()

	require.NoError(t, <-released, "the unlock stands")
	for _, r := range []batchResult{<-g1, <-g2} {
		var pgErr *pgconn.PgError
		require.True(t, errors.As(r.err, &pgErr), "%v", r.err)
		require.Equal(t, "PF002", pgErr.Code)
	}
	require.Equal(t, []int{2}, b.batchSizes()[locks0:], "one turn")
	require.Equal(t, []int{1}, b.unlockSizes()[unlocks0:], "one turn")
	require.Equal(t, pid, advisory.SessionPID(b.k), "the session is kept")
	require.NotContains(t, holderPIDs(t, b.db.Pool, keyU), pid, "the unlock stands") // the woken waiter may hold it a moment

	nctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	n, err := listen.Conn().WaitForNotification(nctx)
	require.NoError(t, err, "the unlock's notification is delivered")
	require.Equal(t, strconv.FormatInt(keyU.Int64(), 10), n.Payload)

	_, err = b.db.Pool.Exec(ctx, "ALTER SEQUENCE "+seq+" CACHE 1")
	require.NoError(t, err)
	if r := result(t, res); r.err == nil { // woken while the sequence was broken, it failed
		require.NoError(t, r.lk.Release(ctx))
	}
	require.Zero(t, heldAdvisoryLocks(t, b.db.Pool))
}

// TestUnlockDoesNotWaitForGrants checks that a turn answers its unlocks
// before it runs its lock requests: a Release queued with a lock request
// returns while the lock statement waits (here for the token sequence,
// which a test transaction holds with ALTER SEQUENCE). The control: a
// Release queued once that statement runs waits for it, as any request
// on a busy session does.
func TestUnlockDoesNotWaitForGrants(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := newBatchSetup(t, "pgfence-batch-unlock-first")
	u, err := b.k.TryAcquireKey(ctx, advisory.ID(71), nil)
	require.NoError(t, err)
	late, err := b.k.TryAcquireKey(ctx, advisory.ID(72), nil)
	require.NoError(t, err)
	pid := advisory.SessionPID(b.k)

	blocker, err := b.db.Pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = blocker.Rollback(ctx) }()
	_, err = blocker.Exec(ctx, "ALTER SEQUENCE "+pgfence.DefaultSchema+".pgfence_leases_fence_seq CACHE 1")
	require.NoError(t, err)

	giveBack := advisory.HoldTurn(b.k)
	g := b.queue(t, advisory.ID(73), false)
	released := make(chan error, 1)
	go func() { released <- u.Release(ctx) }()
	require.Eventually(t, func() bool { return advisory.Pending(b.k) == 2 }, 10*time.Second, time.Millisecond)
	giveBack()

	require.Eventually(t, func() bool { return backendWaitsOnLock(t, b.db, pid) }, 10*time.Second, time.Millisecond,
		"the lock statement waits for the sequence")
	require.Eventually(t, func() bool { return len(released) == 1 }, 10*time.Second, time.Millisecond,
		"the Release returned while the lock statement of its turn waits")
	require.NoError(t, <-released)
	require.ErrorIs(t, u.Err(), pgfence.ErrNotHeld)

	lateDone := make(chan error, 1)
	go func() { lateDone <- late.Release(ctx) }()
	require.Eventually(t, func() bool { return advisory.Pending(b.k) == 1 }, 10*time.Second, time.Millisecond,
		"control: a Release queued behind the waiting statement stays queued")
	require.Empty(t, g, "the lock request still waits")
	require.Empty(t, lateDone, "control: the queued Release waits for the busy session")

	require.NoError(t, blocker.Rollback(ctx))
	r := <-g
	require.NoError(t, r.err)
	require.Greater(t, r.l.Token(), u.Token())
	require.NoError(t, <-lateDone)
	require.NoError(t, r.l.Release(ctx))
	require.Zero(t, heldAdvisoryLocks(t, b.db.Pool))
}

// backendWaitsOnLock reports whether the backend pid waits for a
// heavyweight lock.
func backendWaitsOnLock(t *testing.T, db *pgtest.DB, pid int32) bool {
	t.Helper()
	var waits bool
	require.NoError(t, db.Pool.QueryRow(context.Background(),
		`SELECT coalesce(bool_or(wait_event_type = 'Lock'), false) FROM pg_stat_activity WHERE pid = $1`, pid).Scan(&waits))
	return waits
}

// TestGrantsQueuedDuringUnlocksJoinTheTurn checks a turn taken by a lock
// request, with an unlock queued too: the Release returns once the unlock
// ran, before the turn's lock statement, and a lock request queued while
// the unlock ran (a caller just released asking again) runs in that
// turn's lock statement, not in the next turn. The control turns the
// second part off (a test hook): that request then has a turn of its own.
func TestGrantsQueuedDuringUnlocksJoinTheTurn(t *testing.T) {
	t.Parallel()
	// The subtests run one after the other: each counts the goroutines
	// of this test blocked for a turn.
	for _, recollect := range []bool{true, false} {
		name := "recollect"
		if !recollect {
			name = "control: next turn"
		}
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			b := newBatchSetup(t, "pgfence-batch-rejoin-"+strconv.FormatBool(recollect))
			if !recollect {
				advisory.SetNoRecollect(b.k)
			}
			u, err := b.k.TryAcquireKey(ctx, advisory.ID(81), nil)
			require.NoError(t, err)
			locks0 := len(b.sizes)

			released := make(chan error, 1)
			entered, proceed := make(chan struct{}), make(chan struct{})
			var once sync.Once
			advisory.SetAfterUnlocks(b.k, func() {
				once.Do(func() {
					close(entered)
					<-proceed
				})
			})

			// The turn goes to the callers in the order they began to wait
			// for it: first the lock request, then the Release.
			giveBack := advisory.HoldTurn(b.k)
			g1 := make(chan batchResult, 1)
			go func() {
				l, err := b.k.TryAcquireKey(ctx, advisory.ID(82), nil)
				g1 <- batchResult{l, err}
			}()
			waitForTurn(t, "TestGrantsQueuedDuringUnlocksJoinTheTurn", 1)
			go func() { released <- u.Release(ctx) }()
			waitForTurn(t, "TestGrantsQueuedDuringUnlocksJoinTheTurn", 2)
			giveBack()

			<-entered
			require.NoError(t, <-released, "the Release returned before the turn's lock statement")
			g2 := b.queue(t, advisory.ID(83), false) // queued while the turn is past its unlocks
			close(proceed)
			for _, r := range []batchResult{<-g1, <-g2} {
				require.NoError(t, r.err)
				require.NoError(t, r.l.Release(ctx))
			}

			b.mu.Lock()
			locks, unlocks := b.sizes[locks0:], b.unlocks[locks0:]
			b.mu.Unlock()
			if recollect {
				require.Equal(t, []int{2}, locks[:1], "both lock requests ran in the unlock's turn")
				require.Equal(t, []int{1}, unlocks[:1])
			} else {
				require.Equal(t, []int{1, 1}, locks[:2], "the second lock request had a turn of its own")
				require.Equal(t, []int{1, 0}, unlocks[:2])
			}
		})
	}
}

// waitForTurn waits until n goroutines started by test (a test function's
// name) wait for a session's turn, as the runtime's goroutine dump shows
// them.
func waitForTurn(t *testing.T, test string, n int) {
	t.Helper()
	buf := make([]byte, 1<<22)
	require.Eventually(t, func() bool {
		dump := string(buf[:runtime.Stack(buf, true)])
		got := 0
		for _, g := range strings.Split(dump, "\n\n") {
			if strings.Contains(g, "[select") && strings.Contains(g, "advisory.(*session).submit") && strings.Contains(g, test) {
				got++
			}
		}
		return got == n
	}, 10*time.Second, time.Millisecond, "%d goroutines waiting for the turn", n)
}

// TestSessionsFillBeforeOpening checks the routing of new keys: they go to
// the open session until it has the fill of acquisitions in flight (2
// here, a test hook), and only then to a new session. The control keeps
// the default fill: the same third acquire queues on the first session.
func TestSessionsFillBeforeOpening(t *testing.T) {
	t.Parallel()
	for _, lowFill := range []bool{true, false} {
		name := "fill 2"
		if !lowFill {
			name = "control: default fill"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			db := pgtest.NewDB(t)
			app := "pgfence-fill-" + strconv.FormatBool(lowFill)
			cfg := fastConfig(app)
			cfg.MaxSessions = 3
			k := newLocker(t, db.Pool, cfg)
			if lowFill {
				advisory.SetSessionFill(k, 2)
			}
			warm, err := k.TryAcquireKey(ctx, advisory.ID(1), nil) // opens the first session
			require.NoError(t, err)
			require.NoError(t, warm.Release(ctx))
			b := &batchSetup{db: db, k: k}

			giveBack := advisory.HoldTurn(k)
			g1 := b.queue(t, advisory.ID(91), false)
			g2 := b.queue(t, advisory.ID(92), false)
			require.Equal(t, 1, advisory.Sessions(k), "two in flight fit on the first session")
			third := make(chan batchResult, 1)
			go func() {
				l, err := k.TryAcquireKey(ctx, advisory.ID(93), nil)
				third <- batchResult{l, err}
			}()
			var r3 batchResult
			if lowFill {
				r3 = <-third // its own session, not held
				require.NoError(t, r3.err)
				require.Equal(t, 2, advisory.Sessions(k), "the third opened a second session")
				require.Equal(t, 2, sessionCount(t, db.Pool, app))
			} else {
				require.Eventually(t, func() bool { return advisory.Pending(k) == 3 }, 10*time.Second, time.Millisecond,
					"control: the third queued on the first session")
				require.Equal(t, 1, advisory.Sessions(k))
			}
			giveBack()
			if !lowFill {
				r3 = <-third
				require.NoError(t, r3.err)
			}
			for _, r := range []batchResult{<-g1, <-g2, r3} {
				require.NoError(t, r.err)
				require.NoError(t, r.l.Release(ctx))
			}
			require.Zero(t, heldAdvisoryLocks(t, db.Pool))
		})
	}
}

// TestCombinedGrantsSplitAtTheLimit: a turn with more lock requests than
// one statement may carry (pgfence_next_tokens draws for at most 65536
// positions; lowered to 2 here) runs them in several statements, in order,
// each request granted with a token greater than those before it. The
// control is the same five requests under the real limit: one statement.
func TestCombinedGrantsSplitAtTheLimit(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := newBatchSetup(t, "pgfence-batch-split")
	var mu sync.Mutex
	var statements []int
	record := func(n int) {
		mu.Lock()
		statements = append(statements, n)
		mu.Unlock()
	}
	run := func(limit int, first int) []int {
		t.Helper()
		mu.Lock()
		statements = nil
		mu.Unlock()
		advisory.SetMaxLockBatch(b.k, limit, record)
		giveBack := advisory.HoldTurn(b.k)
		var outs []<-chan batchResult
		for i := range 5 {
			outs = append(outs, b.queue(t, advisory.ID(int64(first+i)), false))
		}
		giveBack()
		var last int64
		for _, o := range outs {
			r := <-o
			require.NoError(t, r.err)
			require.Greater(t, r.l.Token(), last, "tokens grow in the order of the requests")
			last = r.l.Token()
			require.NoError(t, r.l.Release(ctx))
		}
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(statements)
	}
	require.Equal(t, []int{2, 2, 1}, run(2, 51))
	require.Equal(t, []int{5}, run(65536, 61), "control: the real limit")
}
