package systems

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence/bench/internal/harness"
	"github.com/pgfence/pgfence/leasetable"
)

// The security-cost probes measure, in one run, what the least-privilege
// install (migration 000003: SECURITY DEFINER functions with a pinned
// search_path own every write to the lease table, and the token function
// checks its sequence) costs against the release candidate's statements,
// which the application sent itself as the table's owner. Each probe issues
// one statement to acquire and one to release, per cycle, in autocommit, so
// the pair differs only in what runs on the server. They are opt-in: they
// run only when named in -systems.

// rcTokenSchema holds the release candidate's pgfence_next_token(), body
// for body as migration 000001 created it (no SECURITY DEFINER, no pinned
// search_path, no sequence check), drawing from the installed sequence.
const rcTokenSchema = "bench_rc"

// createRCToken installs the release candidate's token function next to the
// hardened one; run as the owner of the install.
const createRCToken = `CREATE SCHEMA IF NOT EXISTS bench_rc;
CREATE OR REPLACE FUNCTION bench_rc.pgfence_next_token() RETURNS bigint
    LANGUAGE plpgsql VOLATILE
AS $$
BEGIN
    PERFORM set_config('synchronous_commit', 'on', true);
    PERFORM pg_current_xact_id();
    RETURN nextval('pgfence.pgfence_leases_fence_seq');
END;
$$`

// rcAcquire is the release candidate's acquire statement (leasetable's
// acquireBatchSQL), on the installed table and drawing with the release
// candidate's token function. $1 names, $2 owner, $3 TTLs in microseconds.
const rcAcquire = `
WITH req AS (
    SELECT r.name, r.ttl_us FROM unnest($1::text[], $3::bigint[]) AS r(name, ttl_us)
), acquired AS (
    INSERT INTO pgfence.pgfence_leases AS l (name, owner, fence, acquired_at, expires_at)
    SELECT r.name, $2, bench_rc.pgfence_next_token(), now(), now() + r.ttl_us * interval '1 microsecond'
    FROM req r
    WHERE NOT EXISTS (SELECT FROM pgfence.pgfence_leases h WHERE h.name = r.name AND h.expires_at > now())
    ORDER BY r.name
    ON CONFLICT (name) DO UPDATE
        SET owner = excluded.owner,
            fence = bench_rc.pgfence_next_token(),
            acquired_at = excluded.acquired_at,
            expires_at = excluded.expires_at
        WHERE l.expires_at <= now()
    RETURNING l.name, l.owner, l.fence, l.acquired_at, l.expires_at
)
SELECT true, name, owner, fence, acquired_at, expires_at, now() FROM acquired
UNION ALL
SELECT false, p.name, p.owner, p.fence, p.acquired_at, p.expires_at, now()
FROM pgfence.pgfence_leases p
WHERE p.name IN (SELECT name FROM req) AND p.name NOT IN (SELECT name FROM acquired)`

// rcRelease is the release candidate's release statement (leasetable's
// releaseBatchSQL): owner-checked, expires the row in place, notifies, and
// commits with synchronous_commit off when every row was freed. $1 names,
// $2 tokens, $3 AtLeast in microseconds, $4 owner.
const rcRelease = `
WITH released AS (
    UPDATE pgfence.pgfence_leases AS l
    SET expires_at = greatest(now(), l.acquired_at + r.at_least_us * interval '1 microsecond')
    FROM unnest($1::text[], $2::bigint[], $3::bigint[]) AS r(name, fence, at_least_us)
    WHERE l.name = r.name AND l.owner = $4 AND l.fence = r.fence AND l.expires_at > now()
    RETURNING l.name, l.fence, l.expires_at <= now() AS freed
)
SELECT r.fence, a.durability FROM released r
LEFT JOIN LATERAL (
    SELECT pg_notify('` + leasetable.NotifyChannel + `', r.name) WHERE r.freed
) n ON true
LEFT JOIN (
    SELECT set_config('synchronous_commit', 'off', true) FROM released HAVING bool_and(freed)
) a(durability) ON true`

// fnAcquire and fnRelease are what leasetable sends since 000003: a call of
// the SECURITY DEFINER function that runs the same statement as the owner.
// Since 000012 the acquire returns the lease's secret and the release takes
// it: $1 names, $2 tokens, $3 secrets, $4 AtLeast in microseconds.
const (
	fnAcquire = `SELECT acquired, name, owner, fence, acquired_at, expires_at, db_now, secret FROM pgfence.pgfence_acquire($1, $2, $3)`
	fnRelease = `SELECT fence, durability FROM pgfence.pgfence_release($1, $2, $3, $4)`
)

// rcAdvisoryToken is the advisory lock statement with the release
// candidate's token function, as the owner.
const rcAdvisoryToken = `SELECT CASE WHEN pg_try_advisory_lock($1) THEN bench_rc.pgfence_next_token() END`

// installRCToken creates the release candidate's token function, as the
// owner of the install.
func installRCToken(ctx context.Context, ownerURL string) error {
	conn, err := pgx.Connect(ctx, ownerURL)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if _, err := conn.Exec(ctx, createRCToken); err != nil {
		return fmt.Errorf("create %s.pgfence_next_token: %w", rcTokenSchema, err)
	}
	return nil
}

// RCLeasetableSQL runs the release candidate's acquire and release
// statements on pgfence.pgfence_leases, as the owner of the table.
var RCLeasetableSQL = harness.Spec{
	Name:  "rc-leasetable-sql",
	Kind:  harness.Ceiling,
	OptIn: true,
	Note:  "security-cost probe: the release candidate's leasetable statements (INSERT ... ON CONFLICT DO UPDATE with its unhardened pgfence_next_token(), then the notifying UPDATE), one name per statement, sent as the table's owner (2 statements)",
	Open: func(ctx context.Context, env *harness.Env, clients int) (harness.System, error) {
		if err := installRCToken(ctx, env.DatabaseURL); err != nil {
			return nil, err
		}
		return openLeaseProbe(ctx, env, env.DatabaseURL, env.DatabaseURL, clients, rcLease)
	},
}

// FnLeasetable calls the SECURITY DEFINER functions that own every write to
// pgfence.pgfence_leases since 000003, as the application role.
var FnLeasetable = harness.Spec{
	Name:  "fn-leasetable",
	Kind:  harness.Ceiling,
	OptIn: true,
	Note:  "security-cost probe: the same cycle through pgfence.pgfence_acquire and pgfence.pgfence_release (SECURITY DEFINER, pinned search_path, hardened token function; since 000012 the release presents the secret the acquire returned), one name per call, as the role pgfence's lockers use (2 statements)",
	Open: func(ctx context.Context, env *harness.Env, clients int) (harness.System, error) {
		return openLeaseProbe(ctx, env, env.AppURL(), env.DatabaseURL, clients, fnLease)
	},
}

// RCAdvisoryToken is raw-advisory-token with the release candidate's token
// function; raw-advisory-token is its hardened counterpart.
var RCAdvisoryToken = harness.Spec{
	Name:  "rc-advisory-token",
	Kind:  harness.Ceiling,
	OptIn: true,
	Note:  "security-cost probe: raw-advisory-token's statements with the release candidate's pgfence_next_token() (not SECURITY DEFINER, no pinned search_path, no sequence check), as the owner (2 statements, one WAL flush)",
	Open: func(ctx context.Context, env *harness.Env, clients int) (harness.System, error) {
		if err := installRCToken(ctx, env.DatabaseURL); err != nil {
			return nil, err
		}
		pool, err := openPool(ctx, env, env.DatabaseURL, clients)
		if err != nil {
			return nil, err
		}
		return &advisoryCeiling{pool: pool, tryLock: rcAdvisoryToken}, nil
	},
}

// leaseStmts is one way of acquiring and releasing a lease with one-element
// arrays: the release candidate's statements (owner-checked release) or the
// functions of the latest migration (secret-checked release).
type leaseStmts struct {
	acquire, release string
	secret           bool // acquire returns a secret, release takes it as $3
}

var (
	rcLease = leaseStmts{acquire: rcAcquire, release: rcRelease}
	fnLease = leaseStmts{acquire: fnAcquire, release: fnRelease, secret: true}
)

// heldLease is what an acquire statement answered.
type heldLease struct {
	acquired bool
	fence    int64
	secret   string
}

// acquireOne runs st's acquire of name.
func (st leaseStmts) acquireOne(ctx context.Context, q querier, name, owner string, ttlUs []int64) (heldLease, error) {
	var (
		l          heldLease
		rowName    *string
		rowOwner   *string
		fence      *int64
		secret     *string
		at, exp, n *time.Time
	)
	dest := []any{&l.acquired, &rowName, &rowOwner, &fence, &at, &exp, &n}
	if st.secret {
		dest = append(dest, &secret)
	}
	if err := q.QueryRow(ctx, st.acquire, []string{name}, owner, ttlUs).Scan(dest...); err != nil {
		return l, err
	}
	if fence != nil {
		l.fence = *fence
	}
	if secret != nil {
		l.secret = *secret
	}
	return l, nil
}

// releaseOne runs st's release of l under name; pgx.ErrNoRows when the lease
// was not held.
func (st leaseStmts) releaseOne(ctx context.Context, q querier, name, owner string, l heldLease, atLeastUs []int64) error {
	args := []any{[]string{name}, []int64{l.fence}, atLeastUs, owner}
	if st.secret {
		args = []any{[]string{name}, []int64{l.fence}, []string{l.secret}, atLeastUs}
	}
	var tok int64
	var durability *string
	return q.QueryRow(ctx, st.release, args...).Scan(&tok, &durability)
}

// querier is what the probes send their statements through: a pool, a
// connection or a transaction.
type querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// leaseProbe cycles a lease through one acquire and one release statement
// with one-element arrays, as a Locker does when nothing else is in flight.
type leaseProbe struct {
	pool             *pgxpool.Pool
	ownerURL         string
	owner            string
	stmts            leaseStmts
	ttlUs, atLeastUs []int64
}

func openLeaseProbe(ctx context.Context, env *harness.Env, url, ownerURL string, clients int, stmts leaseStmts) (*leaseProbe, error) {
	pool, err := openPool(ctx, env, url, clients)
	if err != nil {
		return nil, err
	}
	return &leaseProbe{pool: pool, ownerURL: ownerURL, owner: newOwner("probe"), stmts: stmts,
		ttlUs: []int64{LeasetableTTL.Microseconds()}, atLeastUs: []int64{0}}, nil
}

func (s *leaseProbe) TryAcquire(ctx context.Context, name string) (harness.Release, error) {
	l, err := s.stmts.acquireOne(ctx, s.pool, name, s.owner, s.ttlUs)
	if errors.Is(err, pgx.ErrNoRows) || (err == nil && !l.acquired) {
		return nil, harness.ErrBusy
	}
	if err != nil {
		return nil, err
	}
	return func(ctx context.Context) error {
		err := s.stmts.releaseOne(ctx, s.pool, name, s.owner, l, s.atLeastUs)
		if errors.Is(err, pgx.ErrNoRows) {
			return fmt.Errorf("probe release of %q: lease was not held", name)
		}
		return err
	}, nil
}

// Reset empties the lease table, as the owner.
func (s *leaseProbe) Reset(ctx context.Context) error {
	conn, err := pgx.Connect(ctx, s.ownerURL)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	_, err = conn.Exec(ctx, leasetableReset)
	return err
}

func (s *leaseProbe) Close() error { s.pool.Close(); return nil }

// CallPair is two ways of running the same cycle, one statement at a time:
// the release candidate's (Old) and the least-privilege install's (New),
// named after the probe systems that run them.
type CallPair struct {
	What     string
	Old, New string
}

// CallPairs are the pairs the per-call cost scenario compares.
var CallPairs = []CallPair{
	{What: "leasetable acquire + release", Old: RCLeasetableSQL.Name, New: FnLeasetable.Name},
	{What: "advisory lock with token + unlock", Old: RCAdvisoryToken.Name, New: AdvisoryTokenCeiling.Name},
}

// CallPath runs cycles of one probe on one connection of its own, inside
// transactions that it rolls back: nothing is committed, so no WAL flush
// is waited for and what is timed is the statements' round trips and
// server work, the part the least-privilege install changes.
type CallPath struct {
	conn  *pgx.Conn
	cycle func(ctx context.Context, tx pgx.Tx, name string) error
}

// OpenCallPath connects for the probe named name (one of CallPairs'), as
// the role that probe uses.
func OpenCallPath(ctx context.Context, env *harness.Env, name string) (*CallPath, error) {
	url := env.AppURL()
	var cycle func(ctx context.Context, tx pgx.Tx, name string) error
	ttl, atLeast := []int64{LeasetableTTL.Microseconds()}, []int64{0}
	owner := newOwner("call")
	lease := func(st leaseStmts) func(ctx context.Context, tx pgx.Tx, name string) error {
		return func(ctx context.Context, tx pgx.Tx, name string) error {
			l, err := st.acquireOne(ctx, tx, name, owner, ttl)
			if err != nil {
				return err
			}
			if !l.acquired {
				return fmt.Errorf("call probe: %q is held", name)
			}
			return st.releaseOne(ctx, tx, name, owner, l, atLeast)
		}
	}
	advisoryToken := func(tryLock string) func(ctx context.Context, tx pgx.Tx, name string) error {
		return func(ctx context.Context, tx pgx.Tx, name string) error {
			key := AdvisoryKey(name)
			var token *int64
			if err := tx.QueryRow(ctx, tryLock, key).Scan(&token); err != nil {
				return err
			}
			if token == nil {
				return fmt.Errorf("call probe: advisory lock on %q is held", name)
			}
			var ok bool
			return tx.QueryRow(ctx, advUnlock, key).Scan(&ok)
		}
	}
	switch name {
	case RCLeasetableSQL.Name:
		url, cycle = env.DatabaseURL, lease(rcLease)
	case FnLeasetable.Name:
		cycle = lease(fnLease)
	case RCAdvisoryToken.Name:
		url, cycle = env.DatabaseURL, advisoryToken(rcAdvisoryToken)
	case AdvisoryTokenCeiling.Name:
		cycle = advisoryToken(advTryLockToken)
	default:
		return nil, fmt.Errorf("no call probe %q", name)
	}
	if url == env.DatabaseURL {
		if err := installRCToken(ctx, env.DatabaseURL); err != nil {
			return nil, err
		}
	}
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return nil, err
	}
	return &CallPath{conn: conn, cycle: cycle}, nil
}

// Time runs n cycles on distinct names in one transaction, rolls it back,
// and returns the time the cycles took.
func (p *CallPath) Time(ctx context.Context, names []string) (time.Duration, error) {
	tx, err := p.conn.Begin(ctx)
	if err != nil {
		return 0, err
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	t0 := time.Now()
	for _, name := range names {
		if err := p.cycle(ctx, tx, name); err != nil {
			return 0, err
		}
	}
	return time.Since(t0), nil
}

// Close closes the path's connection.
func (p *CallPath) Close(ctx context.Context) { _ = p.conn.Close(ctx) }
