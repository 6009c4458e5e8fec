package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence"
	"github.com/pgfence/pgfence/advisory"
	"github.com/pgfence/pgfence/bench/internal/harness"
	"github.com/pgfence/pgfence/bench/internal/report"
)

// Scenario 11: many waiters on one name, spread over several Lockers of
// session advisory locks, with 1ms holds: the hand-over latency and the
// work per hand-over, so that a thundering herd shows as a slope.

// herdLockers is how many advisory.Lockers share the waiters.
const herdLockers = 10

// herdWaiters are scenario 11's waiter counts.
var herdWaiters = []int{1, 10, 100}

// herdPoint is one waiter count.
type herdPoint struct {
	Waiters    int
	Handovers  int
	P50, P99   time.Duration
	Errors     int64
	Notifies   int64 // notifications sent on advisory.NotifyChannel, counted by a listener of our own
	Listeners  int64 // the Lockers' LISTEN connections at the end of the point
	Statements int64 // transactions committed in the database over the point (one per lock statement)
	Load       string
}

// herdSystem spreads Acquire calls over several Lockers, round robin.
type herdSystem struct {
	pool    *pgxpool.Pool
	lockers []*advisory.Locker
	next    atomic.Uint64
}

func (h *herdSystem) pick() *advisory.Locker {
	return h.lockers[int(h.next.Add(1)%uint64(len(h.lockers)))]
}

func (h *herdSystem) TryAcquire(ctx context.Context, name string) (harness.Release, error) {
	l, err := h.pick().TryAcquire(ctx, name, nil)
	if errors.Is(err, pgfence.ErrNotAcquired) {
		return nil, harness.ErrBusy
	}
	if err != nil {
		return nil, err
	}
	return l.Release, nil
}

func (h *herdSystem) Acquire(ctx context.Context, name string) (harness.Release, error) {
	l, err := h.pick().Acquire(ctx, name, nil)
	if err != nil {
		return nil, err
	}
	return l.Release, nil
}

func (h *herdSystem) Close() error {
	for _, k := range h.lockers {
		k.Close()
	}
	h.pool.Close()
	return nil
}

func (r *runner) openHerd(ctx context.Context) (*herdSystem, error) {
	pcfg, err := pgxpool.ParseConfig(r.env.AppURL())
	if err != nil {
		return nil, err
	}
	pcfg.MaxConns = 1
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return nil, err
	}
	h := &herdSystem{pool: pool}
	for range herdLockers {
		k, err := advisory.New(ctx, pool, nil)
		if err != nil {
			_ = h.Close()
			return nil, err
		}
		h.lockers = append(h.lockers, k)
	}
	return h, nil
}

// committedXacts reads the database's committed transactions.
const committedXacts = `SELECT xact_commit FROM pg_catalog.pg_stat_database WHERE datname = pg_catalog.current_database()`

// listenConns counts the Lockers' LISTEN connections.
const listenConns = `SELECT pg_catalog.count(*) FROM pg_catalog.pg_stat_activity
WHERE datname = pg_catalog.current_database() AND application_name = $1`

// advisoryHerd is scenario 11.
func (r *runner) advisoryHerd(ctx context.Context) error {
	fmt.Printf("scenario 11: advisory hand-over with %v waiters on one name over %d Lockers, hold %v, %v per point\n",
		herdWaiters, herdLockers, r.cfg.HoldShort, r.cfg.Duration+r.cfg.Warmup)
	loadStart := loadAvg()
	var pts []herdPoint
	for _, w := range herdWaiters {
		p, err := r.herdPoint(ctx, w)
		if err != nil {
			return err
		}
		fmt.Printf("  [11] waiters=%-4d hand-overs=%-5d p50=%-10v p99=%-10v notifications/hand-over %.2f (x %d listeners), statements/hand-over %.1f, load %s\n",
			w, p.Handovers, p.P50.Round(time.Microsecond), p.P99.Round(time.Microsecond),
			float64(p.Notifies)/float64(max(p.Handovers, 1)), p.Listeners, float64(p.Statements)/float64(max(p.Handovers, 1)), p.Load)
		pts = append(pts, p)
	}
	return writeAdvisoryHerd(r.cfg, r.res.Machine, loadStart, loadAvg(), pts)
}

func (r *runner) herdPoint(ctx context.Context, waiters int) (herdPoint, error) {
	p := herdPoint{Waiters: waiters}
	h, err := r.openHerd(ctx)
	if err != nil {
		return p, err
	}
	// Our own listener counts what the releases send.
	lc, err := pgx.Connect(ctx, r.env.DatabaseURL)
	if err != nil {
		_ = h.Close()
		return p, err
	}
	defer lc.Close(context.WithoutCancel(ctx))
	if _, err := lc.Exec(ctx, "LISTEN "+pgx.Identifier{advisory.NotifyChannel}.Sanitize()); err != nil {
		_ = h.Close()
		return p, err
	}
	lctx, stopListen := context.WithCancel(ctx)
	var notifies atomic.Int64
	var lwg sync.WaitGroup
	lwg.Add(1)
	go func() {
		defer lwg.Done()
		for {
			if _, err := lc.WaitForNotification(lctx); err != nil {
				return
			}
			notifies.Add(1)
		}
	}()
	var x0, x1 int64
	if err := withConn(ctx, r.env.DatabaseURL, func(c *pgx.Conn) error { return c.QueryRow(ctx, committedXacts).Scan(&x0) }); err != nil {
		stopListen()
		lwg.Wait()
		_ = h.Close()
		return p, err
	}
	res := harness.RunHandover(ctx, h, harness.HandoverConfig{Waiters: waiters, Name: "s11", Hold: r.cfg.HoldShort,
		Duration: r.cfg.Duration + r.cfg.Warmup, MinHandovers: r.cfg.HandoversMin, Timeout: r.cfg.LongDuration})
	_ = withConn(ctx, r.env.DatabaseURL, func(c *pgx.Conn) error {
		return c.QueryRow(ctx, listenConns, advisory.DefaultApplicationName+"-listen").Scan(&p.Listeners)
	})
	_ = h.Close()
	stopListen()
	lwg.Wait()
	// Backends report their counters when they exit, and at most every
	// second while they run.
	time.Sleep(1500 * time.Millisecond)
	if err := withConn(ctx, r.env.DatabaseURL, func(c *pgx.Conn) error { return c.QueryRow(ctx, committedXacts).Scan(&x1) }); err != nil {
		return p, err
	}
	p.Handovers, p.P50, p.P99 = res.Latency.N, res.Latency.P50, res.Latency.P99
	p.Errors, p.Notifies, p.Statements, p.Load = res.Errors, notifies.Load(), x1-x0, loadAvg()
	if res.FirstErr != nil {
		r.note("11 waiters=%d: %d errors, first: %v", waiters, res.Errors, res.FirstErr)
	}
	return p, nil
}

// writeAdvisoryHerd writes results/advisory-herd.md.
func writeAdvisoryHerd(cfg *config, m machineInfo, loadStart, loadEnd string, pts []herdPoint) error {
	var b strings.Builder
	p := func(format string, args ...any) { fmt.Fprintf(&b, format, args...) }
	p("# Advisory session locks: many waiters on one name\n\n")
	p("N waiters (plus the holder) call `Acquire` on one name through %d `advisory.Lockers` in this process (default Config, calls spread round robin), each holding the lock for %v; a hand-over is the time from a holder's release to the next holder's acquire (the harness of scenario 2). Notifications are those sent on `%s` during the point, counted by a LISTEN connection of the benchmark's own; each is delivered to every Locker's LISTEN connection (the listeners column, counted at the end of the point), so deliveries are about notifications × listeners. Statements are the transactions the database committed over the point (`pg_stat_database.xact_commit`: one per lock, unlock or poll statement, plus a few of the benchmark's own), read 1.5s after the Lockers closed. With holds of 1ms, shorter than the 20ms after which a Release looks for waiters to notify (see Waiting in package advisory's documentation), no release notifies: waiters in the holder's Locker are woken in-process, the others find the lock by polling, and the statements column shows what the polls cost as waiters grow.\n\n",
		herdLockers, cfg.HoldShort, advisory.NotifyChannel)
	p("Machine: %s, %d cores; load average %s at the start of this scenario, %s at its end; PostgreSQL %s. The benchmark, its clients and PostgreSQL share these cores, and other work ran on the machine.\n\n",
		m.CPU, m.Cores, loadStart, loadEnd, m.Postgres["server_version"])
	t := &report.Table{Header: []string{"waiters", "hand-overs", "p50", "p99", "notifications / hand-over", "listeners", "statements / hand-over", "errors", "load after"}}
	for _, pt := range pts {
		n := float64(max(pt.Handovers, 1))
		t.Rows = append(t.Rows, []string{strconv.Itoa(pt.Waiters), strconv.Itoa(pt.Handovers), report.Duration(pt.P50), report.Duration(pt.P99),
			strconv.FormatFloat(float64(pt.Notifies)/n, 'f', 2, 64), strconv.FormatInt(pt.Listeners, 10),
			strconv.FormatFloat(float64(pt.Statements)/n, 'f', 1, 64), strconv.FormatInt(pt.Errors, 10), pt.Load})
	}
	p("%s\n", t.Markdown())
	if err := os.MkdirAll(cfg.Out, 0o755); err != nil {
		return err
	}
	path := filepath.Join(cfg.Out, "advisory-herd.md")
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		return err
	}
	fmt.Println("wrote", path)
	return nil
}
