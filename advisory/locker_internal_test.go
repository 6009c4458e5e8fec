package advisory

import (
	"context"
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
