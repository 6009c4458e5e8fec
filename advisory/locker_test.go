package advisory_test

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence"
	"github.com/pgfence/pgfence/advisory"
	"github.com/pgfence/pgfence/internal/pgtest"
)

func TestExclusionAcrossLockers(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.NewDB(t)
	a := newLocker(t, db.Pool, nil)
	b := newLocker(t, db.NewPool(t, nil), nil)
	key := advisory.Name("account:42")

	lkA, err := a.TryAcquireKey(ctx, key, nil)
	require.NoError(t, err)
	require.Equal(t, key, lkA.Key())
	require.NoError(t, lkA.Err())

	_, err = b.TryAcquireKey(ctx, key, nil)
	require.ErrorIs(t, err, pgfence.ErrNotAcquired)
	_, err = b.TryAcquireKey(ctx, key, &advisory.AcquireOpts{Shared: true})
	require.ErrorIs(t, err, pgfence.ErrNotAcquired)

	require.NoError(t, lkA.Release(ctx))
	require.ErrorIs(t, lkA.Err(), pgfence.ErrNotHeld)
	<-lkA.Done()
	require.NoError(t, lkA.Release(ctx), "a second Release is a no-op")

	lkB, err := b.TryAcquireKey(ctx, key, nil)
	require.NoError(t, err)
	require.Greater(t, lkB.Token(), lkA.Token(), "the next holder gets a larger token")
	require.Equal(t, 1, heldAdvisoryLocks(t, db.Pool))
	require.NoError(t, lkB.Release(ctx))
	require.Zero(t, heldAdvisoryLocks(t, db.Pool))
}

func TestExclusionWithinLocker(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.NewDB(t)
	l := newLocker(t, db.Pool, nil)
	key := advisory.ID(7)

	// Concurrent TryAcquireKeys: exactly one wins, although the sessions of one
	// Locker would each be granted the key again (locks are re-entrant).
	const n = 20
	var wins atomic.Int32
	locks := make(chan *advisory.Lease, n)
	errs := make(chan error, n)
	var wg sync.WaitGroup
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			lk, err := l.TryAcquireKey(ctx, key, nil)
			if err != nil {
				errs <- err
				return
			}
			wins.Add(1)
			locks <- lk
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.ErrorIs(t, err, pgfence.ErrNotAcquired)
	}
	require.Equal(t, int32(1), wins.Load())
	require.NoError(t, (<-locks).Release(ctx))

	// Waiting acquires from many goroutines take turns: never two inside.
	var inside, maxInside atomic.Int32
	var tokens []int64
	var mu sync.Mutex
	doErrs := make(chan error, n)
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			doErrs <- l.DoKey(ctx, key, nil, func(ctx context.Context, lk pgfence.Lease) error {
				in := inside.Add(1)
				for m := maxInside.Load(); in > m && !maxInside.CompareAndSwap(m, in); m = maxInside.Load() {
				}
				mu.Lock()
				tokens = append(tokens, lk.Token())
				mu.Unlock()
				time.Sleep(time.Millisecond) // widen the window for an overlap
				inside.Add(-1)
				return nil
			})
		}()
	}
	wg.Wait()
	close(doErrs)
	for err := range doErrs {
		require.NoError(t, err)
	}
	require.Equal(t, int32(1), maxInside.Load())
	require.Len(t, tokens, n)
	for i := 1; i < len(tokens); i++ {
		require.Greater(t, tokens[i], tokens[i-1], "holders in turn get increasing tokens")
	}
	require.Zero(t, heldAdvisoryLocks(t, db.Pool))
}

func TestSharedAndExclusive(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.NewDB(t)
	a := newLocker(t, db.Pool, nil)
	b := newLocker(t, db.NewPool(t, nil), nil)
	key := advisory.Name("report")
	shared := &advisory.AcquireOpts{Shared: true}

	s1, err := a.TryAcquireKey(ctx, key, shared)
	require.NoError(t, err)
	require.True(t, s1.Shared())
	s2, err := a.TryAcquireKey(ctx, key, shared)
	require.NoError(t, err, "shared holders in one Locker")
	s3, err := b.TryAcquireKey(ctx, key, shared)
	require.NoError(t, err, "shared holders across Lockers")
	require.Greater(t, s2.Token(), s1.Token())
	require.Greater(t, s3.Token(), s2.Token())

	_, err = a.TryAcquireKey(ctx, key, nil)
	require.ErrorIs(t, err, pgfence.ErrNotAcquired)
	_, err = b.TryAcquireKey(ctx, key, nil)
	require.ErrorIs(t, err, pgfence.ErrNotAcquired)

	require.NoError(t, s1.Release(ctx))
	require.NoError(t, s3.Release(ctx))
	_, err = b.TryAcquireKey(ctx, key, nil)
	require.ErrorIs(t, err, pgfence.ErrNotAcquired, "s2 still holds it shared")
	require.NoError(t, s2.Release(ctx))

	ex, err := b.TryAcquireKey(ctx, key, nil)
	require.NoError(t, err)
	_, err = a.TryAcquireKey(ctx, key, shared)
	require.ErrorIs(t, err, pgfence.ErrNotAcquired)
	_, err = b.TryAcquireKey(ctx, key, shared)
	require.ErrorIs(t, err, pgfence.ErrNotAcquired)
	require.NoError(t, ex.Release(ctx))
	require.Zero(t, heldAdvisoryLocks(t, db.Pool))
}

func TestAcquireWaits(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.NewDB(t)
	a := newLocker(t, db.Pool, nil)
	b := newLocker(t, db.NewPool(t, nil), nil)
	key := advisory.ID(-5)

	held, err := a.TryAcquireKey(ctx, key, nil)
	require.NoError(t, err)

	_, err = b.AcquireKey(ctx, key, &advisory.AcquireOpts{WaitTimeout: 50 * time.Millisecond})
	require.ErrorIs(t, err, pgfence.ErrNotAcquired, "WaitTimeout ran out")
	require.ErrorIs(t, err, context.DeadlineExceeded)

	var lk *advisory.Lease
	var lockErr error
	got := make(chan struct{})
	go func() {
		defer close(got)
		lk, lockErr = b.AcquireKey(ctx, key, nil)
	}()
	require.NoError(t, held.Release(ctx))
	<-got
	require.NoError(t, lockErr)
	require.Greater(t, lk.Token(), held.Token())
	require.NoError(t, lk.Release(ctx))
}

func TestCancelledWaiterHoldsNothing(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.NewDB(t)
	a := newLocker(t, db.Pool, nil)
	b := newLocker(t, db.NewPool(t, nil), nil)
	key := advisory.Name("cancel-me")

	held, err := a.TryAcquireKey(ctx, key, nil)
	require.NoError(t, err)
	// b holds another lock on its sessions, which b's waits share.
	bystander, err := b.TryAcquireKey(ctx, advisory.Name("bystander"), nil)
	require.NoError(t, err)

	// A waiter on another Locker (polling the server) and one on the same
	// Locker (waiting in-process) are cancelled mid-wait.
	for _, l := range []*advisory.Locker{b, a} {
		wctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
		_, err := l.AcquireKey(wctx, key, nil)
		cancel()
		require.ErrorIs(t, err, context.DeadlineExceeded)
		require.Equal(t, []int32{holderPID(t, db, key)}, holderPIDs(t, db.Pool, key))
		require.Equal(t, 2, heldAdvisoryLocks(t, db.Pool))
		require.NoError(t, bystander.Err(), "cancelling a wait cost no other lock")
	}
	require.NoError(t, bystander.Release(ctx))
	// A ctx that ends before the call.
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	_, err = b.AcquireKey(cctx, key, nil)
	require.ErrorIs(t, err, context.Canceled)

	require.NoError(t, held.Release(ctx))
	require.Zero(t, heldAdvisoryLocks(t, db.Pool))
	lk, err := b.TryAcquireKey(ctx, key, nil)
	require.NoError(t, err, "the key is free: no waiter kept it")
	require.NoError(t, lk.Release(ctx))
}

// holderPID returns the one backend pid holding key.
func holderPID(t *testing.T, db *pgtest.DB, key advisory.Key) int32 {
	t.Helper()
	pids := holderPIDs(t, db.Pool, key)
	require.Len(t, pids, 1)
	return pids[0]
}

func TestDo(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.NewDB(t)
	l := newLocker(t, db.Pool, nil)
	key := advisory.Name("job")

	errBoom := errors.New("boom")
	err := l.Do(ctx, "job", nil, func(ctx context.Context, lk pgfence.Lease) error {
		require.Equal(t, 1, heldAdvisoryLocks(t, db.Pool))
		require.Equal(t, []int32{holderPID(t, db, key)}, holderPIDs(t, db.Pool, key), "Do(name) locks Name(name)")
		require.Equal(t, "job", lk.Name())
		require.Equal(t, key, lk.(*advisory.Lease).Key())
		return errBoom
	})
	require.ErrorIs(t, err, errBoom)
	require.Zero(t, heldAdvisoryLocks(t, db.Pool), "Do unlocks after fn")

	require.NoError(t, l.Do(ctx, "job", nil, func(ctx context.Context, lk pgfence.Lease) error { return nil }))
	require.NoError(t, l.DoKey(ctx, key, nil, func(ctx context.Context, lk pgfence.Lease) error {
		require.Equal(t, 1, heldAdvisoryLocks(t, db.Pool))
		return nil
	}))
	require.Zero(t, heldAdvisoryLocks(t, db.Pool), "DoKey unlocks after fn")

	err = l.Do(ctx, "", nil, func(context.Context, pgfence.Lease) error { return nil })
	require.ErrorContains(t, err, "empty lock name")
	err = l.DoKey(ctx, advisory.Name(""), nil, func(context.Context, pgfence.Lease) error { return nil })
	require.ErrorContains(t, err, "empty lock name")
	require.Error(t, l.Do(ctx, "job", nil, nil))
	require.Error(t, l.DoKey(ctx, key, nil, nil))
	require.Zero(t, heldAdvisoryLocks(t, db.Pool))
}

func TestClose(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.NewDB(t)
	l, err := advisory.New(ctx, db.Pool, nil)
	require.NoError(t, err)
	lk, err := l.TryAcquireKey(ctx, advisory.ID(1), nil)
	require.NoError(t, err)

	other := newLocker(t, db.NewPool(t, nil), nil)
	waiting := make(chan error)
	go func() {
		_, err := l.AcquireKey(ctx, advisory.ID(1), nil)
		waiting <- err
	}()

	l.Close()
	l.Close()
	require.ErrorIs(t, <-waiting, pgfence.ErrClosed)
	waitDone(t, lk)
	require.ErrorIs(t, lk.Err(), pgfence.ErrLeaseLost)
	require.ErrorIs(t, lk.Err(), pgfence.ErrClosed)
	require.ErrorIs(t, lk.Release(ctx), pgfence.ErrNotHeld)
	require.NoError(t, lk.Release(ctx))

	_, err = l.TryAcquireKey(ctx, advisory.ID(2), nil)
	require.ErrorIs(t, err, pgfence.ErrClosed)
	_, err = l.AcquireKey(ctx, advisory.ID(2), nil)
	require.ErrorIs(t, err, pgfence.ErrClosed)

	lk2, err := other.TryAcquireKey(ctx, advisory.ID(1), nil)
	require.NoError(t, err, "Close released the lock on the server")
	require.NoError(t, lk2.Release(ctx))
}

func TestBadInput(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.NewDB(t)

	_, err := advisory.New(ctx, nil, nil)
	require.ErrorContains(t, err, "nil pool")
	for _, cfg := range []*advisory.Config{
		{MaxSessions: -1},
		{SessionCheckInterval: -time.Second},
		{QueryTimeout: -1},
		{TCPKeepalivesCount: -1},
		{TCPKeepalivesIdle: 1500 * time.Millisecond},
		{TCPUserTimeout: 1500 * time.Microsecond},
		{QueryTimeout: time.Minute}, // would notice a partition after the server
		{Schema: strings.Repeat("s", 64)},
		{Schema: "a\x00b"},
		{Schema: "\xff"},
	} {
		_, err := advisory.New(ctx, db.Pool, cfg)
		require.Error(t, err, "%+v", cfg)
		require.NotErrorIs(t, err, pgfence.ErrNotInstalled, "rejected before any round trip: %+v", cfg)
	}

	l := newLocker(t, db.Pool, nil)
	_, err = l.TryAcquireKey(ctx, advisory.Name(""), nil)
	require.ErrorContains(t, err, "empty lock name")
	_, err = l.AcquireKey(ctx, advisory.ID(1), &advisory.AcquireOpts{WaitTimeout: -1})
	require.ErrorContains(t, err, "negative")
	_, err = l.TryAcquireTx(ctx, nil, advisory.ID(1), nil)
	require.ErrorContains(t, err, "nil transaction")
	_, err = l.AcquireTx(ctx, nil, advisory.ID(1), nil)
	require.ErrorContains(t, err, "nil transaction")
	require.Zero(t, heldAdvisoryLocks(t, db.Pool))
}

// cancelOnLockTracer cancels a context when a lock statement of the Locker
// has run, to end the caller's context just as the server grants a lock.
type cancelOnLockTracer struct {
	cancel context.CancelFunc
}

type lockStatementKey struct{}

func (tr *cancelOnLockTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	return context.WithValue(ctx, lockStatementKey{}, strings.Contains(data.SQL, "pg_try_advisory_lock("))
}

func (tr *cancelOnLockTracer) TraceQueryEnd(ctx context.Context, _ *pgx.Conn, data pgx.TraceQueryEndData) {
	if isLock, _ := ctx.Value(lockStatementKey{}).(bool); isLock && data.Err == nil {
		tr.cancel()
	}
}

func TestGrantedAsContextEnds(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDB(t)
	for _, wait := range []bool{false, true} {
		ctx, cancel := context.WithCancel(context.Background())
		tracer := &cancelOnLockTracer{cancel: cancel}
		// Lock sessions are dialed with the pool's connection settings,
		// tracer included.
		pool := db.NewPool(t, func(c *pgxpool.Config) { c.ConnConfig.Tracer = tracer })
		l := newLocker(t, pool, nil)
		key := advisory.ID(77)

		var err error
		if wait {
			_, err = l.AcquireKey(ctx, key, nil)
		} else {
			_, err = l.TryAcquireKey(ctx, key, nil)
		}
		require.ErrorIs(t, err, context.Canceled, "wait=%v", wait)
		require.Zero(t, heldAdvisoryLocks(t, db.Pool), "the lock granted as ctx ended was released (wait=%v)", wait)
	}
}

// A key held by another caller of the same Locker is refused without a
// round trip, with an error that names the key and matches ErrNotAcquired.
func TestTryAcquireHeldInThisLocker(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.NewDB(t)
	l := newLocker(t, db.Pool, nil)
	key := advisory.Name("account:7")
	lk, err := l.TryAcquireKey(ctx, key, nil)
	require.NoError(t, err)

	_, err = l.TryAcquireKey(ctx, key, nil)
	require.ErrorIs(t, err, pgfence.ErrNotAcquired)
	require.EqualError(t, err, `pgfence: advisory: lock "account:7" (`+strconv.FormatInt(key.Int64(), 10)+`) is held in this Locker: `+
		pgfence.ErrNotAcquired.Error())
	_, err = l.TryAcquireKey(ctx, advisory.ID(key.Int64()), &advisory.AcquireOpts{Shared: true})
	require.ErrorIs(t, err, pgfence.ErrNotAcquired)

	require.NoError(t, lk.Release(ctx))
	lk, err = l.TryAcquireKey(ctx, key, nil)
	require.NoError(t, err)
	require.NoError(t, lk.Release(ctx))
}
