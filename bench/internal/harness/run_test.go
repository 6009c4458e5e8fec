package harness_test

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence/bench/internal/harness"
)

// memLocks is an in-process lock table that checks mutual exclusion, so the
// harness loops can be tested without servers.
type memLocks struct {
	mu         sync.Mutex
	held       map[string]bool
	freed      *sync.Cond
	violations int
	failRel    bool
}

func newMemLocks() *memLocks {
	m := &memLocks{held: map[string]bool{}}
	m.freed = sync.NewCond(&m.mu)
	return m
}

func (m *memLocks) TryAcquire(_ context.Context, name string) (harness.Release, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.held[name] {
		return nil, harness.ErrBusy
	}
	m.held[name] = true
	return m.release(name), nil
}

func (m *memLocks) Acquire(ctx context.Context, name string) (harness.Release, error) {
	stop := context.AfterFunc(ctx, func() {
		m.mu.Lock()
		defer m.mu.Unlock()
		m.freed.Broadcast()
	})
	defer stop()
	m.mu.Lock()
	defer m.mu.Unlock()
	for m.held[name] {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		m.freed.Wait()
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	m.held[name] = true
	return m.release(name), nil
}

func (m *memLocks) release(name string) harness.Release {
	return func(context.Context) error {
		m.mu.Lock()
		defer m.mu.Unlock()
		if !m.held[name] {
			m.violations++
		}
		delete(m.held, name)
		m.freed.Broadcast()
		if m.failRel {
			return errors.New("release refused")
		}
		return nil
	}
}

func (m *memLocks) Close() error { return nil }

// The loops below end by their cycle bound, not by time, so a slow or
// loaded machine changes how long they take but not what they count.

func TestRunCyclesUncontended(t *testing.T) {
	t.Parallel()
	m := newMemLocks()
	res := harness.RunCycles(context.Background(), m, harness.CycleConfig{
		Clients: 4, Duration: time.Minute, MaxCycles: 400,
		Name: func(w, _ int) string { return "n" + strconv.Itoa(w) },
	})
	require.GreaterOrEqual(t, res.Cycles, int64(400))
	require.Equal(t, res.Total, res.Cycles, "no warm-up: every cycle is measured")
	require.Less(t, res.Total, int64(400+4), "each worker finishes at most its cycle in flight")
	require.Zero(t, res.Busy)
	require.Zero(t, res.Errors)
	require.NoError(t, res.FirstErr)
	require.Equal(t, int(res.Cycles), res.Cycle.N)
	require.Equal(t, int(res.Cycles), res.Acquire.N)
	require.LessOrEqual(t, res.Acquire.P50, res.Cycle.P99)
	require.Positive(t, res.Throughput())
	require.Zero(t, m.violations)
}

func TestRunCyclesContendedKeepsExclusion(t *testing.T) {
	t.Parallel()
	m := newMemLocks()
	res := harness.RunCycles(context.Background(), m, harness.CycleConfig{
		Clients: 4, Duration: time.Minute, MaxCycles: 200, Hold: 50 * time.Microsecond,
		Name: func(int, int) string { return "shared" },
	})
	require.GreaterOrEqual(t, res.Cycles, int64(200))
	require.Zero(t, res.Errors)
	require.Zero(t, m.violations)
}

// busyEveryOther reports every other TryAcquire as busy.
type busyEveryOther struct {
	mu    sync.Mutex
	calls int
}

func (b *busyEveryOther) TryAcquire(context.Context, string) (harness.Release, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.calls++
	if b.calls%2 == 1 {
		return nil, harness.ErrBusy
	}
	return func(context.Context) error { return nil }, nil
}

func (b *busyEveryOther) Close() error { return nil }

func TestRunCyclesCountsBusy(t *testing.T) {
	t.Parallel()
	b := &busyEveryOther{}
	res := harness.RunCycles(context.Background(), b, harness.CycleConfig{
		Clients: 2, Duration: time.Minute, MaxCycles: 100,
		Name: func(int, int) string { return "x" },
	})
	require.GreaterOrEqual(t, res.Cycles, int64(100))
	require.Equal(t, int64(b.calls), res.Busy+res.Total, "every call is a busy or a cycle")
	require.GreaterOrEqual(t, res.Busy, res.Total-1)
}

func TestRunCyclesCountsReleaseErrors(t *testing.T) {
	t.Parallel()
	m := newMemLocks()
	m.failRel = true
	res := harness.RunCycles(context.Background(), m, harness.CycleConfig{
		Clients: 2, Duration: 300 * time.Millisecond,
		Name: func(w, _ int) string { return strconv.Itoa(w) },
	})
	require.Zero(t, res.Cycles, "a cycle whose release failed is not counted")
	require.Zero(t, res.Total)
	require.Positive(t, res.Errors)
	require.ErrorContains(t, res.FirstErr, "release: release refused")
}

func TestRunHandover(t *testing.T) {
	t.Parallel()
	m := newMemLocks()
	res := harness.RunHandover(context.Background(), m, harness.HandoverConfig{
		Waiters: 3, Name: "one", Hold: 100 * time.Microsecond,
		Duration: time.Minute, MaxHandovers: 20, Timeout: time.Minute,
	})
	require.GreaterOrEqual(t, len(res.Samples), 20)
	require.Equal(t, len(res.Samples), res.Latency.N)
	require.Zero(t, res.Errors)
	require.Zero(t, m.violations)
	require.False(t, m.held["one"], "the last holder released")
}

func TestRunHandoverSoftBoundWaitsForMinimum(t *testing.T) {
	t.Parallel()
	m := newMemLocks()
	res := harness.RunHandover(context.Background(), m, harness.HandoverConfig{
		Waiters: 2, Name: "one", Duration: time.Nanosecond, MinHandovers: 7, Timeout: time.Minute,
	})
	require.GreaterOrEqual(t, len(res.Samples), 7)
}

type countingWriter struct {
	mu     sync.Mutex
	writes map[int]int
}

func (c *countingWriter) Write(_ context.Context, worker int) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.writes[worker]++
	return nil
}

func (c *countingWriter) Close() error { return nil }

func TestRunWrites(t *testing.T) {
	t.Parallel()
	w := &countingWriter{writes: map[int]int{}}
	res := harness.RunWrites(context.Background(), w, harness.WriteConfig{Clients: 3, Duration: 100 * time.Millisecond})
	require.Zero(t, res.Errors)
	require.Equal(t, int(res.Writes), res.Latency.N)
	total := 0
	for worker, n := range w.writes {
		require.Contains(t, []int{0, 1, 2}, worker, "workers are numbered from 0")
		total += n
	}
	require.GreaterOrEqual(t, int64(total), res.Writes, "only writes inside the window are measured")
}
