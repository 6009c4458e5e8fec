package leasetable_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence"
	"github.com/pgfence/pgfence/fence"
	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/leasetable"
)

// heldPermits counts the permits of sem held on the database clock.
func heldPermits(t *testing.T, db *pgtest.DB, sem string) int {
	t.Helper()
	var n int
	require.NoError(t, db.Pool.QueryRow(context.Background(),
		`SELECT count(*) FROM pgfence.pgfence_leases WHERE name LIKE $1 || chr(31) || '%' AND expires_at > now()`, sem).Scan(&n))
	return n
}

// crashedPermit takes a permit of sem as a client that then crashes: it is
// never renewed nor released, and expires after ttl.
func crashedPermit(t *testing.T, db *pgtest.DB, sem string, permits int, ttl time.Duration) (name string, token int64) {
	t.Helper()
	var ok bool
	require.NoError(t, db.Pool.QueryRow(context.Background(),
		`SELECT acquired, name, fence FROM pgfence.pgfence_acquire_permit($1, $2, 'crashed', $3)`,
		sem, permits, ttl.Microseconds()).Scan(&ok, &name, &token))
	require.True(t, ok)
	return name, token
}

func TestPermitCap(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	db := pgtest.NewDB(t)
	a := newLocker(t, db.Pool, &leasetable.Config{Owner: "a"})
	b := newLocker(t, db.NewPool(t, nil), &leasetable.Config{Owner: "b"})

	var held []pgfence.Lease
	slots := map[int]bool{}
	for i := range 3 {
		k := a
		if i == 1 {
			k = b
		}
		l, err := k.TryAcquirePermit(ctx, "api", 3, nil)
		require.NoError(t, err)
		sem, slot, ok := leasetable.SplitPermit(l.Name())
		require.True(t, ok)
		require.Equal(t, "api", sem)
		require.Equal(t, leasetable.PermitName("api", slot), l.Name())
		slots[slot] = true
		held = append(held, l)
	}
	require.Len(t, slots, 3, "three distinct permits")
	_, err := b.TryAcquirePermit(ctx, "api", 3, nil)
	require.ErrorIs(t, err, pgfence.ErrNotAcquired)
	require.Equal(t, 3, heldPermits(t, db, "api"))
	sems, err := b.Semaphores(ctx)
	require.NoError(t, err)
	require.Equal(t, []leasetable.SemaphoreInfo{{Name: "api", Permits: 3, InUse: 3}}, sems)

	// A permit is a lease: renewed, released, and taken again with a newer token.
	require.NoError(t, held[1].(*leasetable.Lease).Renew(ctx))
	require.NoError(t, held[1].Release(ctx))
	l, err := a.TryAcquirePermit(ctx, "api", 3, nil)
	require.NoError(t, err)
	require.Equal(t, held[1].Name(), l.Name(), "the released permit")
	require.Greater(t, l.Token(), held[1].Token())

	for _, l := range []pgfence.Lease{held[0], held[2], l} {
		require.NoError(t, l.Release(ctx))
	}
	sems, err = b.Semaphores(ctx)
	require.NoError(t, err)
	require.Empty(t, sems, "only semaphores with a permit held are listed")

	// An ordinary lease never collides with a permit or the semaphore's name.
	plain, err := b.TryAcquire(ctx, "api", nil)
	require.NoError(t, err)
	require.NoError(t, plain.Release(ctx))
	_, err = b.TryAcquire(ctx, l.Name(), nil)
	require.ErrorContains(t, err, "control character", "a permit's name cannot be asked for as a lease")
}

func TestPermitBadArguments(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	db := pgtest.NewDB(t)
	k := newLocker(t, db.Pool, nil)
	for _, tc := range []struct {
		name    string
		permits int
		want    string
	}{
		{"api", 0, "1 to 1024 permits, not 0"},
		{"api", -1, "1 to 1024 permits, not -1"},
		{"api", leasetable.MaxPermits + 1, "1 to 1024 permits, not 1025"},
		{"", 1, "semaphore name is empty"},
		{"a\x1fb", 1, "control character"},
		{strings.Repeat("s", leasetable.MaxSemaphoreNameLength+1), 1, "at most 507"},
	} {
		_, err := k.TryAcquirePermit(ctx, tc.name, tc.permits, nil)
		require.ErrorContains(t, err, tc.want)
		_, err = k.AcquirePermit(ctx, tc.name, tc.permits, nil)
		require.ErrorContains(t, err, tc.want)
	}
	require.Zero(t, countRows(t, db), "nothing sent")
	// The database refuses the same, whoever calls it.
	for _, n := range []int{0, -1, leasetable.MaxPermits + 1} {
		_, err := db.Pool.Exec(ctx, `SELECT * FROM pgfence.pgfence_acquire_permit('api', $1, 'x', 1000000)`, n)
		require.ErrorContains(t, err, "1 to 1024 permits")
	}
	_, err := db.Pool.Exec(ctx, `SELECT * FROM pgfence.pgfence_acquire_permit('a' || chr(31), 1, 'x', 1000000)`)
	require.ErrorContains(t, err, "without chr(31)")
	l, err := k.TryAcquirePermit(ctx, strings.Repeat("s", leasetable.MaxSemaphoreNameLength), leasetable.MaxPermits, nil)
	require.NoError(t, err, "the longest name and the most permits")
	require.NoError(t, l.Release(ctx))
}

func TestPermitConflictingCount(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	db := pgtest.NewDB(t)
	k := newLocker(t, db.Pool, nil)
	l, err := k.TryAcquirePermit(ctx, "api", 2, nil)
	require.NoError(t, err)
	_, err = k.TryAcquirePermit(ctx, "api", 3, nil)
	require.ErrorIs(t, err, leasetable.ErrPermitsMismatch)
	require.ErrorContains(t, err, "asked for with 3 permits, but has 2")
	_, err = k.AcquirePermit(ctx, "api", 1, nil)
	require.ErrorIs(t, err, leasetable.ErrPermitsMismatch, "a waiting call is refused at once")
	require.NoError(t, l.Release(ctx))

	// With no permit held, a new count replaces the recorded one.
	var got []pgfence.Lease
	for range 3 {
		l, err := k.TryAcquirePermit(ctx, "api", 3, nil)
		require.NoError(t, err)
		got = append(got, l)
	}
	_, err = k.TryAcquirePermit(ctx, "api", 3, nil)
	require.ErrorIs(t, err, pgfence.ErrNotAcquired)
	_, err = k.TryAcquirePermit(ctx, "api", 2, nil)
	require.ErrorIs(t, err, leasetable.ErrPermitsMismatch)
	for _, l := range got {
		require.NoError(t, l.Release(ctx))
	}
}

// TestPermitCrashedHolder: a crashed client's permit is never renewed nor
// released; it returns at its expiry, with no cleaning by hand.
func TestPermitCrashedHolder(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	db := pgtest.NewDB(t)
	k := newLocker(t, db.Pool, nil)
	name, token := crashedPermit(t, db, "jobs", 1, 300*time.Millisecond)
	_, err := k.TryAcquirePermit(ctx, "jobs", 1, nil)
	require.ErrorIs(t, err, pgfence.ErrNotAcquired)
	l, err := k.AcquirePermit(ctx, "jobs", 1, nil)
	require.NoError(t, err)
	require.Equal(t, name, l.Name())
	require.Greater(t, l.Token(), token)
	require.NoError(t, l.Release(ctx))
}

// TestPermitWokenByRelease: a waiter of another Locker is woken by a
// release long before the holder's expiry. The control, a waiter whose
// Locker does not listen, is not.
func TestPermitWokenByRelease(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	db := pgtest.NewDB(t)
	holder := newLocker(t, db.Pool, &leasetable.Config{TTL: time.Minute})
	for _, listen := range []bool{true, false} {
		waiter := newLocker(t, db.NewPool(t, nil), &leasetable.Config{DisableListen: !listen})
		l, err := holder.TryAcquirePermit(ctx, "wake", 1, nil)
		require.NoError(t, err)
		got := make(chan error, 1)
		go func() {
			w, err := waiter.AcquirePermit(ctx, "wake", 1, &pgfence.AcquireOpts{WaitTimeout: 5 * time.Second})
			if err == nil {
				err = w.Release(ctx)
			}
			got <- err
		}()
		require.Eventually(t, func() bool { return waiter.Stats().Waiting == 1 }, 10*time.Second, time.Millisecond)
		time.Sleep(100 * time.Millisecond) // let it reach its wait
		require.NoError(t, l.Release(ctx))
		err = <-got
		if listen {
			require.NoError(t, err, "woken by the release")
		} else {
			require.ErrorIs(t, err, pgfence.ErrNotAcquired, "control: without LISTEN it waits for the expiry, a minute away")
		}
	}
}

// TestPermitNeverOverCap: many callers of several Lockers take and give
// back permits of a semaphore of 3; at no point do more than 3 hold one,
// by the callers' own count and on the database clock.
func TestPermitNeverOverCap(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	db := pgtest.NewDB(t)
	const permits, lockers, callers, rounds = 3, 3, 4, 8
	var inUse, peak atomic.Int64
	var overDB atomic.Bool
	var wg sync.WaitGroup
	for i := range lockers {
		k := newLocker(t, db.NewPool(t, nil), nil)
		for range callers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range rounds {
					l, err := k.AcquirePermit(ctx, "cap", permits, nil)
					if !assertNoErr(t, err) {
						return
					}
					n := inUse.Add(1)
					for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
					}
					if i == 0 && heldPermits(t, db, "cap") > permits {
						overDB.Store(true)
					}
					time.Sleep(2 * time.Millisecond)
					inUse.Add(-1)
					assertNoErr(t, l.Release(ctx))
				}
			}()
		}
	}
	wg.Wait()
	require.LessOrEqual(t, peak.Load(), int64(permits))
	require.GreaterOrEqual(t, peak.Load(), int64(2), "the callers did overlap")
	require.False(t, overDB.Load())
	require.Zero(t, heldPermits(t, db, "cap"))
}

func assertNoErr(t *testing.T, err error) bool {
	t.Helper()
	if err != nil {
		t.Error(err)
		return false
	}
	return true
}

// TestPermitLineOrder: the waiting calls of one Locker for a semaphore are
// served in turn. 12 callers each take a permit of 2 five times; between
// two grants of one caller at most 11 others (each other caller once) come,
// plus the permits' count for grants already in flight (11 to 12 seen).
// The control, without the line, lets callers barge in (33 to 39 seen).
func TestPermitLineOrder(t *testing.T) {
	t.Parallel()
	const callers, rounds, permits = 12, 5, 2
	bound := callers - 1 + permits
	run := func(noLine bool) (worst int) {
		ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
		defer cancel()
		db := pgtest.NewDB(t)
		k := newLocker(t, db.Pool, &leasetable.Config{DisableListen: true})
		if noLine {
			leasetable.SetNoLine(k)
		}
		var mu sync.Mutex
		var order []int
		var wg sync.WaitGroup
		for c := range callers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range rounds {
					l, err := k.AcquirePermit(ctx, "line", permits, nil)
					if !assertNoErr(t, err) {
						return
					}
					mu.Lock()
					order = append(order, c)
					mu.Unlock()
					time.Sleep(time.Millisecond)
					assertNoErr(t, l.Release(ctx))
				}
			}()
		}
		wg.Wait()
		last := map[int]int{}
		for i, c := range order {
			if j, ok := last[c]; ok {
				worst = max(worst, i-j-1)
			}
			last[c] = i
		}
		return worst
	}
	worst := run(false)
	t.Logf("line: at most %d grants between two of one caller (bound %d)", worst, bound)
	require.LessOrEqual(t, worst, bound)
	control := run(true)
	t.Logf("control, no line: %d", control)
	require.Greater(t, control, bound, "control: without the line callers barge in")
}

// TestPermitFencing: permit holders guard their writes with the permit's
// token on a row keyed by the permit. A paused holder whose permit expired
// and passed to another is refused its late write.
func TestPermitFencing(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	db := pgtest.NewDB(t)
	// One guard row per permit of the semaphore.
	_, err := db.Pool.Exec(ctx, `CREATE TABLE permit_work (permit text PRIMARY KEY, done bigint NOT NULL DEFAULT 0,
		fence_token bigint NOT NULL DEFAULT 0)`)
	require.NoError(t, err)
	_, err = db.Pool.Exec(ctx, `INSERT INTO permit_work (permit) VALUES ($1)`, leasetable.PermitName("render", 0))
	require.NoError(t, err)
	work := fence.Update("permit_work").Set("done = done + 1").Where("permit = $1")
	a := newLocker(t, db.Pool, &leasetable.Config{Owner: "a"})
	b := newLocker(t, db.NewPool(t, nil), &leasetable.Config{Owner: "b"})

	la, err := a.TryAcquirePermit(ctx, "render", 1, nil)
	require.NoError(t, err)
	_, err = work.Exec(ctx, db.Pool, la.Token(), la.Name())
	require.NoError(t, err)

	// A pauses past its TTL: its permit expires in the database and B takes it.
	ageLeases(t, db, "1 second", la.Name())
	lb, err := b.TryAcquirePermit(ctx, "render", 1, nil)
	require.NoError(t, err)
	require.Equal(t, la.Name(), lb.Name(), "the same permit")
	require.Greater(t, lb.Token(), la.Token())
	_, err = work.Exec(ctx, db.Pool, la.Token(), la.Name())
	require.NoError(t, err, "negative control: before B writes, token fencing alone accepts A")
	_, err = work.Exec(ctx, db.Pool, lb.Token(), lb.Name())
	require.NoError(t, err)

	_, err = work.Exec(ctx, db.Pool, la.Token(), la.Name())
	require.ErrorIs(t, err, pgfence.ErrFenced, "A's late write")
	_, err = work.UnderLease(la.Name(), la.(*leasetable.Lease).Secret()).Exec(ctx, db.Pool, la.Token(), la.Name())
	require.ErrorIs(t, err, pgfence.ErrLeaseLost, "checked against the permit's row too")
	var done, token int64
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT done, fence_token FROM permit_work`).Scan(&done, &token))
	require.Equal(t, int64(3), done)
	require.Equal(t, lb.Token(), token)
	require.NoError(t, lb.Release(ctx))
	require.True(t, errors.Is(la.Release(ctx), pgfence.ErrNotHeld) || la.Err() != nil)
}

// TestPermitForceRelease: an operator force-releases a permit by its lease
// name; its holder loses it and the next holder gets a newer token.
func TestPermitForceRelease(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	db := pgtest.NewDB(t)
	k := newLocker(t, db.Pool, nil)
	l, err := k.TryAcquirePermit(ctx, "api", 1, nil)
	require.NoError(t, err)
	info, held, err := k.Get(ctx, l.Name())
	require.NoError(t, err)
	require.True(t, held, "Get reads a permit's lease")
	require.Equal(t, l.Token(), info.Token)
	fr, err := k.ForceRelease(ctx, l.Name(), "stuck")
	require.NoError(t, err)
	require.True(t, fr.WasHeld)
	_, held, err = k.Get(ctx, l.Name())
	require.NoError(t, err)
	require.False(t, held)
	require.Equal(t, l.Token(), fr.OldToken)
	require.ErrorIs(t, l.(*leasetable.Lease).Renew(ctx), pgfence.ErrLeaseLost)
	next, err := k.TryAcquirePermit(ctx, "api", 1, nil)
	require.NoError(t, err)
	require.Greater(t, next.Token(), fr.Token)
	require.NoError(t, next.Release(ctx))
	_, err = k.ForceRelease(ctx, "api\x1f01", "x")
	require.ErrorContains(t, err, "control character", "not a permit's name: slot numbers have no leading zero")
	_, _, err = k.Get(ctx, "api\x1f01")
	require.ErrorContains(t, err, "control character")
}
