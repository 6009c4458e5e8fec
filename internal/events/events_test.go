package events_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence"
	"github.com/pgfence/pgfence/internal/events"
)

type key struct{}

func TestValuesKeepsValuesAndCause(t *testing.T) {
	t.Parallel()
	values := context.WithValue(context.Background(), key{}, "request-7")
	values, cancelValues := context.WithCancel(values)
	cancelValues() // the caller's ctx ending must not end the work

	life, end := context.WithCancelCause(context.Background())
	ctx, stop := events.Values(values, life)
	defer stop()
	require.Equal(t, "request-7", ctx.Value(key{}))
	require.NoError(t, ctx.Err())

	end(pgfence.ErrClosed)
	<-ctx.Done()
	require.ErrorIs(t, context.Cause(ctx), pgfence.ErrClosed)
}

func TestValuesDeadline(t *testing.T) {
	t.Parallel()
	life, cancel := context.WithTimeout(context.Background(), time.Hour)
	defer cancel()
	ctx, stop := events.Values(context.Background(), life)
	defer stop()
	want, _ := life.Deadline()
	got, ok := ctx.Deadline()
	require.True(t, ok)
	require.Equal(t, want, got)
}

type slowObserver struct {
	mu      sync.Mutex
	seen    []pgfence.Event
	release chan struct{}
}

func (o *slowObserver) Observe(_ context.Context, e pgfence.Event) {
	<-o.release
	o.mu.Lock()
	o.seen = append(o.seen, e)
	o.mu.Unlock()
}

func TestAsyncNeverBlocksAndCountsDrops(t *testing.T) {
	t.Parallel()
	obs := &slowObserver{release: make(chan struct{})}
	e := events.New(obs)
	n := events.QueueSize + 50
	done := make(chan struct{})
	go func() {
		for i := 0; i < n; i++ {
			e.Async(context.Background(), pgfence.Renewed{Lock: pgfence.Lock{Kind: pgfence.StrategyLeaseTable, Name: "a", Token: int64(i)}})
		}
		close(done)
	}()
	<-done // returned although the observer is blocked
	require.Positive(t, e.Dropped())
	close(obs.release)
	e.Close()
	obs.mu.Lock()
	defer obs.mu.Unlock()
	require.Equal(t, uint64(n), uint64(len(obs.seen))+e.Dropped())
	// Negative control: after Close an event is dropped, not delivered.
	before := e.Dropped()
	e.Async(context.Background(), pgfence.ListenLost{Kind: pgfence.StrategyAdvisory, Err: errors.New("x")})
	require.Equal(t, before+1, e.Dropped())
}

func TestNilEmitter(t *testing.T) {
	t.Parallel()
	var e *events.Emitter = events.New(nil)
	require.False(t, e.Enabled())
	e.Sync(context.Background(), pgfence.StaleWrite{})
	e.Async(context.Background(), pgfence.StaleWrite{})
	ctx := context.Background()
	require.Equal(t, ctx, e.StartOp(ctx, pgfence.Op{Kind: pgfence.OpAcquire}))
	e.EndOp(ctx, pgfence.Op{}, nil)
	e.Close()
	require.Zero(t, e.Dropped())
}
