package leasetable_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence"
	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/leasetable"
)

func TestReleaseOfNilLease(t *testing.T) {
	t.Parallel()
	var l *leasetable.Lease
	require.NoError(t, l.Release(t.Context()))
	var handle pgfence.Lease = l
	require.NoError(t, handle.Release(t.Context()), "also through the pgfence.Lease interface")
}

// requireClosed checks that ch is closed now.
func requireClosed(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	default:
		t.Fatalf("%s is not closed", what)
	}
}

// Expiry is the local deadline: in the future while held, moved forward by
// each renewal. Renew of a lease the database no longer holds loses it;
// after a release it says so without a round trip.
func TestExpiryAndRenew(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.NewDB(t)
	// The watchdog would renew after 10s: the test's Renew calls come first.
	k := newLocker(t, db.Pool, &leasetable.Config{TTL: 30 * time.Second})

	l, err := k.TryAcquire(ctx, "renewed", nil)
	require.NoError(t, err)
	first := l.Expiry()
	require.True(t, first.After(time.Now()), "Expiry %v is in the future after acquire", first)
	before, ok, err := k.Get(ctx, "renewed")
	require.NoError(t, err)
	require.True(t, ok)

	require.NoError(t, l.Renew(ctx))
	require.True(t, l.Expiry().After(first), "Expiry moves forward: %v, then %v", first, l.Expiry())
	after, ok, err := k.Get(ctx, "renewed")
	require.NoError(t, err)
	require.True(t, ok)
	require.True(t, after.ExpiresAt.After(before.ExpiresAt), "the database's expiry moves forward too")
	require.Equal(t, l.Token(), after.Token)
	require.NoError(t, l.Err())

	// Renew after Release.
	require.NoError(t, l.Release(ctx))
	err = l.Renew(ctx)
	require.ErrorIs(t, err, pgfence.ErrNotHeld)
	require.NotErrorIs(t, err, pgfence.ErrLeaseLost)

	// Renew of a lease whose row expired behind the Locker's back.
	l, err = k.TryAcquire(ctx, "expired", nil)
	require.NoError(t, err)
	require.NoError(t, l.Renew(ctx), "negative control: renewable while the row is held")
	tag, err := db.Pool.Exec(ctx, "UPDATE pgfence.pgfence_leases SET expires_at = now() - interval '1s' WHERE name = 'expired'")
	require.NoError(t, err)
	require.Equal(t, int64(1), tag.RowsAffected())
	err = l.Renew(ctx)
	require.ErrorIs(t, err, pgfence.ErrLeaseLost)
	requireClosed(t, l.Done(), "Done after a failed Renew")
	require.ErrorIs(t, l.Err(), pgfence.ErrLeaseLost)
	require.ErrorIs(t, l.Renew(ctx), pgfence.ErrLeaseLost, "a lost lease stays lost")
	_, ok, err = k.Get(ctx, "expired")
	require.NoError(t, err)
	require.False(t, ok, "an expired lease is never revived")
	require.ErrorIs(t, l.Release(ctx), pgfence.ErrNotHeld)
}

// A wait cut short by AcquireOpts.WaitTimeout is both a failed acquire and
// a deadline, whether the holder is another Locker or another caller of the
// same Locker.
func TestWaitTimeout(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.NewDB(t)
	a := newLocker(t, db.Pool, nil)
	b := newLocker(t, db.NewPool(t, nil), nil)
	l, err := a.TryAcquire(ctx, "busy", &leasetable.AcquireOpts{TTL: time.Hour})
	require.NoError(t, err)
	opts := &leasetable.AcquireOpts{WaitTimeout: 100 * time.Millisecond}

	for _, k := range []*leasetable.Locker{b, a} {
		_, err = k.Acquire(ctx, "busy", opts)
		require.ErrorIs(t, err, pgfence.ErrNotAcquired)
		require.ErrorIs(t, err, context.DeadlineExceeded)
		err = k.Do(ctx, "busy", opts, func(context.Context, pgfence.Lease) error {
			t.Error("fn called without the lease")
			return nil
		})
		require.ErrorIs(t, err, pgfence.ErrNotAcquired)
		require.ErrorIs(t, err, context.DeadlineExceeded)
	}

	// Negative control: the caller's own deadline is not a WaitTimeout.
	dctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	_, err = b.Acquire(dctx, "busy", nil)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.NotErrorIs(t, err, pgfence.ErrNotAcquired)
	require.NoError(t, l.Release(ctx))
}

// When the lease is lost while fn runs and fn returns an error, Do returns
// both: the loss and fn's error.
func TestDoJoinsTheLossWithFnsError(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.NewDB(t)
	// Frequent renewals notice the loss long before the local deadline.
	k := newLocker(t, db.Pool, &leasetable.Config{TTL: 3 * time.Second, RenewInterval: 100 * time.Millisecond})

	var cause error
	err := k.Do(ctx, "job", nil, func(ctx context.Context, l pgfence.Lease) error {
		_, err := db.Pool.Exec(ctx, "UPDATE pgfence.pgfence_leases SET expires_at = now() - interval '1s' WHERE name = 'job'")
		require.NoError(t, err)
		waitFor(t, ctx.Done(), "fn's context to end")
		cause = context.Cause(ctx)
		return ctx.Err()
	})
	require.ErrorIs(t, cause, pgfence.ErrLeaseLost, "fn's context ends because the lease is lost")
	require.ErrorIs(t, err, pgfence.ErrLeaseLost)
	require.ErrorIs(t, err, context.Canceled, "fn's error is kept")
	require.ErrorContains(t, err, "was lost while fn ran")

	// Negative control: fn's error alone when the lease was not lost.
	boom := errors.New("boom")
	err = k.Do(ctx, "job", nil, func(context.Context, pgfence.Lease) error { return boom })
	require.ErrorIs(t, err, boom)
	require.NotErrorIs(t, err, pgfence.ErrLeaseLost)
}

// AcquireOpts.Shared belongs to advisory locks: the lease table refuses it
// before anything is sent.
func TestSharedIsRejected(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.NewDB(t)
	k := newLocker(t, db.Pool, nil)
	shared := &leasetable.AcquireOpts{Shared: true}
	const want = "AcquireOpts.Shared is set; a lease has one holder"

	_, err := k.TryAcquire(ctx, "s", shared)
	require.ErrorContains(t, err, want)
	_, err = k.Acquire(ctx, "s", shared)
	require.ErrorContains(t, err, want)
	err = k.Do(ctx, "s", shared, func(context.Context, pgfence.Lease) error {
		t.Error("fn called with Shared")
		return nil
	})
	require.ErrorContains(t, err, want)

	require.Zero(t, countRows(t, db), "nothing written")
	var drawn bool
	require.NoError(t, db.Pool.QueryRow(ctx, "SELECT is_called FROM pgfence.pgfence_leases_fence_seq").Scan(&drawn))
	require.False(t, drawn, "no token drawn")
	l, err := k.TryAcquire(ctx, "s", &leasetable.AcquireOpts{Shared: false})
	require.NoError(t, err, "negative control: an exclusive lease is taken")
	require.NoError(t, l.Release(ctx))
}
