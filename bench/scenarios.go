package main

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/pgfence/pgfence/bench/internal/harness"
	"github.com/pgfence/pgfence/bench/internal/systems"
)

// results is everything one run measured.
type results struct {
	Started time.Time
	Elapsed time.Duration
	Args    []string
	Machine machineInfo
	Systems []systemInfo
	Writers []systemInfo

	Uncontended   []cyclePoint
	Pgbench       []pgbenchPoint
	Handover      []handoverPoint
	Contended     []cyclePoint
	Writes        []writePoint
	ScaleLat      []scaleLatency
	ScaleStore    []scaleStorage
	Renewal       *renewalResult
	AdvisoryConns []advisoryConns
	CallCosts     []callCost
	ClientScale   *clientScaleResult  // scenario 12
	Combine       []combinePoint      // scenario 10
	Herd          []herdPoint         // scenario 11
	HerdRaw       *rawChainResult     // scenario 11's raw NOTIFY chain
	HerdNoFlush   *herdNoFlush        // scenario 11's one-waiter hand-over with fsync off
	Neighbour     []neighbourPoint    // scenario 16
	Ownership     *ownershipResult    // scenario 13
	Registry      *registryCostResult // scenario 14
	WaitEvents    []waitSample        // scenario 1 at profileClients, last round
	WriteWaits    []waitSample        // scenario 4, last round
	Notes         []string
}

type systemInfo struct{ Name, Kind, Note string }

type handoverPoint struct {
	System  string
	Hold    time.Duration
	Waiters int
	harness.HandoverResult
}

type scaleLatency struct {
	System  string
	Rows    int
	Fill    time.Duration // time to fill the table to Rows
	Clients int
	harness.CycleResult
}

type scaleStorage struct {
	System   string
	Cycles   int64
	Elapsed  time.Duration
	Names    int
	Clients  int
	Stat     tableStat
	Errors   int64
	FirstErr error
}

type runner struct {
	// ownCluster is set when the benchmark started the PostgreSQL server
	// itself, and so may change its settings (pg_stat_statements.track).
	ownCluster bool
	cfg        *config
	env        *harness.Env
	specs      []harness.Spec
	res        *results
}

func (r *runner) note(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	fmt.Println("note:", msg)
	r.res.Notes = append(r.res.Notes, msg)
}

// open opens a system and gives it a clean state with names prepared.
func (r *runner) open(ctx context.Context, s harness.Spec, clients int, names []string) (harness.System, error) {
	sys, err := s.Open(ctx, r.env, clients)
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", s.Name, err)
	}
	if rs, ok := sys.(harness.Resetter); ok {
		if err := rs.Reset(ctx); err != nil {
			_ = sys.Close()
			return nil, fmt.Errorf("reset %s: %w", s.Name, err)
		}
	}
	if p, ok := sys.(harness.Preparer); ok && len(names) > 0 {
		if err := p.Prepare(ctx, names); err != nil {
			_ = sys.Close()
			return nil, fmt.Errorf("prepare %s: %w", s.Name, err)
		}
	}
	return sys, nil
}

func names(prefix string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = prefix + strconv.Itoa(i)
	}
	return out
}

func (r *runner) logCycle(scenario, system string, clients int, res *harness.CycleResult) {
	fmt.Printf("  [%s] %-18s clients=%-3d %9.0f cycles/s  p50=%-10v p99=%-10v busy=%d errors=%d\n",
		scenario, system, clients, res.Throughput(), res.Cycle.P50.Round(time.Microsecond), res.Cycle.P99.Round(time.Microsecond), res.Busy, res.Errors)
	if res.FirstErr != nil {
		r.note("%s %s clients=%d: %d errors, first: %v", scenario, system, clients, res.Errors, res.FirstErr)
	}
}

// profileClients is the client count of scenario 1 whose points are
// profiled: 16 (the count the targets name) when measured, else the largest.
func (r *runner) profileClients() int {
	if slices.Contains(r.cfg.Clients, 16) {
		return 16
	}
	return slices.Max(r.cfg.Clients)
}

// uncontended is scenario 1: every client cycles on its own name.
func (r *runner) uncontended(ctx context.Context) error {
	fmt.Printf("scenario 1: uncontended acquire+release, clients %v, %v per point (+%v warm-up)\n", r.cfg.Clients, r.cfg.Duration, r.cfg.Warmup)
	for round := 1; round <= r.cfg.Rounds; round++ {
		for _, c := range r.cfg.Clients {
			ns := names("s1-", c)
			for _, s := range r.specs {
				sys, err := r.open(ctx, s, c, ns)
				if err != nil {
					return err
				}
				var prof *profiler
				if round == r.cfg.Rounds && c == r.profileClients() {
					prof = r.startProfiler(ctx, s.Name, c)
				}
				res := harness.RunCycles(ctx, sys, harness.CycleConfig{
					Clients: c, Warmup: r.cfg.Warmup, Duration: r.cfg.Duration,
					Name: func(w, _ int) string { return ns[w] },
				})
				if prof != nil {
					r.res.WaitEvents = append(r.res.WaitEvents, prof.stop(ctx))
				}
				_ = sys.Close()
				r.logCycle("1", s.Name, c, &res)
				addCycle(&r.res.Uncontended, s.Name, c, res)
			}
			if err := r.pgbench(ctx, c); err != nil {
				return err
			}
		}
	}
	return nil
}

// pgbench measures the ceilings once more from C, without Go in the path.
func (r *runner) pgbench(ctx context.Context, clients int) error {
	bin := pgbenchBin(r.cfg)
	if bin == "" {
		return nil
	}
	// The ceiling table and the pgbench clients' rows.
	sys, err := r.open(ctx, systems.UpdateCeiling, 1, systems.PgbenchNames(clients))
	if err != nil {
		return err
	}
	_ = sys.Close()
	for _, s := range systems.PgbenchScripts {
		res, err := systems.RunPgbench(ctx, bin, r.env.DatabaseURL, s, clients, r.cfg.Duration)
		if err != nil {
			r.note("%s clients=%d: %v", s.Name, clients, err)
			continue
		}
		fmt.Printf("  [1] %-18s clients=%-3d %9.0f cycles/s  avg=%v\n", s.Name, clients, res.TPS, res.LatencyAvg.Round(time.Microsecond))
		addPgbench(&r.res.Pgbench, s.Name, clients, res)
	}
	return nil
}

// handover is scenario 2: waiters on one name, short and long holds.
func (r *runner) handover(ctx context.Context) error {
	w := r.cfg.HandoverWaiters
	fmt.Printf("scenario 2: hand-over latency, %d waiters on one name; hold %v for %v, hold %v for %d hand-overs (at most %v)\n",
		w, r.cfg.HoldShort, r.cfg.Duration, r.cfg.HoldLong, r.cfg.HandoversLong, r.cfg.LongDuration)
	for _, hold := range []time.Duration{r.cfg.HoldShort, r.cfg.HoldLong} {
		for _, s := range r.specs {
			sys, err := r.open(ctx, s, w+2, []string{"s2"})
			if err != nil {
				return err
			}
			waiter, ok := sys.(harness.Waiter)
			if !ok {
				_ = sys.Close()
				continue
			}
			cfg := harness.HandoverConfig{Waiters: w, Name: "s2", Hold: hold, Duration: r.cfg.Duration + r.cfg.Warmup,
				MinHandovers: r.cfg.HandoversMin, Timeout: r.cfg.LongDuration}
			if hold == r.cfg.HoldLong {
				cfg.Duration, cfg.MaxHandovers = r.cfg.LongDuration, r.cfg.HandoversLong
			}
			res := harness.RunHandover(ctx, waiter, cfg)
			_ = sys.Close()
			fmt.Printf("  [2] %-18s hold=%-6v hand-overs=%-5d p50=%-10v p99=%-10v max=%v errors=%d\n", s.Name, hold,
				res.Latency.N, res.Latency.P50.Round(time.Microsecond), res.Latency.P99.Round(time.Microsecond), res.Latency.Max.Round(time.Microsecond), res.Errors)
			if res.FirstErr != nil {
				r.note("2 %s hold=%v: %d errors, first: %v", s.Name, hold, res.Errors, res.FirstErr)
			}
			r.res.Handover = append(r.res.Handover, handoverPoint{System: s.Name, Hold: hold, Waiters: w, HandoverResult: res})
		}
	}
	return nil
}

// contended is scenario 3: many clients TryAcquire a few shared names.
func (r *runner) contended(ctx context.Context) error {
	c, k := r.cfg.ContendedClients, r.cfg.ContendedNames
	fmt.Printf("scenario 3: contended, %d clients on %d names, %v per point\n", c, k, r.cfg.Duration)
	ns := names("s3-", k)
	for round := 1; round <= r.cfg.Rounds; round++ {
		for _, s := range r.specs {
			sys, err := r.open(ctx, s, c, ns)
			if err != nil {
				return err
			}
			res := harness.RunCycles(ctx, sys, harness.CycleConfig{
				Clients: c, Warmup: r.cfg.Warmup, Duration: r.cfg.Duration,
				// A fixed pseudo-random walk over the names, different per worker.
				Name: func(w, i int) string { return ns[int((uint64(w+1)*2654435761+uint64(i)*40503)>>7)%k] },
			})
			_ = sys.Close()
			r.logCycle("3", s.Name, c, &res)
			addCycle(&r.res.Contended, s.Name, c, res)
		}
	}
	return nil
}

// fencedWrites is scenario 4: plain vs guarded vs lease-checked UPDATEs.
func (r *runner) fencedWrites(ctx context.Context) error {
	c := r.cfg.WriteClients
	fmt.Printf("scenario 4: fenced-write overhead, %d clients each updating its own row, %v per point\n", c, r.cfg.Duration)
	for round := 1; round <= r.cfg.Rounds; round++ {
		for _, s := range writerSpecs() {
			wr, err := s.Open(ctx, r.env, c)
			if err != nil {
				return fmt.Errorf("open %s: %w", s.Name, err)
			}
			var prof *profiler
			if round == r.cfg.Rounds {
				prof = r.startProfiler(ctx, s.Name, c)
			}
			res := harness.RunWrites(ctx, wr, harness.WriteConfig{Clients: c, Warmup: r.cfg.Warmup, Duration: r.cfg.Duration})
			if prof != nil {
				ws := prof.stop(ctx)
				if ex, ok := wr.(harness.Explainer); ok {
					ws.Plan, ws.PlanErr = ex.Explain(ctx, 0)
				}
				r.res.WriteWaits = append(r.res.WriteWaits, ws)
			}
			_ = wr.Close()
			fmt.Printf("  [4] %-26s %9.0f writes/s  p50=%-10v p99=%-10v errors=%d\n", s.Name, res.Throughput(),
				res.Latency.P50.Round(time.Microsecond), res.Latency.P99.Round(time.Microsecond), res.Errors)
			if res.FirstErr != nil {
				r.note("4 %s: %d errors, first: %v", s.Name, res.Errors, res.FirstErr)
			}
			addWrite(&r.res.Writes, s.Name, c, res)
		}
	}
	return nil
}

// scale is scenario 5: acquire latency against the number of live rows,
// then table size and HOT ratio after many cycles on a few names.
func (r *runner) scale(ctx context.Context) error {
	cfg := r.cfg
	fmt.Printf("scenario 5: scale, latency with %v live rows (%d clients, %v per point); size after %d cycles on %d names\n",
		cfg.ScaleRows, cfg.ScaleClients, cfg.Duration, cfg.ScaleCycles, cfg.ScaleNames)
	for _, s := range r.specs {
		ns := names("s5-", cfg.ScaleClients)
		sys, err := r.open(ctx, s, cfg.ScaleClients, ns)
		if err != nil {
			return err
		}
		st, ok := sys.(harness.Storage)
		if !ok {
			_ = sys.Close()
			continue
		}
		table := st.Tables()[0]
		for _, rows := range cfg.ScaleRows {
			t0 := time.Now()
			if err := st.FillLive(ctx, rows); err != nil {
				_ = sys.Close()
				return fmt.Errorf("%s: fill %d rows: %w", s.Name, rows, err)
			}
			if err := analyze(ctx, r.env.DatabaseURL, table); err != nil {
				_ = sys.Close()
				return err
			}
			fill := time.Since(t0)
			res := harness.RunCycles(ctx, sys, harness.CycleConfig{
				Clients: cfg.ScaleClients, Warmup: cfg.Warmup, Duration: cfg.Duration,
				Name: func(w, _ int) string { return ns[w] },
			})
			fmt.Printf("  [5] %-18s rows=%-8d acquire p50=%-10v p99=%-10v %7.0f cycles/s (fill %v)\n", s.Name, rows,
				res.Acquire.P50.Round(time.Microsecond), res.Acquire.P99.Round(time.Microsecond), res.Throughput(), fill.Round(time.Millisecond))
			if res.FirstErr != nil {
				r.note("5 %s rows=%d: %d errors, first: %v", s.Name, rows, res.Errors, res.FirstErr)
			}
			r.res.ScaleLat = append(r.res.ScaleLat, scaleLatency{System: s.Name, Rows: rows, Fill: fill, Clients: cfg.ScaleClients, CycleResult: res})
		}
		_ = sys.Close()

		// Storage: start from an empty table with the cycled names only.
		cn := names("s5-cycle-", cfg.ScaleNames)
		sys, err = r.open(ctx, s, cfg.ScaleClients, cn)
		if err != nil {
			return err
		}
		if err := resetStats(ctx, r.env.DatabaseURL, table); err != nil {
			_ = sys.Close()
			return err
		}
		c := cfg.ScaleClients
		per := cfg.ScaleNames / c // worker w cycles on names w, w+c, w+2c, ...: no contention
		res := harness.RunCycles(ctx, sys, harness.CycleConfig{
			Clients: c, Duration: cfg.ScaleTimeout, MaxCycles: cfg.ScaleCycles,
			Name: func(w, i int) string { return cn[w+c*(i%per)] },
		})
		_ = sys.Close()
		stat, err := statsAfterClose(ctx, r.env.DatabaseURL, table)
		if err != nil {
			return err
		}
		if res.Total < cfg.ScaleCycles {
			r.note("5 %s: only %d of %d cycles within %v", s.Name, res.Total, cfg.ScaleCycles, cfg.ScaleTimeout)
		}
		if res.FirstErr != nil {
			r.note("5 %s cycles: %d errors, first: %v", s.Name, res.Errors, res.FirstErr)
		}
		fmt.Printf("  [5] %-18s %d cycles in %v: heap %d B, indexes %d B, upd %d (HOT %d), ins %d, del %d, dead %d, vacuums %d\n",
			s.Name, res.Total, res.Elapsed.Round(time.Millisecond), stat.HeapBytes, stat.IndexBytes, stat.Updates, stat.HotUpdates,
			stat.Inserts, stat.Deletes, stat.DeadTuples, stat.Vacuums)
		r.res.ScaleStore = append(r.res.ScaleStore, scaleStorage{System: s.Name, Cycles: res.Total, Elapsed: res.Elapsed,
			Names: cfg.ScaleNames, Clients: c, Stat: stat, Errors: res.Errors, FirstErr: res.FirstErr})
	}
	return nil
}
