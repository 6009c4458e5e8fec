package main

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence"
	"github.com/pgfence/pgfence/advisory"
	"github.com/pgfence/pgfence/bench/internal/report"
)

// advisoryConns is one measurement of scenario 7's connection count.
type advisoryConns struct {
	Config      string // which advisory.Config
	Locks       int
	Goroutines  int
	LockTime    time.Duration
	Sessions    int64 // client backends with the lock sessions' application_name
	PoolConns   int64 // the pool's own backends (used only by New's install check)
	PgLocks     int64 // advisory locks granted in pg_locks
	MaxSessions int
}

// Statements of scenario 7.
const (
	// backendsByApp counts this database's client backends with the lock
	// sessions' application_name, and the others, except the counting one.
	backendsByApp = `SELECT count(*) FILTER (WHERE application_name = $1),
       count(*) FILTER (WHERE application_name <> $1)
FROM pg_stat_activity
WHERE datname = current_database() AND backend_type = 'client backend' AND pid <> pg_backend_pid()`
	// grantedAdvisory counts the advisory locks granted in this database.
	grantedAdvisory = `SELECT count(*) FROM pg_locks
WHERE locktype = 'advisory' AND granted AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`
)

// advisoryScale is scenario 7: hold many session advisory locks in one
// Locker and count the server connections used.
func (r *runner) advisoryScale(ctx context.Context) error {
	n, g := r.cfg.AdvisoryLocks, 16
	fmt.Printf("scenario 7: advisory, %d session locks held in one Locker by %d goroutines\n", n, g)
	for _, c := range []struct {
		name string
		cfg  *advisory.Config
	}{
		{"defaults (MaxSessions 4)", nil},
		{"MaxSessions 1", &advisory.Config{MaxSessions: 1}},
	} {
		res, err := r.holdAdvisory(ctx, n, g, c.cfg)
		if err != nil {
			return fmt.Errorf("%s: %w", c.name, err)
		}
		res.Config = c.name
		fmt.Printf("  [7] %-26s %d locks in %v: lock sessions %d, pool connections %d, pg_locks advisory %d\n",
			c.name, n, res.LockTime.Round(time.Millisecond), res.Sessions, res.PoolConns, res.PgLocks)
		r.res.AdvisoryConns = append(r.res.AdvisoryConns, res)
	}
	return nil
}

func (r *runner) holdAdvisory(ctx context.Context, n, goroutines int, cfg *advisory.Config) (advisoryConns, error) {
	res := advisoryConns{Locks: n, Goroutines: goroutines, MaxSessions: advisory.DefaultMaxSessions}
	if cfg != nil && cfg.MaxSessions > 0 {
		res.MaxSessions = cfg.MaxSessions
	}
	pcfg, err := pgxpool.ParseConfig(r.env.AppURL())
	if err != nil {
		return res, err
	}
	pcfg.MaxConns, pcfg.MinConns = 1, 1
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return res, err
	}
	defer pool.Close()
	if err := pool.Ping(ctx); err != nil {
		return res, err
	}
	l, err := advisory.New(ctx, pool, cfg)
	if err != nil {
		return res, err
	}
	defer l.Close()
	locks := make([]pgfence.Lease, n)
	var wg sync.WaitGroup
	errs := make(chan error, goroutines)
	t0 := time.Now()
	for w := 0; w < goroutines; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < n; i += goroutines {
				lk, err := l.TryAcquire(ctx, "s7-"+strconv.Itoa(i), nil)
				if err != nil {
					errs <- err
					return
				}
				locks[i] = lk
			}
		}()
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		return res, fmt.Errorf("lock: %w", err)
	}
	res.LockTime = time.Since(t0)
	err = withConn(ctx, r.env.DatabaseURL, func(c *pgx.Conn) error {
		if err := c.QueryRow(ctx, backendsByApp, advisory.DefaultApplicationName).Scan(&res.Sessions, &res.PoolConns); err != nil {
			return err
		}
		return c.QueryRow(ctx, grantedAdvisory).Scan(&res.PgLocks)
	})
	if err != nil {
		return res, err
	}
	var unlockErr error
	for _, lk := range locks {
		if err := lk.Release(ctx); err != nil && unlockErr == nil {
			unlockErr = err
		}
	}
	if unlockErr != nil && !errors.Is(unlockErr, context.Canceled) {
		return res, fmt.Errorf("unlock: %w", unlockErr)
	}
	return res, nil
}

// renderAdvisory writes scenario 7, with the advisory throughput of
// scenario 1.
func renderAdvisory(p func(string, ...any), res *results) {
	if len(res.AdvisoryConns) > 0 || len(res.Uncontended) > 0 {
		p("## 7. Advisory: connections and throughput\n\n")
	}
	if len(res.AdvisoryConns) > 0 {
		a0 := res.AdvisoryConns[0]
		p("One advisory.Locker takes %s session locks (%d goroutines calling TryAcquire on distinct names) and holds them; then the client backends of the benchmark database are counted in pg_stat_activity (excluding the counting connection): the lock sessions by their application_name (`pgfence-advisory`), and the rest, which is the one connection of the pool handed to advisory.New (New checks the install through it once; the Locker dials its own sessions and never uses the pool's otherwise). pg_locks confirms the locks are granted.\n\n",
			report.Thousands(int64(a0.Locks)), a0.Goroutines)
		t := &report.Table{Header: []string{"Locker config", "locks", "time to lock all", "lock sessions", "other client backends", "advisory locks in pg_locks"}, TextColumns: 1}
		for _, a := range res.AdvisoryConns {
			t.Rows = append(t.Rows, []string{a.Config, report.Thousands(int64(a.Locks)), report.Duration(a.LockTime),
				strconv.FormatInt(a.Sessions, 10), strconv.FormatInt(a.PoolConns, 10), report.Thousands(a.PgLocks)})
		}
		p("%s\n", t.Markdown())
	}
	if len(res.Uncontended) > 0 {
		clients := uniqueClients(res.Uncontended)
		t := &report.Table{Header: []string{"clients", "raw-advisory", "raw-advisory-token", "pgfence-advisory", "× raw-advisory", "raw-advisory-xact", "pgfence-advisory-xact", "× raw-advisory-xact"}}
		any := false
		for _, c := range clients {
			ra, rt, pa := cycleTP(res.Uncontended, "raw-advisory", c), cycleTP(res.Uncontended, "raw-advisory-token", c), cycleTP(res.Uncontended, "pgfence-advisory", c)
			rx, px := cycleTP(res.Uncontended, "raw-advisory-xact", c), cycleTP(res.Uncontended, "pgfence-advisory-xact", c)
			if math.IsNaN(pa) && math.IsNaN(px) {
				continue
			}
			any = true
			t.Rows = append(t.Rows, []string{strconv.Itoa(c), report.Rate(ra), report.Rate(rt), report.Rate(pa), report.Ratio(pa, ra),
				report.Rate(rx), report.Rate(px), report.Ratio(px, rx)})
		}
		if any {
			p("Acquire+release throughput (cycles/s, from scenario 1): pgfence's advisory locks with their fencing token against raw lock/unlock, and against raw-advisory-token, the raw statements plus the same durable token draw.\n\n%s\n", t.Markdown())
		}
	}
}
