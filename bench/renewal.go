package main

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence"
	"github.com/pgfence/pgfence/bench/internal/report"
	"github.com/pgfence/pgfence/leasetable"
)

// renewalResult is what scenario 6 measured.
type renewalResult struct {
	Leases        int
	TTL           time.Duration
	Interval      time.Duration
	AcquireTime   time.Duration // time to acquire all leases
	Held          time.Duration // measured holding window
	Statements    int64         // statements the Locker's pool ran in the window
	StmtTotalTime time.Duration // their summed client-side latency
	StmtMax       time.Duration
	PgssCalls     int64 // calls of the renewal statement in pg_stat_statements (-1: unavailable)
	PgssRows      int64 // rows those calls returned: one per lease renewed, or found locked by another transaction
	LiveAtEnd     int64 // leases still held in the table at the end of the window
	LostAtEnd     int   // leases the Locker reported lost
}

// Intervals is the number of renewal intervals in the window.
func (r *renewalResult) Intervals() float64 { return float64(r.Held) / float64(r.Interval) }

// PerThousandPerInterval is statements per 1,000 leases per interval.
func (r *renewalResult) PerThousandPerInterval() float64 {
	if r.Leases == 0 || r.Interval == 0 || r.Held == 0 {
		return 0
	}
	return float64(r.Statements) / r.Intervals() / (float64(r.Leases) / 1000)
}

// countingTracer counts the queries run through the connections it is
// installed on, with their client-side latency.
type countingTracer struct {
	n     atomic.Int64
	total atomic.Int64 // nanoseconds
	max   atomic.Int64
}

type traceStart struct{}

func (t *countingTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	return context.WithValue(ctx, traceStart{}, time.Now())
}

func (t *countingTracer) TraceQueryEnd(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryEndData) {
	t.n.Add(1)
	if t0, ok := ctx.Value(traceStart{}).(time.Time); ok {
		d := int64(time.Since(t0))
		t.total.Add(d)
		for {
			m := t.max.Load()
			if d <= m || t.max.CompareAndSwap(m, d) {
				break
			}
		}
	}
}

func (t *countingTracer) reset() { t.n.Store(0); t.total.Store(0); t.max.Store(0) }

// Statements of the renewal scenario's cross-check in pg_stat_statements.
const (
	pgssReset = `SELECT pg_stat_statements_reset()`
	// pgssRenew sums the calls and rows of leasetable's renewal statement
	// (SELECT fence, renewed FROM pgfence_renew(names, tokens, secrets, TTLs)).
	pgssRenew = `SELECT coalesce(sum(calls), 0)::bigint, coalesce(sum(rows), 0)::bigint FROM pg_stat_statements
WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
  AND query LIKE '%.pgfence_renew(%'`
	// liveNames counts the scenario's leases still held.
	liveNames = `SELECT pg_catalog.count(*) FROM pgfence.pgfence_leases WHERE name LIKE 's6-%' AND expires_at > pg_catalog.now()`
)

// renewal is scenario 6: one leasetable.Locker holds many leases for a few
// renewal intervals; count the statements its pool runs meanwhile.
func (r *runner) renewal(ctx context.Context) error {
	cfg := r.cfg
	ttl := cfg.RenewalTTL
	interval := ttl / 3 // leasetable's default RenewInterval
	fmt.Printf("scenario 6: renewal cost, %d leases in one Locker, TTL %v (renewed every %v), held %d intervals\n",
		cfg.RenewalLeases, ttl, interval, cfg.RenewalIntervals)
	tracer := &countingTracer{}
	pcfg, err := pgxpool.ParseConfig(r.env.AppURL())
	if err != nil {
		return err
	}
	pcfg.MaxConns, pcfg.MinConns = 8, 8
	pcfg.ConnConfig.Tracer = tracer
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return err
	}
	defer pool.Close()
	if err := withConn(ctx, r.env.DatabaseURL, func(c *pgx.Conn) error {
		_, err := c.Exec(ctx, `TRUNCATE pgfence.pgfence_leases`)
		return err
	}); err != nil {
		return err
	}
	k, err := leasetable.New(ctx, pool, &leasetable.Config{TTL: ttl})
	if err != nil {
		return err
	}
	defer k.Close()

	res := renewalResult{Leases: cfg.RenewalLeases, TTL: ttl, Interval: interval, PgssCalls: -1}
	leases := make([]pgfence.Lease, cfg.RenewalLeases)
	t0 := time.Now()
	var wg sync.WaitGroup
	var firstErr error
	var mu sync.Mutex
	const acquirers = 8
	for g := 0; g < acquirers; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := g; i < len(leases); i += acquirers {
				l, err := k.TryAcquire(ctx, "s6-"+strconv.Itoa(i), nil)
				if err != nil {
					mu.Lock()
					if firstErr == nil {
						firstErr = err
					}
					mu.Unlock()
					return
				}
				leases[i] = l
			}
		}()
	}
	wg.Wait()
	if firstErr != nil {
		return fmt.Errorf("acquire leases: %w", firstErr)
	}
	res.AcquireTime = time.Since(t0)

	// Start the window on a renewal boundary's far side: skip one interval so
	// the renewals of the acquisition phase are not counted.
	select {
	case <-time.After(interval):
	case <-ctx.Done():
		return ctx.Err()
	}
	pgss := r.setPgssTracking(ctx, true) && withConn(ctx, r.env.DatabaseURL, func(c *pgx.Conn) error {
		_, err := c.Exec(ctx, pgssReset)
		return err
	}) == nil
	defer r.setPgssTracking(ctx, false)
	tracer.reset()
	start := time.Now()
	select {
	case <-time.After(time.Duration(cfg.RenewalIntervals) * interval):
	case <-ctx.Done():
		return ctx.Err()
	}
	res.Statements = tracer.n.Load()
	res.Held = time.Since(start)
	res.StmtTotalTime = time.Duration(tracer.total.Load())
	res.StmtMax = time.Duration(tracer.max.Load())
	err = withConn(ctx, r.env.DatabaseURL, func(c *pgx.Conn) error {
		if pgss {
			if err := c.QueryRow(ctx, pgssRenew).Scan(&res.PgssCalls, &res.PgssRows); err != nil {
				return err
			}
		}
		return c.QueryRow(ctx, liveNames).Scan(&res.LiveAtEnd)
	})
	if err != nil {
		return err
	}
	for _, l := range leases {
		if l.Err() != nil {
			res.LostAtEnd++
		}
	}
	fmt.Printf("  [6] %d leases acquired in %v; %d statements in %v (%.1f intervals): %.3f per 1,000 leases per interval; pg_stat_statements renewals %d (%d rows); live %d, lost %d\n",
		res.Leases, res.AcquireTime.Round(time.Millisecond), res.Statements, res.Held.Round(time.Millisecond), res.Intervals(),
		res.PerThousandPerInterval(), res.PgssCalls, res.PgssRows, res.LiveAtEnd, res.LostAtEnd)
	r.res.Renewal = &res
	if !pgss {
		r.note("6: pg_stat_statements is not available on this server; statements were counted with a pgx tracer only")
	}
	return nil
}

// renderRenewal writes scenario 6.
func renderRenewal(p func(string, ...any), res *results) {
	if rn := res.Renewal; rn != nil {
		p("## 6. Renewal cost\n\n")
		p("One leasetable.Locker acquires %s leases (8 goroutines, TTL %v, renewed every %v), then holds them; after one more interval, every statement the Locker's pool runs is counted (a pgx tracer on the pool) for %.1f intervals. pg_stat_statements counts the renewal statement on the server side as a cross-check.\n\n",
			report.Thousands(int64(rn.Leases)), rn.TTL, rn.Interval, rn.Intervals())
		t := &report.Table{Header: []string{"figure", "value"}, TextColumns: 1}
		pgss := "n/a (pg_stat_statements unavailable)"
		if rn.PgssCalls >= 0 {
			pgss = fmt.Sprintf("%d calls, %s rows returned (leases renewed, or skipped as locked)", rn.PgssCalls, report.Thousands(rn.PgssRows))
		}
		mean := "n/a"
		if rn.Statements > 0 {
			mean = report.Duration(rn.StmtTotalTime / time.Duration(rn.Statements))
		}
		t.Rows = append(t.Rows,
			[]string{"leases held", report.Thousands(int64(rn.Leases))},
			[]string{"time to acquire them", report.Duration(rn.AcquireTime)},
			[]string{"window", fmt.Sprintf("%v (%.1f intervals)", rn.Held.Round(time.Millisecond), rn.Intervals())},
			[]string{"statements issued by the Locker", report.Thousands(rn.Statements)},
			[]string{"statements per second", fmt.Sprintf("%.2f", float64(rn.Statements)/rn.Held.Seconds())},
			[]string{"statements per 1,000 leases per interval", fmt.Sprintf("%.3f", rn.PerThousandPerInterval())},
			[]string{"renewal statement latency (mean, max)", mean + ", " + report.Duration(rn.StmtMax)},
			[]string{"pg_stat_statements, renewal statement", pgss},
			[]string{"leases still held at the end (table)", report.Thousands(rn.LiveAtEnd)},
			[]string{"leases the Locker reported lost", strconv.Itoa(rn.LostAtEnd)},
		)
		p("%s\n", t.Markdown())
	}
}
