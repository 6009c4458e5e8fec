//go:build chaos

package chaos_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence/advisory"
	"github.com/pgfence/pgfence/leasetable"
	"github.com/pgfence/pgfence/test/chaos"
)

// A real locker under test, with the register it protects.
type lockerKind string

const (
	// kindLease: leasetable leases, fenced writes (fence.Update).
	kindLease lockerKind = "leasetable"
	// kindLeaseChecked: leasetable leases, fenced and lease-checked writes
	// (fence.Update(...).UnderLease).
	kindLeaseChecked lockerKind = "leasetable-underlease"
	// kindAdvisory: advisory session locks, fenced writes.
	kindAdvisory lockerKind = "advisory"
	// kindAdvisoryTx: advisory transaction locks, the register's operations
	// in the lock's transaction.
	kindAdvisoryTx lockerKind = "advisory-xact"
	// kindLeaseUnguarded: leasetable leases, unguarded writes (negative
	// control).
	kindLeaseUnguarded lockerKind = "leasetable-unguarded"
	// kindPermit: the one permit of a leasetable semaphore, fenced writes
	// (the power-loss scenarios' hand-overs).
	kindPermit lockerKind = "leasetable-permit"
)

var allKinds = []lockerKind{kindLease, kindLeaseChecked, kindAdvisory, kindAdvisoryTx}

// realOpts tunes the real lockers for short fault runs.
type realOpts struct {
	// Workers is the number of workers, each with its own Locker.
	Workers int
	// TTL is the leases' TTL; zero means 300ms.
	TTL time.Duration
	// Pooled marks a pool behind a transaction pooler: leasetable's
	// LISTEN is disabled (DisableListen).
	Pooled bool
}

// realLockers returns one Locker per worker of kind, all on pool.
func realLockers(t *testing.T, kind lockerKind, pool *pgxpool.Pool, o realOpts) []chaos.Locker {
	t.Helper()
	if o.Workers == 0 {
		o.Workers = 4
	}
	if o.TTL == 0 {
		o.TTL = 300 * time.Millisecond
	}
	// New checks the install with one round trip through pool.
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	var out []chaos.Locker
	for i := 0; i < o.Workers; i++ {
		switch kind {
		case kindLease, kindLeaseChecked, kindLeaseUnguarded:
			l, err := leasetable.New(ctx, pool, &leasetable.Config{TTL: o.TTL, DisableListen: o.Pooled})
			require.NoError(t, err)
			t.Cleanup(l.Close)
			out = append(out, &chaos.PgfenceLocker{L: l})
		case kindAdvisory:
			l, err := advisory.New(ctx, pool, &advisory.Config{
				MaxSessions: 1, SessionCheckInterval: 100 * time.Millisecond, QueryTimeout: time.Second,
				MaxPollInterval: 20 * time.Millisecond,
			})
			require.NoError(t, err)
			t.Cleanup(l.Close)
			out = append(out, &chaos.PgfenceLocker{L: l})
		case kindAdvisoryTx:
			l, err := advisory.New(ctx, pool, nil)
			require.NoError(t, err)
			t.Cleanup(l.Close)
			out = append(out, &chaos.AdvisoryTxLocker{L: l, Pool: pool})
		default:
			t.Fatalf("unknown locker kind %q", kind)
		}
	}
	return out
}

// finalReader reads a register's final state.
type finalReader interface {
	Final(ctx context.Context) (chaos.RegisterState, error)
}

// realRegister returns the register kind protects, on db, and a reader of
// its final state on admin (a connection that no fault touches). The table
// is created through admin too: setup must not depend on the faulty path
// (its tight connect timeout, under a loaded CI machine), only the workload.
func realRegister(t *testing.T, ctx context.Context, kind lockerKind, db, admin *pgxpool.Pool) (chaos.Register, finalReader) {
	t.Helper()
	const table = "chaos_register"
	adm, err := chaos.NewSQLRegister(ctx, admin, table, true)
	require.NoError(t, err)
	var reg chaos.ScopedRegister
	switch kind {
	case kindLeaseUnguarded:
		reg, err = chaos.NewSQLRegister(ctx, admin, table, false)
	case kindLeaseChecked:
		reg, err = chaos.NewFenceRegister(ctx, admin, table, chaos.DefaultLockName)
	default:
		reg, err = chaos.NewFenceRegister(ctx, admin, table, "")
	}
	require.NoError(t, err)
	return reg.On(db), adm
}

// finalState reads the final state, retrying a few times after faults.
func finalState(t *testing.T, ctx context.Context, r finalReader) chaos.RegisterState {
	t.Helper()
	var s chaos.RegisterState
	var err error
	for i := 0; i < 5; i++ {
		if s, err = r.Final(ctx); err == nil {
			return s
		}
		time.Sleep(200 * time.Millisecond)
	}
	require.NoError(t, err)
	return s
}

// checkReal requires a real locker's history to be linearizable, with
// mutual exclusion for advisory locks when no fault can end a lock early
// (exclusive). Negative controls call verdict directly.
func checkReal(t *testing.T, scenario string, kind lockerKind, h chaos.History, final chaos.RegisterState, exclusive bool) {
	t.Helper()
	leaseLost := 0
	for _, op := range h {
		if op.Outcome == chaos.Fail && (op.Kind == chaos.Read || op.Kind == chaos.Write) && strings.Contains(op.Err, "lease") {
			leaseLost++
		}
	}
	t.Logf("%s/%s: acquires ok %d fail %d; writes ok %d unknown %d; fenced claims %d, fenced writes %d, lease-checked rejections %d; ops by holders told of the loss %d",
		scenario, kind, h.Count(chaos.Acquire, chaos.Ok), h.Count(chaos.Acquire, chaos.Fail),
		h.Count(chaos.Write, chaos.Ok), h.Count(chaos.Write, chaos.Unknown),
		countFencedKind(h, chaos.Read), countFencedKind(h, chaos.Write), leaseLost, countLost(h))
	verdict(t, h, &chaos.CheckOpts{
		Name: scenario + "-" + string(kind), Final: &final.Value, Claim: true, Exclusive: exclusive,
		TxScoped: kind == kindAdvisoryTx,
	}, false)
}

func countFencedKind(h chaos.History, k chaos.Kind) int {
	n := 0
	for _, op := range h {
		if op.Kind == k && op.Fenced {
			n++
		}
	}
	return n
}

// countLost counts operations (read, write, release) of holders that had
// been told their lock was lost.
func countLost(h chaos.History) int {
	n := 0
	for _, op := range h {
		if op.Lost {
			n++
		}
	}
	return n
}

// appPool returns a pool on url whose connections carry application_name
// app (so TerminateBackends can find them).
func appPool(t *testing.T, ctx context.Context, url, app string, maxConns int32, edit func(*pgxpool.Config)) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(url)
	require.NoError(t, err)
	cfg.MaxConns = maxConns
	if app != "" {
		cfg.ConnConfig.RuntimeParams["application_name"] = app
	}
	if edit != nil {
		edit(cfg)
	}
	p, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(p.Close)
	return p
}
