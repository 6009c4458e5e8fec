package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence"
	"github.com/pgfence/pgfence/leasetable"
)

// permits is scenario 15: semaphores and sets against plain leases, side by
// side in one run, arms interleaved round by round. It writes
// permits.md to the output directory.
//
//   - hand-over: W waiters (split over two Lockers) on one name, each
//     holding 1 ms; the time from a holder's Release call to the next
//     holder's grant; a plain lease against a semaphore of one permit.
//   - throughput: one client, acquire+release cycles on its own name; and 4
//     clients waiting on one name; plain lease against N = 1.
//   - sets: 10 names taken and released as one TryAcquireSet against 10
//     TryAcquire calls one after the other and 10 at once.
func (r *runner) permits(ctx context.Context) error {
	d := r.cfg.Duration
	fmt.Printf("scenario 15: permits and sets against plain leases, %v per point, %d rounds\n", d, r.cfg.Rounds)
	pools := make([]*pgxpool.Pool, 2)
	lockers := make([]*leasetable.Locker, 2)
	for i := range pools {
		cfg, err := pgxpool.ParseConfig(r.env.AppURL())
		if err != nil {
			return err
		}
		cfg.MaxConns = 24
		if pools[i], err = pgxpool.NewWithConfig(ctx, cfg); err != nil {
			return err
		}
		defer pools[i].Close()
		if lockers[i], err = leasetable.New(ctx, pools[i], nil); err != nil {
			return err
		}
		defer lockers[i].Close()
	}
	type arm struct {
		point, name string
		run         func(ctx context.Context, tag string) (string, []float64, error)
	}
	var arms []arm
	for _, w := range []int{1, 100} {
		for _, permit := range []bool{false, true} {
			kind := "lease"
			if permit {
				kind = "permit N=1"
			}
			arms = append(arms, arm{fmt.Sprintf("hand-over p50, %d waiters", w), kind, func(ctx context.Context, tag string) (string, []float64, error) {
				return permitHandover(ctx, lockers, tag, w, permit, d)
			}})
		}
	}
	for _, c := range []int{1, 4} {
		for _, permit := range []bool{false, true} {
			kind := "lease"
			if permit {
				kind = "permit N=1"
			}
			arms = append(arms, arm{fmt.Sprintf("cycles/s, %d client(s)", c), kind, func(ctx context.Context, tag string) (string, []float64, error) {
				return permitCycles(ctx, lockers[0], tag, c, permit, d)
			}})
		}
	}
	for _, how := range []string{"set of 10", "10 singles in turn", "10 singles at once"} {
		arms = append(arms, arm{"10 names: acquire+release cycles/s", how, func(ctx context.Context, tag string) (string, []float64, error) {
			return setCycles(ctx, lockers[0], tag, how, d)
		}})
	}
	got := map[int][]float64{}
	units := map[int]string{}
	for round := 1; round <= r.cfg.Rounds; round++ {
		for i, a := range arms {
			unit, vals, err := a.run(ctx, fmt.Sprintf("b15-%d-%d-", round, i))
			if err != nil {
				return fmt.Errorf("%s, %s: %w", a.point, a.name, err)
			}
			units[i] = unit
			got[i] = append(got[i], medianOf(vals))
			fmt.Printf("  [15] %-36s %-20s %s\n", a.point, a.name, formatValue(unit, medianOf(vals)))
		}
	}
	var b strings.Builder
	fmt.Fprintf(&b, "# Scenario 15: permits and sets\n\n`go run . %s`, %d round(s) of %v per point, arms interleaved; medians over rounds.\n",
		strings.Join(r.res.Args, " "), r.cfg.Rounds, d)
	fmt.Fprintf(&b, "Hand-over: waiters split over two Lockers (own pools), hold 1 ms, from a holder's Release call to the next grant.\n\n")
	fmt.Fprintf(&b, "| point | arm | median | rounds |\n|---|---|---|---|\n")
	for i, a := range arms {
		rounds := make([]string, len(got[i]))
		for j, v := range got[i] {
			rounds[j] = formatValue(units[i], v)
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %s |\n", a.point, a.name, formatValue(units[i], medianOf(got[i])), strings.Join(rounds, ", "))
	}
	if err := os.MkdirAll(r.cfg.Out, 0o755); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(r.cfg.Out, "permits.md"), []byte(b.String()), 0o644)
}

func formatValue(unit string, v float64) string {
	if unit == "ms" {
		return fmt.Sprintf("%.3f ms", v)
	}
	return fmt.Sprintf("%.0f %s", v, unit)
}

func medianOf(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	return s[len(s)/2]
}

// permitHandover measures hand-overs among w waiters (over the lockers) on
// one name for d, the first quarter unmeasured.
func permitHandover(ctx context.Context, lockers []*leasetable.Locker, tag string, w int, permit bool, d time.Duration) (string, []float64, error) {
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	name := tag + "h"
	// The first callers of a new semaphore record its count one at a time:
	// the first quarter is not measured.
	measureFrom := time.Now().Add(d / 4)
	var released atomic.Int64 // UnixNano of the last Release call, 0 before
	var mu sync.Mutex
	var lat []float64
	var firstErr error
	var wg sync.WaitGroup
	for i := range w + 1 {
		k := lockers[i%len(lockers)]
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				var l pgfence.Lease
				var err error
				if permit {
					l, err = k.AcquirePermit(ctx, name, 1, nil)
				} else {
					l, err = k.Acquire(ctx, name, nil)
				}
				if err != nil {
					if ctx.Err() == nil {
						mu.Lock()
						firstErr = cmpErr(firstErr, err)
						mu.Unlock()
					}
					return
				}
				if at := released.Swap(0); at != 0 && time.Now().After(measureFrom) {
					mu.Lock()
					lat = append(lat, float64(time.Now().UnixNano()-at)/1e6)
					mu.Unlock()
				}
				time.Sleep(time.Millisecond)
				released.Store(time.Now().UnixNano())
				_ = l.Release(context.WithoutCancel(ctx))
			}
		}()
	}
	wg.Wait()
	if len(lat) == 0 {
		return "ms", nil, fmt.Errorf("no hand-over (%v)", firstErr)
	}
	return "ms", lat, nil
}

func cmpErr(a, b error) error {
	if a != nil {
		return a
	}
	return b
}

// permitCycles counts acquire+release cycles of c clients for d: on its own
// name each with one client, else all waiting on one name.
func permitCycles(ctx context.Context, k *leasetable.Locker, tag string, c int, permit bool, d time.Duration) (string, []float64, error) {
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	var n atomic.Int64
	var firstErr atomic.Value
	var wg sync.WaitGroup
	start := time.Now()
	for range c {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				var l pgfence.Lease
				var err error
				switch {
				case permit && c == 1:
					l, err = k.TryAcquirePermit(ctx, tag+"c", 1, nil)
				case permit:
					l, err = k.AcquirePermit(ctx, tag+"c", 1, nil)
				case c == 1:
					l, err = k.TryAcquire(ctx, tag+"c", nil)
				default:
					l, err = k.Acquire(ctx, tag+"c", nil)
				}
				if err != nil {
					if ctx.Err() == nil {
						firstErr.CompareAndSwap(nil, err)
					}
					return
				}
				if err := l.Release(context.WithoutCancel(ctx)); err != nil {
					firstErr.CompareAndSwap(nil, err)
					return
				}
				n.Add(1)
			}
		}()
	}
	wg.Wait()
	if err, _ := firstErr.Load().(error); err != nil {
		return "", nil, err
	}
	return "cycles/s", []float64{float64(n.Load()) / time.Since(start).Seconds()}, nil
}

// setCycles counts cycles of taking and releasing 10 names for d.
func setCycles(ctx context.Context, k *leasetable.Locker, tag, how string, d time.Duration) (string, []float64, error) {
	names := make([]string, 10)
	for i := range names {
		names[i] = fmt.Sprintf("%ss%d", tag, i)
	}
	deadline := time.Now().Add(d)
	start := time.Now()
	n := 0
	for time.Now().Before(deadline) {
		var ls []pgfence.Lease
		var err error
		switch how {
		case "set of 10":
			ls, err = k.TryAcquireSet(ctx, names, nil)
		case "10 singles in turn":
			for _, name := range names {
				var l pgfence.Lease
				if l, err = k.TryAcquire(ctx, name, nil); err != nil {
					break
				}
				ls = append(ls, l)
			}
		default:
			ls = make([]pgfence.Lease, len(names))
			errs := make([]error, len(names))
			var wg sync.WaitGroup
			for i, name := range names {
				wg.Add(1)
				go func() {
					defer wg.Done()
					ls[i], errs[i] = k.TryAcquire(ctx, name, nil)
				}()
			}
			wg.Wait()
			for _, e := range errs {
				err = cmpErr(err, e)
			}
		}
		if err != nil {
			return "", nil, err
		}
		var wg sync.WaitGroup
		for _, l := range ls {
			wg.Add(1)
			go func() {
				defer wg.Done()
				_ = l.Release(ctx)
			}()
		}
		wg.Wait()
		n++
	}
	return "cycles/s", []float64{float64(n) / time.Since(start).Seconds()}, nil
}
