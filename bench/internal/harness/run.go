package harness

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pgfence/pgfence/bench/internal/stats"
)

// CycleConfig bounds an acquire+release loop.
type CycleConfig struct {
	Clients  int           // concurrent workers
	Warmup   time.Duration // run but do not record for this long first
	Duration time.Duration // measure for this long
	// MaxCycles, when positive, ends the run after this many successful
	// cycles in total (warm-up cycles included), or at Warmup+Duration,
	// whichever comes first.
	MaxCycles int64
	// Name returns the lock name worker w uses for its i-th attempt.
	Name func(w, i int) string
	// Hold is how long each lock is held between acquire and release.
	Hold time.Duration
}

// CycleResult is what an acquire+release loop measured.
type CycleResult struct {
	Elapsed  time.Duration // measured wall time
	Cycles   int64         // successful acquire+release cycles measured
	Busy     int64         // TryAcquire calls that found the lock held
	Errors   int64         // failed calls (not ErrBusy)
	FirstErr error         // the first failure, for the log
	Total    int64         // successful cycles including warm-up
	Cycle    stats.Summary // latency of a whole successful cycle
	Acquire  stats.Summary // latency of a successful TryAcquire
}

// Throughput returns successful cycles per second.
func (r *CycleResult) Throughput() float64 { return stats.Rate(int(r.Cycles), r.Elapsed) }

// RunCycles runs cfg.Clients workers that each repeat TryAcquire, hold,
// release on the names cfg.Name gives them, until the time or cycle bound.
// A busy lock is counted and retried at once with the next name.
func RunCycles(ctx context.Context, sys System, cfg CycleConfig) CycleResult {
	start := time.Now()
	measureFrom := start.Add(cfg.Warmup)
	end := measureFrom.Add(cfg.Duration)
	ctx, cancel := context.WithDeadline(ctx, end.Add(30*time.Second))
	defer cancel()

	var (
		total    atomic.Int64
		mu       sync.Mutex
		res      CycleResult
		cycleAll []time.Duration
		acqAll   []time.Duration
		wg       sync.WaitGroup
	)
	for w := 0; w < cfg.Clients; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var cyc, acq []time.Duration
			var busy, errs int64
			var firstErr error
			fail := func(err error) {
				errs++
				if firstErr == nil {
					firstErr = err
				}
				time.Sleep(10 * time.Millisecond) // do not spin on a broken server
			}
			for i := 0; ; i++ {
				t0 := time.Now()
				if !t0.Before(end) || (cfg.MaxCycles > 0 && total.Load() >= cfg.MaxCycles) || ctx.Err() != nil {
					break
				}
				measured := !t0.Before(measureFrom)
				rel, err := sys.TryAcquire(ctx, cfg.Name(w, i))
				t1 := time.Now()
				if errors.Is(err, ErrBusy) {
					if measured {
						busy++
					}
					continue
				}
				if err != nil {
					if measured {
						fail(err)
					}
					continue
				}
				if cfg.Hold > 0 {
					time.Sleep(cfg.Hold)
				}
				if err := rel(ctx); err != nil {
					if measured {
						fail(fmt.Errorf("release: %w", err))
					}
					continue
				}
				t2 := time.Now()
				total.Add(1)
				if measured && !t2.After(end) {
					cyc = append(cyc, t2.Sub(t0))
					acq = append(acq, t1.Sub(t0))
				}
			}
			mu.Lock()
			defer mu.Unlock()
			cycleAll = append(cycleAll, cyc...)
			acqAll = append(acqAll, acq...)
			res.Busy += busy
			res.Errors += errs
			if res.FirstErr == nil {
				res.FirstErr = firstErr
			}
		}()
	}
	wg.Wait()
	stop := time.Now()
	if stop.After(end) {
		stop = end
	}
	res.Elapsed = stop.Sub(measureFrom)
	if res.Elapsed < 0 {
		res.Elapsed = 0
	}
	res.Cycles = int64(len(cycleAll))
	res.Total = total.Load()
	res.Cycle = stats.Summarize(cycleAll)
	res.Acquire = stats.Summarize(acqAll)
	return res
}

// HandoverConfig bounds a hand-over run.
type HandoverConfig struct {
	Waiters int           // workers besides the holder; all want the same name
	Name    string        // the one contended name
	Hold    time.Duration // how long each holder keeps the lock
	// Duration is the soft bound: once it has passed and at least
	// MinHandovers were recorded, the run ends at the next hand-over.
	Duration     time.Duration
	MinHandovers int
	// MaxHandovers, when positive, ends the run after this many recorded
	// hand-overs.
	MaxHandovers int
	// Timeout is the hard bound: the run ends then, however many
	// hand-overs were recorded (waiting acquires are cancelled).
	Timeout time.Duration
}

// HandoverResult is what a hand-over run measured.
type HandoverResult struct {
	Samples  []time.Duration // sorted hand-over latencies
	Latency  stats.Summary
	Errors   int64
	FirstErr error
}

// RunHandover measures how long a lock takes to pass from a releasing holder
// to the next waiter: Waiters+1 workers wait in Acquire on one name; the
// holder keeps the lock for Hold, notes the time and releases; the latency is
// from that moment until a waiter's Acquire returns. A releasing worker only
// queues again after someone else took the lock, so every recorded hand-over
// goes to a worker that was already waiting.
func RunHandover(ctx context.Context, sys Waiter, cfg HandoverConfig) HandoverResult {
	start := time.Now()
	if cfg.Timeout < cfg.Duration {
		cfg.Timeout = cfg.Duration
	}
	ctx, cancel := context.WithTimeout(ctx, cfg.Timeout)
	defer cancel()

	var (
		mu         sync.Mutex
		releasedAt time.Time     // when the current holder started to release; zero if none pending
		taken      chan struct{} // closed when the next holder takes the lock
		res        HandoverResult
		wg         sync.WaitGroup
	)
	taken = make(chan struct{})
	fail := func(err error) {
		mu.Lock()
		defer mu.Unlock()
		res.Errors++
		if res.FirstErr == nil {
			res.FirstErr = err
		}
	}
	for w := 0; w <= cfg.Waiters; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				rel, err := sys.Acquire(ctx, cfg.Name)
				now := time.Now()
				if err != nil {
					if ctx.Err() == nil {
						fail(err)
						time.Sleep(10 * time.Millisecond)
					}
					continue
				}
				mu.Lock()
				if !releasedAt.IsZero() {
					res.Samples = append(res.Samples, now.Sub(releasedAt))
					releasedAt = time.Time{}
				}
				close(taken)
				taken = make(chan struct{})
				n := len(res.Samples)
				enough := (cfg.MaxHandovers > 0 && n >= cfg.MaxHandovers) ||
					(time.Since(start) >= cfg.Duration && n >= cfg.MinHandovers)
				mu.Unlock()
				if enough {
					cancel()
				}

				select {
				case <-time.After(cfg.Hold):
				case <-ctx.Done():
				}
				mu.Lock()
				next := taken
				if ctx.Err() == nil {
					releasedAt = time.Now()
				}
				mu.Unlock()
				relCtx, relCancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
				err = rel(relCtx)
				relCancel()
				if err != nil {
					fail(fmt.Errorf("release: %w", err))
					continue
				}
				select {
				case <-next:
				case <-ctx.Done():
				}
			}
		}()
	}
	wg.Wait()
	res.Latency = stats.Summarize(res.Samples)
	return res
}

// WriteConfig bounds a write loop.
type WriteConfig struct {
	Clients  int
	Warmup   time.Duration
	Duration time.Duration
}

// WriteResult is what a write loop measured.
type WriteResult struct {
	Elapsed  time.Duration
	Writes   int64
	Errors   int64
	FirstErr error
	Latency  stats.Summary
}

// Throughput returns writes per second.
func (r *WriteResult) Throughput() float64 { return stats.Rate(int(r.Writes), r.Elapsed) }

// RunWrites runs cfg.Clients workers that each call w.Write with their own
// worker number until the time bound.
func RunWrites(ctx context.Context, wr Writer, cfg WriteConfig) WriteResult {
	start := time.Now()
	measureFrom := start.Add(cfg.Warmup)
	end := measureFrom.Add(cfg.Duration)
	ctx, cancel := context.WithDeadline(ctx, end.Add(30*time.Second))
	defer cancel()
	var (
		mu  sync.Mutex
		res WriteResult
		all []time.Duration
		wg  sync.WaitGroup
	)
	for w := 0; w < cfg.Clients; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var lat []time.Duration
			var errs int64
			var firstErr error
			for ctx.Err() == nil {
				t0 := time.Now()
				if !t0.Before(end) {
					break
				}
				err := wr.Write(ctx, w)
				t1 := time.Now()
				if err != nil {
					errs++
					if firstErr == nil {
						firstErr = err
					}
					time.Sleep(10 * time.Millisecond)
					continue
				}
				if !t0.Before(measureFrom) && !t1.After(end) {
					lat = append(lat, t1.Sub(t0))
				}
			}
			mu.Lock()
			defer mu.Unlock()
			all = append(all, lat...)
			res.Errors += errs
			if res.FirstErr == nil {
				res.FirstErr = firstErr
			}
		}()
	}
	wg.Wait()
	res.Elapsed = end.Sub(measureFrom)
	res.Writes = int64(len(all))
	res.Latency = stats.Summarize(all)
	return res
}
