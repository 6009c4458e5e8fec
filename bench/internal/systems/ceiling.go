package systems

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence/bench/internal/harness"
)

// openPool opens a pgx pool to url with exactly conns connections
// allowed, all opened eagerly so connection set-up is not measured, and
// env's WriteDelay on every connection.
func openPool(ctx context.Context, env *harness.Env, url string, conns int) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, fmt.Errorf("parse database URL: %w", err)
	}
	if env.WriteDelay > 0 {
		cfg.ConnConfig.DialFunc = delayedDial(cfg.ConnConfig.DialFunc, env.WriteDelay)
	}
	if conns < 1 {
		conns = 1
	}
	cfg.MaxConns = int32(conns)
	cfg.MinConns = int32(conns)
	cfg.MinIdleConns = int32(conns)
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, err
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, err
	}
	return pool, nil
}

// ownerSeq makes owner ids unique within the process.
var ownerSeq atomic.Int64

func newOwner(prefix string) string {
	return prefix + "-" + strconv.FormatInt(time.Now().UnixNano(), 36) + "-" + strconv.FormatInt(ownerSeq.Add(1), 10)
}

// The ceiling lease table has pgfence_leases' shape and storage settings.
const createCeilingTable = `CREATE TABLE IF NOT EXISTS bench_ceiling_leases (
    name        text        NOT NULL PRIMARY KEY,
    owner       text        NOT NULL,
    fence       bigint      NOT NULL DEFAULT 0,
    acquired_at timestamptz NOT NULL DEFAULT now(),
    expires_at  timestamptz NOT NULL
) WITH (fillfactor = 75, autovacuum_vacuum_scale_factor = 0.05, autovacuum_vacuum_threshold = 100)`

// ceilingAcquire takes a free or expired row: one single-row UPDATE.
const ceilingAcquire = `UPDATE bench_ceiling_leases
SET owner = $2, fence = fence + 1, acquired_at = now(), expires_at = now() + interval '30 seconds'
WHERE name = $1 AND expires_at <= now()
RETURNING fence`

// ceilingRelease expires the row in place, owner-checked: one single-row
// UPDATE.
const ceilingRelease = `UPDATE bench_ceiling_leases SET expires_at = '-infinity'
WHERE name = $1 AND owner = $2 AND fence = $3`

// ceilingReleaseNotify is ceilingRelease that also notifies waiters in the
// same statement, as leasetable's release does: NOTIFY makes the commit take
// a database-wide lock that it holds until its WAL is flushed.
const ceilingReleaseNotify = `WITH released AS (
    UPDATE bench_ceiling_leases SET expires_at = '-infinity'
    WHERE name = $1 AND owner = $2 AND fence = $3
    RETURNING name
)
SELECT count(*) FROM released r LEFT JOIN LATERAL (SELECT pg_notify('bench_released', r.name)) n ON true`

// ceilingPrepare creates free rows for names.
const ceilingPrepare = `INSERT INTO bench_ceiling_leases (name, owner, fence, expires_at)
SELECT n, 'nobody', 0, '-infinity' FROM unnest($1::text[]) AS n
ON CONFLICT (name) DO NOTHING`

// ceilingFill adds live leases on names never acquired.
const ceilingFill = `INSERT INTO bench_ceiling_leases (name, owner, fence, expires_at)
SELECT 'fill-' || g, 'filler', g, now() + interval '1 day' FROM generate_series(1, $1::int) AS g
ON CONFLICT (name) DO NOTHING`

// UpdateCeiling is the two-statement ceiling: one UPDATE to acquire, one to
// release.
var UpdateCeiling = harness.Spec{
	Name: "raw-2update",
	Kind: harness.Ceiling,
	Note: "two single-row UPDATEs per cycle on a table shaped like pgfence_leases (fillfactor 75), autocommit, pgx pool",
	Open: func(ctx context.Context, env *harness.Env, clients int) (harness.System, error) {
		pool, err := openPool(ctx, env, env.DatabaseURL, clients)
		if err != nil {
			return nil, err
		}
		if _, err := pool.Exec(ctx, createCeilingTable); err != nil {
			pool.Close()
			return nil, fmt.Errorf("create ceiling table: %w", err)
		}
		return &updateCeiling{pool: pool, owner: newOwner("ceiling")}, nil
	},
}

// UpdateNotifyCeiling is the two-statement ceiling whose release also sends
// a NOTIFY, as leasetable's release does: it isolates what the notification
// costs.
var UpdateNotifyCeiling = harness.Spec{
	Name: "raw-2update-notify",
	Kind: harness.Ceiling,
	Note: "raw-2update whose release UPDATE also calls pg_notify in the same statement, as leasetable's release does (2 statements)",
	Open: func(ctx context.Context, env *harness.Env, clients int) (harness.System, error) {
		sys, err := UpdateCeiling.Open(ctx, env, clients)
		if err != nil {
			return nil, err
		}
		u := sys.(*updateCeiling)
		u.notify = true
		return notifyCeiling{u}, nil
	},
}

// notifyCeiling is an updateCeiling without Storage: the scale scenario
// measures raw-2update's table already, and the notifying release only
// changes the cycle rate.
type notifyCeiling struct{ u *updateCeiling }

func (s notifyCeiling) TryAcquire(ctx context.Context, name string) (harness.Release, error) {
	return s.u.TryAcquire(ctx, name)
}
func (s notifyCeiling) Prepare(ctx context.Context, names []string) error {
	return s.u.Prepare(ctx, names)
}
func (s notifyCeiling) Reset(ctx context.Context) error { return s.u.Reset(ctx) }
func (s notifyCeiling) Close() error                    { return s.u.Close() }

type updateCeiling struct {
	pool   *pgxpool.Pool
	owner  string
	notify bool // release with ceilingReleaseNotify
}

func (s *updateCeiling) TryAcquire(ctx context.Context, name string) (harness.Release, error) {
	var fence int64
	err := s.pool.QueryRow(ctx, ceilingAcquire, name, s.owner).Scan(&fence)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, harness.ErrBusy
	}
	if err != nil {
		return nil, err
	}
	return func(ctx context.Context) error {
		n := int64(0)
		if s.notify {
			if err := s.pool.QueryRow(ctx, ceilingReleaseNotify, name, s.owner, fence).Scan(&n); err != nil {
				return err
			}
		} else {
			tag, err := s.pool.Exec(ctx, ceilingRelease, name, s.owner, fence)
			if err != nil {
				return err
			}
			n = tag.RowsAffected()
		}
		if n != 1 {
			return fmt.Errorf("ceiling release of %q: lease was not held", name)
		}
		return nil
	}, nil
}

func (s *updateCeiling) Prepare(ctx context.Context, names []string) error {
	_, err := s.pool.Exec(ctx, ceilingPrepare, names)
	return err
}

func (s *updateCeiling) Reset(ctx context.Context) error {
	_, err := s.pool.Exec(ctx, `TRUNCATE bench_ceiling_leases`)
	return err
}

func (s *updateCeiling) Tables() []string { return []string{"bench_ceiling_leases"} }

func (s *updateCeiling) FillLive(ctx context.Context, n int) error {
	_, err := s.pool.Exec(ctx, ceilingFill, n)
	return err
}

func (s *updateCeiling) Close() error { s.pool.Close(); return nil }

// AdvisoryKey maps a lock name to a 64-bit advisory lock key (FNV-1a),
// computed client-side so the ceiling sends nothing but the lock call.
func AdvisoryKey(name string) int64 {
	h := fnv.New64a()
	_, _ = h.Write([]byte(name))
	return int64(h.Sum64())
}

// Session advisory locks: the lock lives on the connection, which stays
// checked out of the pool until the release.
const (
	advTryLock = `SELECT pg_try_advisory_lock($1)`
	advLock    = `SELECT pg_advisory_lock($1)`
	advUnlock  = `SELECT pg_advisory_unlock($1)`
	// advTryLockToken is advTryLock with pgfence's token draw on a grant;
	// it returns NULL when the lock is busy.
	advTryLockToken = `SELECT CASE WHEN pg_catalog.pg_try_advisory_lock($1) THEN pgfence.pgfence_next_token() END`
)

// AdvisoryCeiling is raw pg_try_advisory_lock + pg_advisory_unlock on a
// pooled connection held for the duration of the lock.
var AdvisoryCeiling = harness.Spec{
	Name: "raw-advisory",
	Kind: harness.Ceiling,
	Note: "pg_try_advisory_lock + pg_advisory_unlock (2 statements, no WAL), a pool connection held while locked; waits with pg_advisory_lock",
	Open: func(ctx context.Context, env *harness.Env, clients int) (harness.System, error) {
		pool, err := openPool(ctx, env, env.DatabaseURL, clients)
		if err != nil {
			return nil, err
		}
		return &advisoryCeiling{pool: pool, tryLock: advTryLock}, nil
	},
}

type advisoryCeiling struct {
	pool    *pgxpool.Pool
	tryLock string // advTryLock, advTryLockToken or rcAdvisoryToken
}

func (s *advisoryCeiling) TryAcquire(ctx context.Context, name string) (harness.Release, error) {
	return s.lock(ctx, s.tryLock, name)
}

func (s *advisoryCeiling) Acquire(ctx context.Context, name string) (harness.Release, error) {
	return s.lock(ctx, advLock, name)
}

func (s *advisoryCeiling) lock(ctx context.Context, sql, name string) (harness.Release, error) {
	key := AdvisoryKey(name)
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return nil, err
	}
	if sql == advLock {
		_, err = conn.Exec(ctx, sql, key)
		if err != nil {
			// The server may have granted the lock as ctx ended: never
			// return a connection that might hold it to the pool.
			_ = conn.Conn().Close(context.Background())
			conn.Release()
			return nil, err
		}
	} else {
		ok, err := s.scanTry(ctx, conn, sql, key)
		if err != nil {
			_ = conn.Conn().Close(context.Background())
			conn.Release()
			return nil, err
		}
		if !ok {
			conn.Release()
			return nil, harness.ErrBusy
		}
	}
	return func(ctx context.Context) error {
		var ok bool
		err := conn.QueryRow(ctx, advUnlock, key).Scan(&ok)
		if err != nil {
			_ = conn.Conn().Close(context.Background())
			conn.Release()
			return err
		}
		conn.Release()
		if !ok {
			return fmt.Errorf("advisory unlock of %q: lock was not held", name)
		}
		return nil
	}, nil
}

// scanTry runs a try-lock statement and reports whether it was granted:
// advTryLock returns a boolean, advTryLockToken and rcAdvisoryToken a token
// or NULL.
func (s *advisoryCeiling) scanTry(ctx context.Context, conn *pgxpool.Conn, sql string, key int64) (bool, error) {
	if sql == advTryLockToken || sql == rcAdvisoryToken {
		var token *int64
		err := conn.QueryRow(ctx, sql, key).Scan(&token)
		return token != nil, err
	}
	var ok bool
	err := conn.QueryRow(ctx, sql, key).Scan(&ok)
	return ok, err
}

func (s *advisoryCeiling) Close() error { s.pool.Close(); return nil }

// Transaction-scoped advisory locks: BEGIN, the lock, COMMIT releases.
const (
	advXactTryLock = `SELECT pg_try_advisory_xact_lock($1)`
	advXactLock    = `SELECT pg_advisory_xact_lock($1)`
)

// AdvisoryXactCeiling is BEGIN + pg_try_advisory_xact_lock + COMMIT.
var AdvisoryXactCeiling = harness.Spec{
	Name: "raw-advisory-xact",
	Kind: harness.Ceiling,
	Note: "BEGIN + pg_try_advisory_xact_lock + COMMIT (3 statements, no WAL); waits with pg_advisory_xact_lock",
	Open: func(ctx context.Context, env *harness.Env, clients int) (harness.System, error) {
		pool, err := openPool(ctx, env, env.DatabaseURL, clients)
		if err != nil {
			return nil, err
		}
		return &advisoryXactCeiling{pool: pool}, nil
	},
}

type advisoryXactCeiling struct{ pool *pgxpool.Pool }

func (s *advisoryXactCeiling) TryAcquire(ctx context.Context, name string) (harness.Release, error) {
	return s.lock(ctx, advXactTryLock, name)
}

func (s *advisoryXactCeiling) Acquire(ctx context.Context, name string) (harness.Release, error) {
	return s.lock(ctx, advXactLock, name)
}

func (s *advisoryXactCeiling) lock(ctx context.Context, sql, name string) (harness.Release, error) {
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return nil, err
	}
	rollback := func() {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_ = tx.Rollback(rctx)
	}
	if sql == advXactLock {
		if _, err := tx.Exec(ctx, sql, AdvisoryKey(name)); err != nil {
			rollback()
			return nil, err
		}
	} else {
		var ok bool
		if err := tx.QueryRow(ctx, sql, AdvisoryKey(name)).Scan(&ok); err != nil {
			rollback()
			return nil, err
		}
		if !ok {
			rollback()
			return nil, harness.ErrBusy
		}
	}
	return func(ctx context.Context) error { return tx.Commit(ctx) }, nil
}

func (s *advisoryXactCeiling) Close() error { s.pool.Close(); return nil }
