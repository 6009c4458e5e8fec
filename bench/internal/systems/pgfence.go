package systems

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence"
	"github.com/pgfence/pgfence/advisory"
	"github.com/pgfence/pgfence/bench/internal/harness"
	"github.com/pgfence/pgfence/leasetable"
)

// lockerSet hands out one Locker per concurrent waiting Acquire, so that
// every hand-over goes from one Locker to another, as between processes:
// a waiter never learns of a release through its own Locker's in-process
// bookkeeping. Lockers are created on first use and kept for reuse.
type lockerSet struct {
	mu    sync.Mutex
	free  []pgfence.Locker
	all   []pgfence.Locker
	newFn func(context.Context) (pgfence.Locker, error)
}

func (s *lockerSet) get(ctx context.Context) (pgfence.Locker, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if n := len(s.free); n > 0 {
		l := s.free[n-1]
		s.free = s.free[:n-1]
		return l, nil
	}
	l, err := s.newFn(ctx)
	if err != nil {
		return nil, err
	}
	s.all = append(s.all, l)
	return l, nil
}

func (s *lockerSet) put(l pgfence.Locker) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.free = append(s.free, l)
}

// lockerSystem adapts a pgfence.Locker, of either strategy, to
// harness.System and harness.Waiter: TryAcquire goes through one shared
// Locker, a waiting Acquire through a Locker of its own, and the release is
// the pgfence.Lease's Release.
type lockerSystem struct {
	pool    *pgxpool.Pool
	k       pgfence.Locker
	waiters lockerSet
}

// newLocker makes a Locker on pool.
type newLocker func(context.Context, *pgxpool.Pool) (pgfence.Locker, error)

// newLockerSystem opens a pool of conns connections as the application role
// (harness.Env.AppURL), the shared Locker with newShared, and the waiters'
// Lockers, when needed, with newWaiter.
func newLockerSystem(ctx context.Context, env *harness.Env, conns int, newShared, newWaiter newLocker) (*lockerSystem, error) {
	pool, err := openPool(ctx, env, env.AppURL(), conns)
	if err != nil {
		return nil, err
	}
	k, err := newShared(ctx, pool)
	if err != nil {
		pool.Close()
		return nil, err
	}
	s := &lockerSystem{pool: pool, k: k}
	s.waiters.newFn = func(ctx context.Context) (pgfence.Locker, error) { return newWaiter(ctx, pool) }
	return s, nil
}

func (s *lockerSystem) TryAcquire(ctx context.Context, name string) (harness.Release, error) {
	l, err := s.k.TryAcquire(ctx, name, nil)
	if errors.Is(err, pgfence.ErrNotAcquired) {
		return nil, harness.ErrBusy
	}
	if err != nil {
		return nil, err
	}
	return l.Release, nil
}

func (s *lockerSystem) Acquire(ctx context.Context, name string) (harness.Release, error) {
	k, err := s.waiters.get(ctx)
	if err != nil {
		return nil, err
	}
	l, err := k.Acquire(ctx, name, nil)
	if err != nil {
		s.waiters.put(k)
		return nil, err
	}
	return func(ctx context.Context) error {
		defer s.waiters.put(k)
		return l.Release(ctx)
	}, nil
}

func (s *lockerSystem) Close() error {
	s.k.Close()
	for _, k := range s.waiters.all {
		k.Close()
	}
	s.pool.Close()
	return nil
}

// LeasetableTTL is the lease TTL of the leasetable system; it is renewed
// every TTL/3, which no short point of the benchmark reaches.
const LeasetableTTL = leasetable.DefaultTTL

// Leasetable is pgfence's lease-table strategy: one leasetable.Locker shared
// by every client for TryAcquire, and one Locker per waiter for the waiting
// Acquire of the hand-over scenario.
var Leasetable = harness.Spec{
	Name: "pgfence-leasetable",
	Kind: harness.Pgfence,
	Note: fmt.Sprintf("leasetable.Locker (TTL %v) shared by all clients on a pgx pool of one connection per client; acquire = one call of pgfence_acquire (SECURITY DEFINER: INSERT ... ON CONFLICT DO UPDATE drawing a durable token), release = one call of pgfence_release (UPDATE + pg_notify) (2 statements; concurrent acquires, and concurrent releases, of the Locker are combined into one call each); waiting Acquire wakes on LISTEN/NOTIFY, one Locker per waiter", LeasetableTTL),
	Open: func(ctx context.Context, env *harness.Env, clients int) (harness.System, error) {
		newLease := func(ctx context.Context, pool *pgxpool.Pool) (pgfence.Locker, error) {
			return leasetable.New(ctx, pool, &leasetable.Config{TTL: LeasetableTTL})
		}
		s, err := newLockerSystem(ctx, env, clients, newLease, newLease)
		if err != nil {
			return nil, err
		}
		return &leasetableSystem{lockerSystem: s, ownerURL: env.DatabaseURL}, nil
	},
}

// leasetableSystem is a lockerSystem whose state is pgfence_leases: it can
// be reset and filled, which the application role may not do, so those run
// as the owner.
type leasetableSystem struct {
	*lockerSystem
	ownerURL string
}

// leasesTable is pgfence_leases in the default schema
// (pgfence.DefaultSchema), where the benchmark installs pgfence.
const leasesTable = "pgfence.pgfence_leases"

// leasetableReset empties the lease table: the benchmark database is
// disposable, and no acquirer is running between scenarios.
const leasetableReset = `TRUNCATE ` + leasesTable

// leasetableFill adds live leases on names the benchmark never acquires;
// their tokens come from the column default (the same sequence).
const leasetableFill = `INSERT INTO ` + leasesTable + ` (name, owner, expires_at)
SELECT 'fill-' || g, 'filler', pg_catalog.now() + interval '1 day' FROM pg_catalog.generate_series(1, $1::pg_catalog.int4) AS g
ON CONFLICT (name) DO NOTHING`

func (s *leasetableSystem) ownerExec(ctx context.Context, sql string, args ...any) error {
	conn, err := pgx.Connect(ctx, s.ownerURL)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	_, err = conn.Exec(ctx, sql, args...)
	return err
}

func (s *leasetableSystem) Reset(ctx context.Context) error { return s.ownerExec(ctx, leasetableReset) }

func (s *leasetableSystem) Tables() []string { return []string{leasesTable} }

func (s *leasetableSystem) FillLive(ctx context.Context, n int) error {
	return s.ownerExec(ctx, leasetableFill, n)
}

// Advisory is pgfence's session advisory locks: one advisory.Locker with as
// many sessions as clients (the raw-advisory ceiling's connection budget)
// for TryAcquire, and one single-session Locker per waiter for Acquire.
var Advisory = harness.Spec{
	Name: "pgfence-advisory",
	Kind: harness.Pgfence,
	Note: "advisory.Locker (session locks) with MaxSessions = clients, so it may use as many connections as raw-advisory, though new keys fill its oldest session up to 32 acquisitions in flight before another opens (below 32 clients: one session); TryAcquire = pg_try_advisory_lock + a durable pgfence_next_token() in one statement, Release = pg_advisory_unlock (2 statements); waiting Acquire, refused by another session, registers on its Locker's LISTEN connection and is woken by NOTIFY from the release (sent only when someone waits; polls, 5ms doubling to 200ms, only back it up), one single-session Locker per waiter",
	Open: func(ctx context.Context, env *harness.Env, clients int) (harness.System, error) {
		// The Locker dials its own sessions; its pool only checks the
		// install in New.
		withSessions := func(n int) newLocker {
			return func(ctx context.Context, pool *pgxpool.Pool) (pgfence.Locker, error) {
				return advisory.New(ctx, pool, &advisory.Config{MaxSessions: n})
			}
		}
		return newLockerSystem(ctx, env, 1, withSessions(max(clients, 1)), withSessions(1))
	},
}

// AdvisoryXact is pgfence's transaction advisory locks: TryAcquireTx
// (AcquireTx to wait) in a transaction per cycle, released by COMMIT.
var AdvisoryXact = harness.Spec{
	Name: "pgfence-advisory-xact",
	Kind: harness.Pgfence,
	Note: "advisory.Locker.TryAcquireTx in a transaction per cycle: BEGIN, pg_try_advisory_xact_lock + a durable pgfence_next_token() in one statement, COMMIT (3 statements; the COMMIT waits for a WAL flush when the draw wrote one: about once per 32 draws); waits with AcquireTx",
	Open: func(ctx context.Context, env *harness.Env, clients int) (harness.System, error) {
		pool, err := openPool(ctx, env, env.AppURL(), clients)
		if err != nil {
			return nil, err
		}
		k, err := advisory.New(ctx, pool, nil)
		if err != nil {
			pool.Close()
			return nil, err
		}
		return &advisoryXactSystem{pool: pool, k: k}, nil
	},
}

type advisoryXactSystem struct {
	pool *pgxpool.Pool
	k    *advisory.Locker // its transaction locks open no session
}

func (s *advisoryXactSystem) TryAcquire(ctx context.Context, name string) (harness.Release, error) {
	return s.lock(ctx, name, s.k.TryAcquireTx)
}

func (s *advisoryXactSystem) Acquire(ctx context.Context, name string) (harness.Release, error) {
	return s.lock(ctx, name, s.k.AcquireTx)
}

func (s *advisoryXactSystem) lock(ctx context.Context, name string,
	lock func(context.Context, pgx.Tx, advisory.Key, *pgfence.AcquireOpts) (int64, error)) (harness.Release, error) {
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return nil, err
	}
	if _, err := lock(ctx, tx, advisory.Name(name), nil); err != nil {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		_ = tx.Rollback(rctx)
		cancel()
		if errors.Is(err, pgfence.ErrNotAcquired) {
			return nil, harness.ErrBusy
		}
		return nil, err
	}
	return func(ctx context.Context) error { return tx.Commit(ctx) }, nil
}

func (s *advisoryXactSystem) Close() error { s.k.Close(); s.pool.Close(); return nil }

// AdvisoryTokenCeiling is raw-advisory plus the token draw pgfence makes on
// every grant: it isolates what a durable fencing token costs.
var AdvisoryTokenCeiling = harness.Spec{
	Name: "raw-advisory-token",
	Kind: harness.Ceiling,
	Note: "raw-advisory whose lock statement also draws a durable token, as pgfence does: SELECT CASE WHEN pg_try_advisory_lock($1) THEN pgfence.pgfence_next_token() END, then pg_advisory_unlock (2 statements; the lock's commit waits for a WAL flush when the draw wrote one: about once per 32 draws), as the role pgfence's systems use",
	Open: func(ctx context.Context, env *harness.Env, clients int) (harness.System, error) {
		pool, err := openPool(ctx, env, env.AppURL(), clients)
		if err != nil {
			return nil, err
		}
		return &advisoryCeiling{pool: pool, tryLock: advTryLockToken}, nil
	},
}
