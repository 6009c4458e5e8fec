package pgfence_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence"
	"github.com/pgfence/pgfence/advisory"
	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/leasetable"
)

// strategy is one implementation of pgfence.Locker under the contract
// tests, which every strategy must pass alike (pgx's pgxtest is the model):
// the two lock packages cannot drift apart without one of them failing.
type strategy struct {
	name string
	// newLocker returns a Locker on pool, closed when the test ends.
	newLocker func(t *testing.T, pool *pgxpool.Pool) pgfence.Locker
	// nilLease is the strategy's typed nil handle.
	nilLease pgfence.Lease
	// hasExpiry says whether its handles have a local deadline.
	hasExpiry bool
	// unsupported is an AcquireOpts the strategy must reject.
	unsupported pgfence.AcquireOpts
}

func strategies() []strategy {
	return []strategy{
		{
			name: "leasetable",
			newLocker: func(t *testing.T, pool *pgxpool.Pool) pgfence.Locker {
				k, err := leasetable.New(t.Context(), pool, &leasetable.Config{TTL: 5 * time.Second})
				require.NoError(t, err)
				t.Cleanup(k.Close)
				return k
			},
			nilLease:    (*leasetable.Lease)(nil),
			hasExpiry:   true,
			unsupported: pgfence.AcquireOpts{Shared: true},
		},
		{
			name: "advisory",
			newLocker: func(t *testing.T, pool *pgxpool.Pool) pgfence.Locker {
				k, err := advisory.New(t.Context(), pool, nil)
				require.NoError(t, err)
				t.Cleanup(k.Close)
				return k
			},
			nilLease:    (*advisory.Lease)(nil),
			unsupported: pgfence.AcquireOpts{TTL: time.Second},
		},
	}
}

// contract runs test once per strategy, each on a database of its own.
func contract(t *testing.T, test func(t *testing.T, s strategy, db *pgtest.DB)) {
	t.Helper()
	for _, s := range strategies() {
		t.Run(s.name, func(t *testing.T) {
			t.Parallel()
			test(t, s, pgtest.NewDB(t))
		})
	}
}

func TestContractTryAcquireReleaseHandOver(t *testing.T) {
	t.Parallel()
	contract(t, func(t *testing.T, s strategy, db *pgtest.DB) {
		ctx := t.Context()
		a := s.newLocker(t, db.NewPool(t, nil))
		b := s.newLocker(t, db.NewPool(t, nil))

		la, err := a.TryAcquire(ctx, "job", nil)
		require.NoError(t, err)
		require.Equal(t, "job", la.Name())
		require.Positive(t, la.Token())
		require.NoError(t, la.Err())
		select {
		case <-la.Done():
			t.Fatal("Done closed while held")
		default:
		}
		if s.hasExpiry {
			require.True(t, la.Expiry().After(time.Now()), "a lease with a TTL has a local deadline ahead")
		} else {
			require.True(t, la.Expiry().IsZero(), "a session lock has no local deadline")
		}

		_, err = b.TryAcquire(ctx, "job", nil)
		require.ErrorIs(t, err, pgfence.ErrNotAcquired)
		require.NotErrorIs(t, err, pgfence.ErrAlreadyHeld)

		require.NoError(t, la.Renew(ctx))
		require.NoError(t, la.Release(ctx))
		require.ErrorIs(t, la.Err(), pgfence.ErrNotHeld)
		require.ErrorIs(t, context.Cause(la.Context()), pgfence.ErrNotHeld)
		<-la.Done()
		require.NoError(t, la.Release(ctx), "Release is idempotent")
		require.ErrorIs(t, la.Renew(ctx), pgfence.ErrNotHeld, "a released lock cannot be renewed")
		require.NoError(t, s.nilLease.Release(ctx), "Release on a nil handle")

		lb, err := b.TryAcquire(ctx, "job", nil)
		require.NoError(t, err)
		require.Greater(t, lb.Token(), la.Token(), "tokens only grow")
		require.NoError(t, lb.Release(ctx))
	})
}

func TestContractAcquireWaitsForRelease(t *testing.T) {
	t.Parallel()
	contract(t, func(t *testing.T, s strategy, db *pgtest.DB) {
		ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
		defer cancel()
		a := s.newLocker(t, db.NewPool(t, nil))
		b := s.newLocker(t, db.NewPool(t, nil))
		la, err := a.Acquire(ctx, "job", nil)
		require.NoError(t, err)

		got := make(chan pgfence.Lease, 1)
		errc := make(chan error, 1)
		go func() {
			lb, err := b.Acquire(ctx, "job", nil)
			got <- lb
			errc <- err
		}()
		// Nothing is granted while a holds it; a TryAcquire proves b's wait
		// has nothing to find yet.
		_, err = b.TryAcquire(ctx, "job", nil)
		require.ErrorIs(t, err, pgfence.ErrNotAcquired)
		require.NoError(t, la.Release(ctx))
		lb := <-got
		require.NoError(t, <-errc)
		require.Greater(t, lb.Token(), la.Token())
		require.NoError(t, lb.Release(ctx))
	})
}

func TestContractWaitTimeoutAndContext(t *testing.T) {
	t.Parallel()
	contract(t, func(t *testing.T, s strategy, db *pgtest.DB) {
		ctx := t.Context()
		a := s.newLocker(t, db.NewPool(t, nil))
		b := s.newLocker(t, db.NewPool(t, nil))
		la, err := a.TryAcquire(ctx, "job", nil)
		require.NoError(t, err)
		defer la.Release(ctx)

		_, err = b.Acquire(ctx, "job", &pgfence.AcquireOpts{WaitTimeout: 50 * time.Millisecond})
		require.ErrorIs(t, err, pgfence.ErrNotAcquired)
		require.ErrorIs(t, err, context.DeadlineExceeded)

		err = b.Do(ctx, "job", &pgfence.AcquireOpts{WaitTimeout: 50 * time.Millisecond}, func(context.Context, pgfence.Lease) error {
			t.Error("fn ran without the lock")
			return nil
		})
		require.ErrorIs(t, err, pgfence.ErrNotAcquired)
		require.ErrorIs(t, err, context.DeadlineExceeded)

		cctx, ccancel := context.WithCancelCause(ctx)
		cause := errors.New("caller gave up")
		ccancel(cause)
		_, err = b.Acquire(cctx, "job", nil)
		require.ErrorIs(t, err, cause, "an ended ctx is reported with its cause")
		require.NotErrorIs(t, err, pgfence.ErrNotAcquired)
	})
}

func TestContractAlreadyHeld(t *testing.T) {
	t.Parallel()
	contract(t, func(t *testing.T, s strategy, db *pgtest.DB) {
		ctx := t.Context()
		k := s.newLocker(t, db.Pool)
		l, err := k.TryAcquire(ctx, "job", nil)
		require.NoError(t, err)

		under := l.Context()
		_, err = k.TryAcquire(under, "job", nil)
		require.ErrorIs(t, err, pgfence.ErrAlreadyHeld)
		require.ErrorIs(t, err, pgfence.ErrNotAcquired)
		_, err = k.Acquire(under, "job", nil)
		require.ErrorIs(t, err, pgfence.ErrAlreadyHeld, "Acquire answers at once instead of waiting for itself")

		// Another caller of the same Locker is refused, not told it holds it.
		_, err = k.TryAcquire(ctx, "job", nil)
		require.ErrorIs(t, err, pgfence.ErrNotAcquired)
		require.NotErrorIs(t, err, pgfence.ErrAlreadyHeld)

		// Another name under the same context is fine.
		other, err := k.TryAcquire(under, "other", nil)
		require.NoError(t, err)
		require.NoError(t, other.Release(ctx))
		require.NoError(t, l.Release(ctx))

		// A nested Do is refused at once; the outer one still works.
		var inner error
		err = k.Do(ctx, "job", nil, func(ctx context.Context, _ pgfence.Lease) error {
			inner = k.Do(ctx, "job", nil, func(context.Context, pgfence.Lease) error { return nil })
			return nil
		})
		require.NoError(t, err)
		require.ErrorIs(t, inner, pgfence.ErrAlreadyHeld)
	})
}

func TestContractDoReportsLossJoinedWithFnError(t *testing.T) {
	t.Parallel()
	contract(t, func(t *testing.T, s strategy, db *pgtest.DB) {
		ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
		defer cancel()
		k := s.newLocker(t, db.NewPool(t, nil))
		var token int64
		err := k.Do(ctx, "job", nil, func(ctx context.Context, l pgfence.Lease) error {
			token = l.Token()
			go k.Close() // the lock is lost while fn runs
			<-ctx.Done()
			require.ErrorIs(t, context.Cause(ctx), pgfence.ErrLeaseLost, "fn's ctx says why it ended")
			return ctx.Err()
		})
		require.ErrorIs(t, err, pgfence.ErrLeaseLost, "the loss is reported even though fn failed")
		require.ErrorIs(t, err, context.Canceled, "and so is fn's own error")
		require.Positive(t, token)

		_, err = k.TryAcquire(ctx, "job", nil)
		require.ErrorIs(t, err, pgfence.ErrClosed)
		_, err = k.Acquire(ctx, "job", nil)
		require.ErrorIs(t, err, pgfence.ErrClosed)
	})
}

func TestContractDoReturnsFnErrorAndReleases(t *testing.T) {
	t.Parallel()
	contract(t, func(t *testing.T, s strategy, db *pgtest.DB) {
		ctx := t.Context()
		k := s.newLocker(t, db.NewPool(t, nil))
		boom := errors.New("boom")
		var held pgfence.Lease
		err := k.Do(ctx, "job", nil, func(ctx context.Context, l pgfence.Lease) error {
			held = l
			return boom
		})
		require.ErrorIs(t, err, boom)
		require.NotErrorIs(t, err, pgfence.ErrLeaseLost)
		require.ErrorIs(t, held.Err(), pgfence.ErrNotHeld, "Do released it")

		require.Error(t, k.Do(ctx, "job", nil, nil), "a nil fn is refused")
	})
}

func TestContractRejectsWhatItCannotHonour(t *testing.T) {
	t.Parallel()
	contract(t, func(t *testing.T, s strategy, db *pgtest.DB) {
		ctx := t.Context()
		k := s.newLocker(t, db.Pool)
		opts := s.unsupported
		_, err := k.TryAcquire(ctx, "job", &opts)
		require.Error(t, err)
		require.NotErrorIs(t, err, pgfence.ErrNotAcquired)
		_, err = k.TryAcquire(ctx, "", nil)
		require.Error(t, err, "an empty name")
		require.NotErrorIs(t, err, pgfence.ErrNotAcquired)
		_, err = k.Acquire(ctx, "job", &pgfence.AcquireOpts{WaitTimeout: -time.Second})
		require.Error(t, err, "a negative WaitTimeout")
		l, err := k.TryAcquire(ctx, "job", nil)
		require.NoError(t, err, "nothing was held by the refused calls")
		require.NoError(t, l.Release(ctx))
	})
}

// TestTokensSharedAcrossStrategies: both strategies draw from one
// sequence, so tokens grow across them, whichever is used.
func TestTokensSharedAcrossStrategies(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	db := pgtest.NewDB(t)
	var lockers []pgfence.Locker
	for _, s := range strategies() {
		lockers = append(lockers, s.newLocker(t, db.Pool))
	}
	var last int64
	for i := range 6 {
		l, err := lockers[i%len(lockers)].TryAcquire(ctx, "job", nil)
		require.NoError(t, err)
		require.Greater(t, l.Token(), last)
		last = l.Token()
		require.NoError(t, l.Release(ctx))
	}
}

// recorder is an Observer that keeps every event.
type recorder struct {
	mu     chan struct{}
	events []pgfence.Event
}

func newRecorder() *recorder { return &recorder{mu: make(chan struct{}, 1)} }

func (r *recorder) Observe(_ context.Context, e pgfence.Event) {
	r.mu <- struct{}{}
	r.events = append(r.events, e)
	<-r.mu
}

// kinds returns the type names of the events seen so far, in order.
func (r *recorder) kinds() []string {
	r.mu <- struct{}{}
	defer func() { <-r.mu }()
	var out []string
	for _, e := range r.events {
		switch e.(type) {
		case pgfence.Acquired:
			out = append(out, "Acquired")
		case pgfence.NotAcquired:
			out = append(out, "NotAcquired")
		case pgfence.Released:
			out = append(out, "Released")
		case pgfence.Lost:
			out = append(out, "Lost")
		}
	}
	return out
}

func TestContractEventsAndStats(t *testing.T) {
	t.Parallel()
	for _, s := range strategies() {
		t.Run(s.name, func(t *testing.T) {
			t.Parallel()
			db := pgtest.NewDB(t)
			ctx := t.Context()
			rec := newRecorder()
			var k pgfence.Locker
			switch s.name {
			case "leasetable":
				lk, err := leasetable.New(ctx, db.NewPool(t, nil), &leasetable.Config{TTL: 5 * time.Second, Observer: rec})
				require.NoError(t, err)
				k = lk
			case "advisory":
				ak, err := advisory.New(ctx, db.NewPool(t, nil), &advisory.Config{Observer: rec})
				require.NoError(t, err)
				k = ak
			}
			other := s.newLocker(t, db.NewPool(t, nil))

			l, err := k.TryAcquire(ctx, "job", nil)
			require.NoError(t, err)
			st := k.Stats()
			require.Equal(t, 1, st.Held)
			require.Equal(t, uint64(1), st.Acquired)

			ol, err := other.TryAcquire(ctx, "job2", nil)
			require.NoError(t, err)
			_, err = k.TryAcquire(ctx, "job2", nil)
			require.ErrorIs(t, err, pgfence.ErrNotAcquired)
			require.NoError(t, ol.Release(ctx))

			require.NoError(t, l.Release(ctx))
			l2, err := k.TryAcquire(ctx, "job", nil)
			require.NoError(t, err)
			k.Close() // ends l2 as lost
			<-l2.Done()

			st = k.Stats()
			require.Zero(t, st.Held)
			require.Equal(t, uint64(2), st.Acquired)
			require.Equal(t, uint64(1), st.NotAcquired)
			require.Equal(t, uint64(1), st.Released)
			require.Equal(t, uint64(1), st.Lost)
			require.Zero(t, st.EventsDropped)
			// Close delivered the queued background events before returning.
			require.Equal(t, []string{"Acquired", "NotAcquired", "Released", "Acquired", "Lost"}, rec.kinds())
			for _, e := range rec.events {
				require.Equal(t, s.name, e.Strategy())
				if lost, ok := e.(pgfence.Lost); ok {
					require.ErrorIs(t, lost.Cause, pgfence.ErrClosed)
					require.Equal(t, l2.Token(), lost.Token)
				}
			}
		})
	}
}

// TestContractMaxHold: past AcquireOpts.MaxHold the lock ends with cause
// ErrMaxHold (a loss) and is released at once, so another Locker takes it
// well before a lease-table TTL would end; the next Release reports the
// loss once. Negative control: without MaxHold the lock is still held
// after the same time.
func TestContractMaxHold(t *testing.T) {
	t.Parallel()
	contract(t, func(t *testing.T, s strategy, db *pgtest.DB) {
		ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
		defer cancel()
		a := s.newLocker(t, db.NewPool(t, nil))
		b := s.newLocker(t, db.NewPool(t, nil))

		_, err := a.TryAcquire(ctx, "bounded", &pgfence.AcquireOpts{MaxHold: -time.Second})
		require.Error(t, err, "a negative MaxHold is refused")
		require.NotErrorIs(t, err, pgfence.ErrNotAcquired)

		l, err := a.TryAcquire(ctx, "bounded", &pgfence.AcquireOpts{MaxHold: 300 * time.Millisecond})
		require.NoError(t, err)
		unbounded, err := a.TryAcquire(ctx, "unbounded", nil)
		require.NoError(t, err)
		<-l.Done()
		require.ErrorIs(t, l.Err(), pgfence.ErrMaxHold)
		require.ErrorIs(t, l.Err(), pgfence.ErrLeaseLost)
		require.ErrorIs(t, context.Cause(l.Context()), pgfence.ErrMaxHold)
		// Released, not left to expire (the lease table's TTL is 5s).
		lb, err := b.Acquire(ctx, "bounded", &pgfence.AcquireOpts{WaitTimeout: 2 * time.Second})
		require.NoError(t, err)
		require.Greater(t, lb.Token(), l.Token())
		require.NoError(t, lb.Release(ctx))
		require.ErrorIs(t, l.Release(ctx), pgfence.ErrMaxHold, "the next Release reports the loss")
		require.NoError(t, l.Release(ctx), "once")

		// Negative control: the lock acquired without MaxHold at the same
		// time is still held.
		require.NoError(t, unbounded.Err())
		_, err = b.TryAcquire(ctx, "unbounded", nil)
		require.ErrorIs(t, err, pgfence.ErrNotAcquired)
		require.NoError(t, unbounded.Release(ctx))
	})
}

// TestContractDoErrorOneLine: Do's error joining fn's error with the loss
// is one line ("; " between the parts) and matches every part; fn's error
// alone is returned as it is. Control: errors.Join of the same parts spans
// two lines.
func TestContractDoErrorOneLine(t *testing.T) {
	t.Parallel()
	contract(t, func(t *testing.T, s strategy, db *pgtest.DB) {
		ctx := t.Context()
		k := s.newLocker(t, db.NewPool(t, nil))
		fnErr := errors.New("job failed")
		var loss error
		err := k.Do(ctx, "oneline", &pgfence.AcquireOpts{MaxHold: 50 * time.Millisecond}, func(ctx context.Context, l pgfence.Lease) error {
			<-ctx.Done() // ended by MaxHold
			loss = l.Err()
			return fnErr
		})
		require.ErrorIs(t, err, fnErr)
		require.ErrorIs(t, err, pgfence.ErrMaxHold)
		require.NotContains(t, err.Error(), "\n")
		require.Contains(t, err.Error(), "job failed; ")
		require.Contains(t, errors.Join(fnErr, loss).Error(), "\n", "control: errors.Join spans lines")

		err = k.Do(ctx, "oneline", nil, func(context.Context, pgfence.Lease) error { return fnErr })
		require.EqualError(t, err, "job failed")
	})
}
