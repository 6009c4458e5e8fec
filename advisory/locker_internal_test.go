package advisory

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence"
	"github.com/pgfence/pgfence/internal/pgtest"
)

// TestBackendChangeFailsSession simulates a transaction-pooling proxy: the
// session's statements suddenly run on another backend. The Locker must
// treat the session as lost rather than trust locks taken elsewhere.
func TestBackendChangeFailsSession(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.NewDB(t)
	k, err := New(ctx, db.Pool, &Config{SessionCheckInterval: 50 * time.Millisecond})
	require.NoError(t, err)
	t.Cleanup(k.Close)

	lk, err := k.TryAcquireKey(ctx, ID(11), nil)
	require.NoError(t, err)
	s := lk.s
	s.sem <- struct{}{} // as a statement would: nothing else uses the session
	s.pid++             // as if the proxy had moved us to another backend
	<-s.sem

	select {
	case <-lk.Done():
	case <-time.After(30 * time.Second):
		t.Fatal("the watchdog did not notice the backend change")
	}
	require.ErrorIs(t, lk.Err(), pgfence.ErrLeaseLost)
	require.ErrorContains(t, lk.Err(), "pool_mode=transaction")
	require.ErrorContains(t, lk.Err(), "Locker.TryAcquireTx/AcquireTx", "the remedy names methods that exist")
	require.ErrorIs(t, lk.Release(ctx), pgfence.ErrNotHeld)
}

// TestGrantLostBeforeHandOut fails the session of a grant after its lock
// statement answered and before the acquire returns it (as the watchdog
// or another caller's failed statement could): the acquire must not hand
// out the lost lock, and retries on a new session.
func TestGrantLostBeforeHandOut(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.NewDB(t)
	for _, retries := range []bool{true, false} {
		k, err := New(ctx, db.Pool, nil)
		require.NoError(t, err)
		t.Cleanup(k.Close)
		if !retries {
			hooksOf(k).noRetry = true // negative control
		}
		var first *Lease
		hooksOf(k).afterGrant = func(l *Lease) {
			if first != nil {
				return
			}
			first = l
			l.s.sem <- struct{}{}
			l.s.fail(ctx, errors.New("test: the session failed after the grant"))
			<-l.s.sem
		}
		lk, err := k.TryAcquireKey(ctx, ID(77), nil)
		require.NotNil(t, first)
		require.ErrorIs(t, first.Err(), pgfence.ErrLeaseLost, "the first grant was lost before its hand-out")
		if !retries {
			require.ErrorIs(t, err, pgfence.ErrUnavailable)
			require.Nil(t, lk, "no lease, rather than a lost one")
			require.Zero(t, k.Stats().Lost, "a lock never handed out is not counted lost")
			continue
		}
		require.NoError(t, err)
		require.NotSame(t, first, lk)
		require.NoError(t, lk.Err(), "the lease returned is held")
		require.Greater(t, lk.Token(), first.Token())
		st := k.Stats()
		require.Equal(t, uint64(1), st.Acquired)
		require.Zero(t, st.Lost)
		require.Equal(t, 1, st.Held)
		require.NoError(t, lk.Release(ctx))
	}
}
