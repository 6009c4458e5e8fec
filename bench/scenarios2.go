package main

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence/advisory"
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
	PgssRows      int64 // rows those calls updated
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
	// pgssRenew sums the calls and rows of leasetable's renewal statement.
	pgssRenew = `SELECT coalesce(sum(calls), 0)::bigint, coalesce(sum(rows), 0)::bigint FROM pg_stat_statements
WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
  AND query LIKE '%UPDATE pgfence_leases AS l%SET expires_at = greatest%'`
	// liveNames counts the scenario's leases still held.
	liveNames = `SELECT count(*) FROM pgfence_leases WHERE name LIKE 's6-%' AND expires_at > now()`
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
	pcfg, err := pgxpool.ParseConfig(r.env.DatabaseURL)
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
	if _, err := pool.Exec(ctx, `TRUNCATE pgfence_leases`); err != nil {
		return err
	}
	k, err := leasetable.New(pool, &leasetable.Config{TTL: ttl})
	if err != nil {
		return err
	}
	defer k.Close()

	res := renewalResult{Leases: cfg.RenewalLeases, TTL: ttl, Interval: interval, PgssCalls: -1}
	leases := make([]*leasetable.Lease, cfg.RenewalLeases)
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

// advisoryConns is one measurement of scenario 7's connection count.
type advisoryConns struct {
	Config      string // which advisory.Config
	Locks       int
	Goroutines  int
	LockTime    time.Duration
	Sessions    int64 // client backends with the lock sessions' application_name
	PoolConns   int64 // the pool's own backends (the Locker does not use them)
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
	pcfg, err := pgxpool.ParseConfig(r.env.DatabaseURL)
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
	l, err := advisory.New(pool, cfg)
	if err != nil {
		return res, err
	}
	defer l.Close()
	locks := make([]*advisory.Lock, n)
	var wg sync.WaitGroup
	errs := make(chan error, goroutines)
	t0 := time.Now()
	for w := 0; w < goroutines; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < n; i += goroutines {
				lk, err := l.TryLock(ctx, advisory.Name("s7-"+strconv.Itoa(i)), nil)
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
		if err := lk.Unlock(ctx); err != nil && unlockErr == nil {
			unlockErr = err
		}
	}
	if unlockErr != nil && !errors.Is(unlockErr, context.Canceled) {
		return res, fmt.Errorf("unlock: %w", unlockErr)
	}
	return res, nil
}
