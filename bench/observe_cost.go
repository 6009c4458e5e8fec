package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/pgfence/pgfence"
	"github.com/pgfence/pgfence/advisory"
	"github.com/pgfence/pgfence/bench/internal/harness"
	"github.com/pgfence/pgfence/bench/internal/report"
	"github.com/pgfence/pgfence/leasetable"
	"github.com/pgfence/pgfence/otelpgfence"
)

// The observer arms of scenario 9, each on Lockers of its own.
const (
	armNone  = "no observer"
	armNoop  = "no-op Observer"
	armOtel  = "otelpgfence"             // metrics; spans made, none sampled
	armSpans = "otelpgfence, every span" // metrics and every span sampled
)

var observeArms = []string{armNone, armNoop, armOtel, armSpans}

// observeCost is what scenario 9 measured for one strategy: the throughput
// of each batch, per arm, the arms alternating batch by batch.
type observeCost struct {
	Strategy string
	Clients  int
	Batch    time.Duration
	TP       map[string][]float64 // arm -> cycles/s of each batch
}

// pairedRatio is the median over batches of arm's throughput over that of
// the observer-less arm in the same batch.
func (c *observeCost) pairedRatio(arm string) float64 {
	base, tp := c.TP[armNone], c.TP[arm]
	rs := make([]float64, 0, len(base))
	for i := range min(len(base), len(tp)) {
		if base[i] > 0 {
			rs = append(rs, tp[i]/base[i])
		}
	}
	return medianFloat(rs)
}

func medianFloat(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	switch {
	case len(s) == 0:
		return 0
	case len(s)%2 == 1:
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// discardMetrics is a metric exporter that drops what it is given: the SDK
// aggregates and collects as it would for a real one.
type discardMetrics struct{}

func (discardMetrics) Temporality(k sdkmetric.InstrumentKind) metricdata.Temporality {
	return sdkmetric.DefaultTemporalitySelector(k)
}

func (discardMetrics) Aggregation(k sdkmetric.InstrumentKind) sdkmetric.Aggregation {
	return sdkmetric.DefaultAggregationSelector(k)
}
func (discardMetrics) Export(context.Context, *metricdata.ResourceMetrics) error { return nil }
func (discardMetrics) ForceFlush(context.Context) error                          { return nil }
func (discardMetrics) Shutdown(context.Context) error                            { return nil }

// discardSpans is a span exporter that drops what it is given.
type discardSpans struct{}

func (discardSpans) ExportSpans(context.Context, []sdktrace.ReadOnlySpan) error { return nil }
func (discardSpans) Shutdown(context.Context) error                             { return nil }

// observedSystem is a Locker of one arm as a harness.System.
type observedSystem struct {
	k     pgfence.Locker
	close func()
}

func (s *observedSystem) TryAcquire(ctx context.Context, name string) (harness.Release, error) {
	l, err := s.k.TryAcquire(ctx, name, nil)
	if errors.Is(err, pgfence.ErrNotAcquired) {
		return nil, harness.ErrBusy
	}
	if err != nil {
		return nil, err
	}
	return l.Release, nil
}

func (s *observedSystem) Close() error { s.close(); return nil }

// openObserved opens a Locker of strategy for arm, on a pool of its own
// with one connection per client. The otelpgfence arms get the SDK's
// MeterProvider (collected every second into a discarding exporter) and
// TracerProvider (spans batched into a discarding exporter), which samples
// no span (as for requests a ratio sampler leaves out) or every one.
func (r *runner) openObserved(ctx context.Context, strategy, arm string, clients int) (*observedSystem, error) {
	cfg, err := pgxpool.ParseConfig(r.env.AppURL())
	if err != nil {
		return nil, err
	}
	cfg.MaxConns, cfg.MinConns = int32(clients+1), int32(clients)
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, err
	}
	var obs pgfence.Observer
	shutdown := func() {}
	switch arm {
	case armNoop:
		obs = pgfence.ObserverFunc(func(context.Context, pgfence.Event) {})
	case armOtel, armSpans:
		sampler := sdktrace.NeverSample()
		if arm == armSpans {
			sampler = sdktrace.AlwaysSample()
		}
		mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewPeriodicReader(discardMetrics{}, sdkmetric.WithInterval(time.Second))))
		tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(discardSpans{}), sdktrace.WithSampler(sampler))
		o, err := otelpgfence.New(&otelpgfence.Config{MeterProvider: mp, TracerProvider: tp})
		if err != nil {
			pool.Close()
			return nil, err
		}
		obs = o
		shutdown = func() {
			_ = o.Close()
			_ = mp.Shutdown(context.Background())
			_ = tp.Shutdown(context.Background())
		}
	}
	var k pgfence.Locker
	var untrack func()
	switch strategy {
	case pgfence.StrategyLeaseTable:
		lk, err := leasetable.New(ctx, pool, &leasetable.Config{Observer: obs})
		if err != nil {
			pool.Close()
			shutdown()
			return nil, err
		}
		k = lk
		if o, ok := obs.(*otelpgfence.Observer); ok {
			untrack = o.Track(strategy, lk)
		}
	default:
		ak, err := advisory.New(ctx, pool, &advisory.Config{Observer: obs, MaxSessions: clients})
		if err != nil {
			pool.Close()
			shutdown()
			return nil, err
		}
		k = ak
		if o, ok := obs.(*otelpgfence.Observer); ok {
			untrack = o.Track(strategy, ak)
		}
	}
	return &observedSystem{k: k, close: func() {
		if untrack != nil {
			untrack()
		}
		k.Close()
		pool.Close()
		shutdown()
	}}, nil
}

// observeCost is scenario 9: the cost of observing. For each strategy,
// uncontended TryAcquire+Release cycles (every client on its own name) on
// Lockers that differ only in their Observer: none, one that does nothing
// (the cost of building and sending the events), and otelpgfence on the
// SDK with discarding exporters, its spans unsampled or all sampled. The
// arms run at the same time, each on names of its own, so that what the
// machine and the database do to one they do to all (run one after the
// other, batches of a few seconds differed by ±20% here, with other work
// on the machine); the figure is the median over batches of each arm's
// throughput over the observer-less arm's in the same batch.
func (r *runner) observeCost(ctx context.Context) error {
	b, c, d := r.cfg.ObserveBatches, r.cfg.ObserveClients, r.cfg.Duration
	fmt.Printf("scenario 9: observer cost, %d batches of %v, the %d arms at once, %d clients each, uncontended\n", b, d, len(observeArms), c)
	armNames := map[string][]string{}
	for i, arm := range observeArms {
		armNames[arm] = names(fmt.Sprintf("s9-%d-", i), c)
	}
	var out []observeCost
	for _, strategy := range []string{pgfence.StrategyLeaseTable, pgfence.StrategyAdvisory} {
		res := observeCost{Strategy: strategy, Clients: c, Batch: d, TP: map[string][]float64{}}
		systems := map[string]*observedSystem{}
		err := func() error {
			for _, arm := range observeArms {
				s, err := r.openObserved(ctx, strategy, arm, c)
				if err != nil {
					return fmt.Errorf("%s, %s: %w", strategy, arm, err)
				}
				systems[arm] = s
				// One unrecorded batch: connections and plans warm.
				harness.RunCycles(ctx, s, harness.CycleConfig{Clients: c, Duration: d / 4, Name: func(w, _ int) string { return armNames[arm][w] }})
			}
			for range b {
				results := make([]harness.CycleResult, len(observeArms))
				var wg sync.WaitGroup
				for j, arm := range observeArms {
					wg.Go(func() {
						results[j] = harness.RunCycles(ctx, systems[arm], harness.CycleConfig{Clients: c, Duration: d, Name: func(w, _ int) string { return armNames[arm][w] }})
					})
				}
				wg.Wait()
				for j, arm := range observeArms {
					if cr := results[j]; cr.Errors > 0 {
						return fmt.Errorf("%s, %s: %d errors, first: %w", strategy, arm, cr.Errors, cr.FirstErr)
					}
					res.TP[arm] = append(res.TP[arm], results[j].Throughput())
				}
			}
			return nil
		}()
		for _, s := range systems {
			_ = s.Close()
		}
		if err != nil {
			return err
		}
		fmt.Printf("  [9] %-10s none %.0f cycles/s; no-op Observer %.0f (paired %.3f); otelpgfence %.0f (paired %.3f); with every span %.0f (paired %.3f)\n", strategy,
			medianFloat(res.TP[armNone]), medianFloat(res.TP[armNoop]), res.pairedRatio(armNoop),
			medianFloat(res.TP[armOtel]), res.pairedRatio(armOtel), medianFloat(res.TP[armSpans]), res.pairedRatio(armSpans))
		out = append(out, res)
	}
	return writeObserveCost(r.cfg, r.res.Machine, out)
}

// writeObserveCost writes results/observe-cost.md.
func writeObserveCost(cfg *config, m machineInfo, costs []observeCost) error {
	var b strings.Builder
	p := func(format string, args ...any) { fmt.Fprintf(&b, format, args...) }
	p("# Observer cost (scenario 9)\n\n")
	p("Generated by `cd bench && go run . %s`, %s.\n\n", strings.Join(os.Args[1:], " "), time.Now().UTC().Format("2006-01-02 15:04 MST"))
	p("Uncontended TryAcquire + Release cycles, every client on its own name, on Lockers of the same strategy that differ only in their Observer: none; a no-op `pgfence.ObserverFunc` (what building and sending the events costs); and `otelpgfence` on OpenTelemetry's SDK, its metrics collected every second into an exporter that discards them, its spans made but not sampled (as for the requests a ratio sampler leaves out) or, in the last arm, every span sampled and batched into an exporter that discards them. Each Locker has a pool of its own and its clients their own names. In each batch the arms run at the same time, so that the load of the machine and of the database (the disk, for the lease table's commits) is common to all; a ratio is the median over batches of an arm's throughput over the observer-less arm's in the same batch. The throughputs are those of one arm while the others run, so each is about a quarter of what the strategy does alone; what they measure is what observing adds to a cycle, the client's CPU included.\n\n")
	p("Machine: %s, %d cores; load average %s at the start of the run, %s at the end of this scenario; %s %s; PostgreSQL %s, fsync=%s, synchronous_commit=%s. The benchmark, its clients and PostgreSQL share these cores.\n\n",
		m.CPU, m.Cores, m.LoadAvg, loadAvg(), m.GoVersion, m.OS, m.Postgres["server_version"], m.Postgres["fsync"], m.Postgres["synchronous_commit"])
	t := &report.Table{Header: []string{"strategy", "clients", "batches × time", "no observer (cycles/s)", "no-op Observer (cycles/s)", "no-op / none",
		"otelpgfence (cycles/s)", "otelpgfence / none", "otelpgfence, every span (cycles/s)", "every span / none"}, TextColumns: 1}
	for _, c := range costs {
		t.Rows = append(t.Rows, []string{c.Strategy, fmt.Sprint(c.Clients), fmt.Sprintf("%d × %v", len(c.TP[armNone]), c.Batch),
			report.Rate(medianFloat(c.TP[armNone])), report.Rate(medianFloat(c.TP[armNoop])), fmt.Sprintf("%.3f", c.pairedRatio(armNoop)),
			report.Rate(medianFloat(c.TP[armOtel])), fmt.Sprintf("%.3f", c.pairedRatio(armOtel)),
			report.Rate(medianFloat(c.TP[armSpans])), fmt.Sprintf("%.3f", c.pairedRatio(armSpans))})
	}
	p("%s\n", t.Markdown())
	p("Throughput of each batch (cycles/s):\n\n")
	for _, c := range costs {
		for _, arm := range observeArms {
			xs := make([]string, len(c.TP[arm]))
			for i, x := range c.TP[arm] {
				xs[i] = fmt.Sprintf("%.0f", x)
			}
			p("- %s, %s: %s\n", c.Strategy, arm, strings.Join(xs, ", "))
		}
	}
	if err := os.MkdirAll(cfg.Out, 0o755); err != nil {
		return err
	}
	path := filepath.Join(cfg.Out, "observe-cost.md")
	fmt.Println("wrote", path)
	return os.WriteFile(path, []byte(b.String()), 0o644)
}
