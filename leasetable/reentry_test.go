package leasetable_test

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence"
	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/leasetable"
)

// acquireCounter counts the acquire statements sent through a pool.
type acquireCounter struct{ n atomic.Int64 }

func (c *acquireCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	if strings.Contains(d.SQL, ".pgfence_acquire(") {
		c.n.Add(1)
	}
	return ctx
}

func (c *acquireCounter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// requireAlreadyHeld checks that err is the error of a nested acquire.
func requireAlreadyHeld(t *testing.T, err error, what string) {
	t.Helper()
	require.ErrorIs(t, err, pgfence.ErrAlreadyHeld, what)
	require.ErrorIs(t, err, pgfence.ErrNotAcquired, what)
}

// An acquire of a name under the context of the held lease of that name
// (or inside Do's fn) returns at once with ErrAlreadyHeld, without a round
// trip and without waiting; other names, and other Lockers, are unaffected.
func TestNestedAcquireIsAlreadyHeld(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.NewDB(t)
	counter := &acquireCounter{}
	k := newLocker(t, db.NewPool(t, func(c *pgxpool.Config) { c.ConnConfig.Tracer = counter }), nil)
	other := newLocker(t, db.Pool, nil)
	noFn := func(context.Context, pgfence.Lease) error {
		t.Error("fn called for a lease its caller holds")
		return nil
	}

	l, err := k.TryAcquire(ctx, "outer", nil)
	require.NoError(t, err)
	sent := counter.n.Load()
	// Bounded far beyond need: an Acquire that waited would end with
	// DeadlineExceeded instead of hanging the test, and fail it.
	under, cancel := context.WithTimeout(l.Context(), time.Minute)
	defer cancel()
	_, err = k.TryAcquire(under, "outer", nil)
	requireAlreadyHeld(t, err, "TryAcquire under the lease's context")
	_, err = k.Acquire(under, "outer", nil)
	requireAlreadyHeld(t, err, "Acquire under the lease's context")
	requireAlreadyHeld(t, k.Do(under, "outer", nil, noFn), "Do under the lease's context")
	require.Equal(t, sent, counter.n.Load(), "a nested acquire sends nothing")
	require.NoError(t, l.Err(), "the held lease is untouched")

	// Negative controls: another name under the same context is acquired,
	// and another Locker asking for the name is refused by the database,
	// not as a nested acquire.
	l2, err := k.TryAcquire(under, "sibling", nil)
	require.NoError(t, err)
	require.NoError(t, l2.Release(ctx))
	_, err = other.TryAcquire(under, "outer", nil)
	require.ErrorIs(t, err, pgfence.ErrNotAcquired)
	require.NotErrorIs(t, err, pgfence.ErrAlreadyHeld)

	require.NoError(t, l.Release(ctx))

	// Inside Do's fn.
	ran := false
	err = k.Do(ctx, "job", nil, func(ctx context.Context, l pgfence.Lease) error {
		ran = true
		_, err := k.TryAcquire(ctx, "job", nil)
		requireAlreadyHeld(t, err, "TryAcquire in fn")
		_, err = k.Acquire(ctx, "job", nil)
		requireAlreadyHeld(t, err, "Acquire in fn")
		requireAlreadyHeld(t, k.Do(ctx, "job", nil, noFn), "Do in fn")
		inner, err := k.Acquire(ctx, "job-step", nil)
		require.NoError(t, err, "negative control: another name is acquired in fn")
		return inner.Release(ctx)
	})
	require.NoError(t, err)
	require.True(t, ran)
}

// TryAcquire of a name another caller of the same Locker holds fails at
// once, saying so, without a round trip.
func TestTryAcquireOfANameHeldInThisLocker(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.NewDB(t)
	counter := &acquireCounter{}
	k := newLocker(t, db.NewPool(t, func(c *pgxpool.Config) { c.ConnConfig.Tracer = counter }), nil)
	l, err := k.TryAcquire(ctx, "mine", nil)
	require.NoError(t, err)
	sent := counter.n.Load()

	got := make(chan error, 1)
	go func() {
		_, err := k.TryAcquire(ctx, "mine", nil)
		got <- err
	}()
	err = <-got
	require.ErrorIs(t, err, pgfence.ErrNotAcquired)
	require.NotErrorIs(t, err, pgfence.ErrAlreadyHeld, "another caller does not hold it")
	require.ErrorContains(t, err, "held by another caller of this Locker")
	require.Equal(t, sent, counter.n.Load(), "answered without a round trip")

	// Negative control: once released, the name is acquired (one round trip).
	require.NoError(t, l.Release(ctx))
	l, err = k.TryAcquire(ctx, "mine", nil)
	require.NoError(t, err)
	require.Equal(t, sent+1, counter.n.Load())
	require.NoError(t, l.Release(ctx))
}

// Acquire of a name another caller of the same Locker holds waits, and
// gets it as soon as the holder releases it, also without LISTEN: the
// release wakes the Locker's own waiters. The holder's lease outlives the
// waiter's deadline, so only that wake-up can hand it over in time.
func TestAcquireWaitsForAnotherCallerOfThisLocker(t *testing.T) {
	t.Parallel()
	for _, disableListen := range []bool{false, true} {
		t.Run(fmt.Sprintf("DisableListen=%v", disableListen), func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			db := pgtest.NewDB(t)
			logs := newLogWatch()
			k := newLocker(t, db.Pool, &leasetable.Config{DisableListen: disableListen, Logger: logs.logger()})
			l, err := k.TryAcquire(ctx, "handover", &leasetable.AcquireOpts{TTL: time.Hour})
			require.NoError(t, err)

			logs.count("waiting for lease")
			waiting := logs.next("waiting for lease")
			got := make(chan acquired, 1)
			go func() {
				wctx, cancel := context.WithTimeout(ctx, time.Minute)
				defer cancel()
				l, err := k.Acquire(wctx, "handover", nil)
				got <- acquired{l, err}
			}()
			waitFor(t, waiting, "the waiter to wait")
			// A round trip while the holder keeps the lease: the waiter
			// does not retry meanwhile, as nothing changed.
			require.NoError(t, l.Renew(ctx))
			select {
			case r := <-got:
				t.Fatalf("Acquire returned while the lease was held: %v", r.err)
			default:
			}
			// It tried once, and once more if the listener connected
			// meanwhile (which wakes every waiter).
			tries := 1
			if !disableListen {
				tries = 2
			}
			require.LessOrEqual(t, logs.count("waiting for lease"), tries, "the waiter waits for the holder instead of retrying")

			require.NoError(t, l.Release(ctx))
			r := <-got
			require.NoError(t, r.err)
			require.Greater(t, r.l.Token(), l.Token())
			require.NoError(t, r.l.Release(ctx))
		})
	}
}
