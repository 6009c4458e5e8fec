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

// parkedAcquire starts k.AcquireKey(ctx, key) once holder holds key, and
// waits until k parked for it; it returns the result channel.
func parkedAcquire(t *testing.T, ctx context.Context, k *Locker, key Key) <-chan error {
	t.Helper()
	res := make(chan error, 1)
	go func() {
		lk, err := k.AcquireKey(ctx, key, nil)
		if err == nil {
			err = lk.Release(context.Background())
		}
		res <- err
	}()
	require.Eventually(t, func() bool {
		k.mu.Lock()
		defer k.mu.Unlock()
		for _, s := range k.sessions {
			if s.parked {
				return true
			}
		}
		return false
	}, 20*time.Second, time.Millisecond)
	return res
}

func waitResult(t *testing.T, res <-chan error) error {
	t.Helper()
	select {
	case err := <-res:
		return err
	case <-time.After(30 * time.Second):
		t.Fatal("AcquireKey did not return")
		return nil
	}
}

// TestParkedGrantAsCtxEnds: a parked wait granted just as its ctx ends
// releases the lock and returns ctx's error (the release queues on the
// session the wait held, which it gives back first); the key is free.
func TestParkedGrantAsCtxEnds(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.NewDB(t)
	holder, err := New(ctx, db.Pool, nil)
	require.NoError(t, err)
	t.Cleanup(holder.Close)
	k, err := New(ctx, db.NewPool(t, nil), nil)
	require.NoError(t, err)
	t.Cleanup(k.Close)
	key := ID(78)
	lk, err := holder.TryAcquireKey(ctx, key, nil)
	require.NoError(t, err)

	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var granted *Lease
	hooksOf(k).afterGrant = func(l *Lease) { granted = l; cancel() }
	res := parkedAcquire(t, wctx, k, key)
	require.NoError(t, lk.Release(ctx))
	require.ErrorIs(t, waitResult(t, res), context.Canceled)
	require.NotNil(t, granted, "the parked wait was granted")
	require.ErrorIs(t, granted.Err(), errReleased, "released, not lost")
	require.Zero(t, k.Stats().Held)
	again, err := holder.TryAcquireKey(ctx, key, nil)
	require.NoError(t, err, "the key is free")
	require.NoError(t, again.Release(ctx))
}

// TestParkedGrantLostBeforeHandOut: a parked wait's session that fails
// after the grant and before the hand-out (as the watchdog could make it)
// is not handed out; the wait goes on and gets the key on a new session.
// Negative control: without retries the acquire fails, and hands out
// nothing.
func TestParkedGrantLostBeforeHandOut(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.NewDB(t)
	holder, err := New(ctx, db.Pool, nil)
	require.NoError(t, err)
	t.Cleanup(holder.Close)
	for i, retries := range []bool{true, false} {
		k, err := New(ctx, db.NewPool(t, nil), nil)
		require.NoError(t, err)
		t.Cleanup(k.Close)
		hooksOf(k).noRetry = !retries
		key := ID(int64(80 + i))
		lk, err := holder.TryAcquireKey(ctx, key, nil)
		require.NoError(t, err)
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
		res := parkedAcquire(t, ctx, k, key)
		require.NoError(t, lk.Release(ctx))
		err = waitResult(t, res)
		require.NotNil(t, first)
		require.ErrorIs(t, first.Err(), pgfence.ErrLeaseLost)
		if !retries {
			require.ErrorIs(t, err, pgfence.ErrUnavailable)
			require.Zero(t, k.Stats().Held)
			continue
		}
		require.NoError(t, err, "granted again, then released")
		require.Equal(t, uint64(1), k.Stats().Acquired)
	}
}
