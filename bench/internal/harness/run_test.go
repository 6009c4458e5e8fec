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

func TestRunCyclesUncontended(t *testing.T) {
	t.Parallel()
	m := newMemLocks()
	res := harness.RunCycles(context.Background(), m, harness.CycleConfig{
		Clients: 4, Warmup: 10 * time.Millisecond, Duration: 50 * time.Millisecond,
		Name: func(w, _ int) string { return "n" + strconv.Itoa(w) },
	})
	require.Positive(t, res.Cycles)
	require.GreaterOrEqual(t, res.Total, res.Cycles)
	require.Zero(t, res.Busy)
	require.Zero(t, res.Errors)
	require.NoError(t, res.FirstErr)
	require.Equal(t, int(res.Cycles), res.Cycle.N)
	require.Equal(t, int(res.Cycles), res.Acquire.N)
	require.LessOrEqual(t, res.Elapsed, 50*time.Millisecond)
	require.Positive(t, res.Throughput())
	require.Zero(t, m.violations)
}

func TestRunCyclesContendedCountsBusy(t *testing.T) {
	t.Parallel()
	m := newMemLocks()
	res := harness.RunCycles(context.Background(), m, harness.CycleConfig{
		Clients: 4, Duration: 200 * time.Millisecond, Hold: 100 * time.Microsecond,
		Name: func(int, int) string { return "shared" },
	})
	require.Positive(t, res.Cycles)
	require.Positive(t, res.Busy)
	require.Zero(t, res.Errors)
	require.Zero(t, m.violations)
}

func TestRunCyclesStopsAtMaxCycles(t *testing.T) {
	t.Parallel()
	m := newMemLocks()
	res := harness.RunCycles(context.Background(), m, harness.CycleConfig{
		Clients: 3, Duration: time.Minute, MaxCycles: 500,
		Name: func(w, i int) string { return strconv.Itoa(w) + "/" + strconv.Itoa(i%10) },
	})
	require.GreaterOrEqual(t, res.Total, int64(500))
	require.Less(t, res.Total, int64(500+3), "each worker finishes at most its cycle in flight")
}

func TestRunCyclesCountsReleaseErrors(t *testing.T) {
	t.Parallel()
	m := newMemLocks()
	m.failRel = true
	res := harness.RunCycles(context.Background(), m, harness.CycleConfig{
		Clients: 2, Duration: 30 * time.Millisecond,
		Name: func(w, _ int) string { return strconv.Itoa(w) },
	})
	require.Zero(t, res.Cycles)
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
	res := harness.RunWrites(context.Background(), w, harness.WriteConfig{Clients: 3, Duration: 30 * time.Millisecond})
	require.Positive(t, res.Writes)
	require.Zero(t, res.Errors)
	total := 0
	for worker, n := range w.writes {
		require.Contains(t, []int{0, 1, 2}, worker, "workers are numbered from 0")
		total += n
	}
	require.GreaterOrEqual(t, int64(total), res.Writes)
}
