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
type lockerSet[L any] struct {
	mu    sync.Mutex
	free  []L
	all   []L
	newFn func() (L, error)
}

func (s *lockerSet[L]) get() (L, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if n := len(s.free); n > 0 {
		l := s.free[n-1]
		s.free = s.free[:n-1]
		return l, nil
	}
	l, err := s.newFn()
	if err != nil {
		var zero L
		return zero, err
	}
	s.all = append(s.all, l)
	return l, nil
}

func (s *lockerSet[L]) put(l L) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.free = append(s.free, l)
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
	Note: fmt.Sprintf("leasetable.Locker (TTL %v) shared by all clients on a pgx pool of one connection per client; acquire = one INSERT ... ON CONFLICT DO UPDATE drawing a durable token, release = one UPDATE + pg_notify (2 statements; concurrent acquires, and concurrent releases, of the Locker are combined into one statement each); waiting Acquire wakes on LISTEN/NOTIFY, one Locker per waiter", LeasetableTTL),
	Open: func(ctx context.Context, env *harness.Env, clients int) (harness.System, error) {
		pool, err := openPool(ctx, env.DatabaseURL, clients)
		if err != nil {
			return nil, err
		}
		k, err := leasetable.New(pool, &leasetable.Config{TTL: LeasetableTTL})
		if err != nil {
			pool.Close()
			return nil, err
		}
		s := &leasetableSystem{pool: pool, k: k}
		s.waiters.newFn = func() (*leasetable.Locker, error) {
			return leasetable.New(pool, &leasetable.Config{TTL: LeasetableTTL})
		}
		return s, nil
	},
}

type leasetableSystem struct {
	pool    *pgxpool.Pool
	k       *leasetable.Locker
	waiters lockerSet[*leasetable.Locker]
}

func (s *leasetableSystem) TryAcquire(ctx context.Context, name string) (harness.Release, error) {
	l, err := s.k.TryAcquire(ctx, name, nil)
	if errors.Is(err, pgfence.ErrNotAcquired) {
		return nil, harness.ErrBusy
	}
	if err != nil {
		return nil, err
	}
	return l.Release, nil
}

func (s *leasetableSystem) Acquire(ctx context.Context, name string) (harness.Release, error) {
	k, err := s.waiters.get()
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

// Reset empties pgfence_leases: the benchmark database is disposable, and
// no acquirer is running between scenarios.
func (s *leasetableSystem) Reset(ctx context.Context) error {
	_, err := s.pool.Exec(ctx, `TRUNCATE pgfence_leases`)
	return err
}

func (s *leasetableSystem) Tables() []string { return []string{"pgfence_leases"} }

// leasetableFill adds live leases on names the benchmark never acquires;
// their tokens come from the column default (the same sequence).
const leasetableFill = `INSERT INTO pgfence_leases (name, owner, expires_at)
SELECT 'fill-' || g, 'filler', now() + interval '1 day' FROM generate_series(1, $1::int) AS g
ON CONFLICT (name) DO NOTHING`

func (s *leasetableSystem) FillLive(ctx context.Context, n int) error {
	_, err := s.pool.Exec(ctx, leasetableFill, n)
	return err
}

func (s *leasetableSystem) Close() error {
	s.k.Close()
	for _, k := range s.waiters.all {
		k.Close()
	}
	s.pool.Close()
	return nil
}

// Advisory is pgfence's session advisory locks: one advisory.Locker with as
// many sessions as clients (the raw-advisory ceiling's connection budget)
// for TryLock, and one single-session Locker per waiter for Lock.
var Advisory = harness.Spec{
	Name: "pgfence-advisory",
	Kind: harness.Pgfence,
	Note: "advisory.Locker (session locks) with MaxSessions = clients, so it uses as many connections as raw-advisory; TryLock = pg_try_advisory_lock + a durable pgfence_next_token() in one statement, Unlock = pg_advisory_unlock (2 statements); waiting Lock polls (5ms doubling to 200ms) and, once it has waited ~40-75ms, is woken by NOTIFY from the Unlock (sent only when someone waits), one single-session Locker per waiter",
	Open: func(ctx context.Context, env *harness.Env, clients int) (harness.System, error) {
		pool, err := openPool(ctx, env.DatabaseURL, 1)
		if err != nil {
			return nil, err
		}
		l, err := advisory.New(pool, &advisory.Config{MaxSessions: max(clients, 1)})
		if err != nil {
			pool.Close()
			return nil, err
		}
		s := &advisorySystem{pool: pool, l: l}
		s.waiters.newFn = func() (*advisory.Locker, error) {
			return advisory.New(pool, &advisory.Config{MaxSessions: 1})
		}
		return s, nil
	},
}

type advisorySystem struct {
	pool    *pgxpool.Pool
	l       *advisory.Locker
	waiters lockerSet[*advisory.Locker]
}

func (s *advisorySystem) TryAcquire(ctx context.Context, name string) (harness.Release, error) {
	lk, err := s.l.TryLock(ctx, advisory.Name(name), nil)
	if errors.Is(err, pgfence.ErrNotAcquired) {
		return nil, harness.ErrBusy
	}
	if err != nil {
		return nil, err
	}
	return lk.Unlock, nil
}

func (s *advisorySystem) Acquire(ctx context.Context, name string) (harness.Release, error) {
	l, err := s.waiters.get()
	if err != nil {
		return nil, err
	}
	lk, err := l.Lock(ctx, advisory.Name(name), nil)
	if err != nil {
		s.waiters.put(l)
		return nil, err
	}
	return func(ctx context.Context) error {
		defer s.waiters.put(l)
		return lk.Unlock(ctx)
	}, nil
}

func (s *advisorySystem) Close() error {
	s.l.Close()
	for _, l := range s.waiters.all {
		l.Close()
	}
	s.pool.Close()
	return nil
}

// AdvisoryXact is pgfence's transaction advisory locks: TryLockTx (LockTx
// to wait) in a transaction per cycle, released by COMMIT.
var AdvisoryXact = harness.Spec{
	Name: "pgfence-advisory-xact",
	Kind: harness.Pgfence,
	Note: "advisory.TryLockTx in a transaction per cycle: BEGIN, pg_try_advisory_xact_lock + a durable pgfence_next_token() in one statement, COMMIT (3 statements, the COMMIT waits for a WAL flush); waits with LockTx",
	Open: func(ctx context.Context, env *harness.Env, clients int) (harness.System, error) {
		pool, err := openPool(ctx, env.DatabaseURL, clients)
		if err != nil {
			return nil, err
		}
		return &advisoryXactSystem{pool: pool}, nil
	},
}

type advisoryXactSystem struct{ pool *pgxpool.Pool }

func (s *advisoryXactSystem) TryAcquire(ctx context.Context, name string) (harness.Release, error) {
	return s.lock(ctx, name, advisory.TryLockTx)
}

func (s *advisoryXactSystem) Acquire(ctx context.Context, name string) (harness.Release, error) {
	return s.lock(ctx, name, advisory.LockTx)
}

func (s *advisoryXactSystem) lock(ctx context.Context, name string,
	lock func(context.Context, pgx.Tx, advisory.Key, *advisory.LockOpts) (int64, error)) (harness.Release, error) {
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

func (s *advisoryXactSystem) Close() error { s.pool.Close(); return nil }

// AdvisoryTokenCeiling is raw-advisory plus the token draw pgfence makes on
// every grant: it isolates what a durable fencing token costs.
var AdvisoryTokenCeiling = harness.Spec{
	Name: "raw-advisory-token",
	Kind: harness.Ceiling,
	Note: "raw-advisory whose lock statement also draws a durable token, as pgfence does: SELECT CASE WHEN pg_try_advisory_lock($1) THEN pgfence_next_token() END, then pg_advisory_unlock (2 statements, one WAL flush)",
	Open: func(ctx context.Context, env *harness.Env, clients int) (harness.System, error) {
		pool, err := openPool(ctx, env.DatabaseURL, clients)
		if err != nil {
			return nil, err
		}
		return &advisoryCeiling{pool: pool, tryLock: advTryLockToken}, nil
	},
}
