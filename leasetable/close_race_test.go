package leasetable_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/leasetable"
)

// TestCloseRacingAcquire: Close while callers acquire never leaves a lease
// held in the database once it returns: a grant in flight when Close began
// is adopted and released by Close, or given back before Close returns.
// Negative control: a Close that does not wait for grants in flight leaves
// leases held.
func TestCloseRacingAcquire(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDB(t)
	left := func(t *testing.T, noWait bool, rounds int) int {
		ctx := context.Background()
		total := 0
		for round := range rounds {
			owner := fmt.Sprintf("close-race-%t-%d", noWait, round)
			k, err := leasetable.New(ctx, db.Pool, &leasetable.Config{Owner: owner, TTL: time.Minute})
			require.NoError(t, err)
			if noWait {
				leasetable.SetNoGrantWait(k)
			}
			started := make(chan struct{}, 8)
			var wg sync.WaitGroup
			for g := range 8 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i := 0; ; i++ {
						_, err := k.TryAcquire(ctx, fmt.Sprintf("%s-%d-%d", owner, g, i), nil)
						if err != nil {
							return // ErrClosed
						}
						select {
						case started <- struct{}{}:
						default:
						}
					}
				}()
			}
			<-started
			k.Close()
			var held int
			require.NoError(t, db.Pool.QueryRow(ctx,
				"SELECT count(*) FROM pgfence.pgfence_leases WHERE owner = $1 AND expires_at > clock_timestamp()", owner).Scan(&held))
			total += held
			wg.Wait()
		}
		return total
	}
	require.Zero(t, left(t, false, 30), "no lease held once Close returned")
	control := left(t, true, 30)
	t.Logf("negative control: %d leases held after Close returned, in 30 rounds", control)
	require.Positive(t, control, "negative control: a Close that cuts the statement in flight and does not wait leaves leases held")
}

// TestEndedContextSendsNothing: TryAcquire and Acquire with a ctx that has
// already ended return its error (and cause) without sending a statement,
// and the name stays free. Negative control: the same calls with a live
// ctx send one.
func TestEndedContextSendsNothing(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.NewDB(t)
	counter := &acquireCounter{}
	k := newLocker(t, db.NewPool(t, func(c *pgxpool.Config) { c.ConnConfig.Tracer = counter }), nil)
	cause := errors.New("the caller gave up")
	ended, cancel := context.WithCancelCause(ctx)
	cancel(cause)
	_, err := k.TryAcquire(ended, "free", nil)
	require.ErrorIs(t, err, context.Canceled)
	require.ErrorIs(t, err, cause)
	_, err = k.Acquire(ended, "free", nil)
	require.ErrorIs(t, err, context.Canceled)
	require.ErrorIs(t, err, cause)
	require.Zero(t, counter.n.Load(), "no statement sent")

	l, err := k.TryAcquire(ctx, "free", nil)
	require.NoError(t, err, "the name is free")
	require.Equal(t, int64(1), counter.n.Load(), "negative control: a live ctx sends the statement")
	require.NoError(t, l.Release(ctx))
}

// TestFarExpiryDoesNotSpin: a holder's expiry centuries ahead (written by
// hand: pgfence's functions refuse more than MaxTTL) makes a waiting
// Acquire wait, not loop: a handful of statements in a second. Control:
// the wait computed without the clamp (expiry - now, plus jitter) wraps
// negative.
func TestFarExpiryDoesNotSpin(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.NewDB(t)
	holder := newLocker(t, db.Pool, nil)
	l, err := holder.TryAcquire(ctx, "far", nil)
	require.NoError(t, err)
	defer func() { _ = l.Release(ctx) }()
	_, err = db.Pool.Exec(ctx, "UPDATE pgfence.pgfence_leases SET expires_at = '2500-01-01' WHERE name = 'far'")
	require.NoError(t, err)

	counter := &acquireCounter{}
	waiter := newLocker(t, db.NewPool(t, func(c *pgxpool.Config) { c.ConnConfig.Tracer = counter }), nil)
	wctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	_, err = waiter.Acquire(wctx, "far", nil)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	t.Logf("acquire statements in a second: %d", counter.n.Load())
	require.LessOrEqual(t, counter.n.Load(), int64(5))

	far := time.Date(2500, 1, 1, 0, 0, 0, 0, time.UTC).Sub(time.Now())
	require.Negative(t, far+5*time.Millisecond, "control: the unclamped wait overflows")
}
