package advisory_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence"
	"github.com/pgfence/pgfence/advisory"
	"github.com/pgfence/pgfence/internal/pgtest"
)

func TestMaxHoldReached(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.NewDB(t)
	rec := newRecorder()
	cfg := fastConfig("maxhold-reached")
	cfg.Observer = rec
	a := newLocker(t, db.Pool, cfg)
	b := newLocker(t, db.NewPool(t, nil), nil)
	key := advisory.Name("maxhold")

	start := time.Now()
	l, err := a.AcquireKey(ctx, key, &advisory.AcquireOpts{MaxHold: 300 * time.Millisecond})
	require.NoError(t, err)
	waitDone(t, l)
	require.GreaterOrEqual(t, time.Since(start), 300*time.Millisecond)
	require.ErrorIs(t, l.Err(), pgfence.ErrMaxHold)
	require.ErrorIs(t, l.Err(), pgfence.ErrLeaseLost, "existing loss handling sees it as a loss")
	require.ErrorIs(t, context.Cause(l.Context()), pgfence.ErrMaxHold)
	require.ErrorIs(t, l.Renew(ctx), pgfence.ErrMaxHold)

	// The lock is given back in the database: another Locker takes it.
	lost := rec.wait(t, func(s seen) bool { _, ok := s.e.(pgfence.Lost); return ok }).e.(pgfence.Lost)
	require.ErrorIs(t, lost.Cause, pgfence.ErrMaxHold)
	lb, err := b.TryAcquireKey(ctx, key, nil)
	require.NoError(t, err)
	require.NoError(t, lb.Release(ctx))

	err = l.Release(ctx)
	require.ErrorIs(t, err, pgfence.ErrNotHeld)
	require.ErrorIs(t, err, pgfence.ErrMaxHold)
	require.NoError(t, l.Release(ctx), "the loss is reported once")
	st := a.Stats()
	require.Equal(t, uint64(1), st.Lost)
	require.Zero(t, st.Released)
	require.Zero(t, st.Held)
}

func TestMaxHoldNotReached(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.NewDB(t)
	k := newLocker(t, db.Pool, fastConfig("maxhold-not-reached"))
	key := advisory.Name("maxhold")

	l, err := k.AcquireKey(ctx, key, &advisory.AcquireOpts{MaxHold: time.Hour})
	require.NoError(t, err)
	require.NoError(t, l.Renew(ctx))
	require.NoError(t, l.Release(ctx))
	require.ErrorIs(t, l.Err(), pgfence.ErrNotHeld)
	require.NotErrorIs(t, l.Err(), pgfence.ErrLeaseLost)
	st := k.Stats()
	require.Equal(t, uint64(1), st.Released)
	require.Zero(t, st.Lost)

	// Without a bound (zero), a lock is kept past where a bound would
	// have ended it: the bounded lock below ends first while this one
	// is still held.
	free, err := k.TryAcquireKey(ctx, advisory.Name("unbounded"), &advisory.AcquireOpts{MaxHold: 0})
	require.NoError(t, err)
	bounded, err := k.TryAcquireKey(ctx, advisory.Name("bounded"), &advisory.AcquireOpts{MaxHold: 50 * time.Millisecond})
	require.NoError(t, err)
	waitDone(t, bounded)
	require.NoError(t, free.Err())
	require.NoError(t, free.Release(ctx))
}

func TestMaxHoldDo(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.NewDB(t)
	k := newLocker(t, db.Pool, fastConfig("maxhold-do"))

	err := k.Do(ctx, "job", &advisory.AcquireOpts{MaxHold: 100 * time.Millisecond}, func(ctx context.Context, _ pgfence.Lease) error {
		<-ctx.Done()
		require.ErrorIs(t, context.Cause(ctx), pgfence.ErrMaxHold)
		return context.Cause(ctx)
	})
	require.ErrorIs(t, err, pgfence.ErrMaxHold)
	require.ErrorIs(t, err, pgfence.ErrLeaseLost)
	require.Zero(t, heldAdvisoryLocks(t, db.Pool))
}

func TestMaxHoldRejected(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.NewDB(t)
	k := newLocker(t, db.Pool, nil)

	_, err := k.TryAcquire(ctx, "x", &advisory.AcquireOpts{MaxHold: -time.Second})
	require.ErrorContains(t, err, "MaxHold is negative")
	tx, err := db.Pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = k.TryAcquireTx(ctx, tx, advisory.Name("x"), &advisory.AcquireOpts{MaxHold: time.Second})
	require.Error(t, err)
	require.False(t, errors.Is(err, pgfence.ErrNotAcquired))
}
