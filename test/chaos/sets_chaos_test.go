//go:build chaos

package chaos_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence"
	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/leasetable"
	"github.com/pgfence/pgfence/test/chaos"
)

// setRun runs two workers, each of its own Locker (owners set-0, set-1),
// taking overlapping sets again and again through take while the holders'
// backends are killed. After every refusal it counts, on the database
// clock, the names of the worker's set that its owner holds: a set is
// never half-held, so anything but none or all (a grant whose answer the
// kill cut off) is a violation. It returns them.
func setRun(t *testing.T, ctx context.Context, db *pgtest.DB, rounds int,
	take func(ctx context.Context, k *leasetable.Locker, names []string) ([]pgfence.Lease, error)) (violations []string, refusals, killed int) {
	t.Helper()
	sets := [][]string{{"a", "b", "c", "d"}, {"d", "c", "e", "a"}}
	wctx, stop := context.WithCancel(ctx)
	defer stop()
	lockers := make([]*leasetable.Locker, len(sets))
	for i := range sets {
		pool := db.NewPool(t, func(c *pgxpool.Config) {
			c.MaxConns = 4
			c.ConnConfig.RuntimeParams["application_name"] = "chaos-set-holder"
		})
		k, err := leasetable.New(ctx, pool, &leasetable.Config{TTL: 600 * time.Millisecond, Owner: fmt.Sprintf("set-%d", i)})
		require.NoError(t, err)
		t.Cleanup(k.Close)
		lockers[i] = k
	}
	wait := nemesis(wctx, 30*time.Millisecond, func(int) {
		n, _ := chaos.TerminateBackends(ctx, db.Pool, db.Name, "chaos-set-holder")
		killed += n
	})
	var mu sync.Mutex
	var wg sync.WaitGroup
	for i, set := range sets {
		owner, k := fmt.Sprintf("set-%d", i), lockers[i]
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range rounds {
				ls, err := take(wctx, k, set)
				if err != nil {
					var held int
					if qerr := db.Pool.QueryRow(ctx, `SELECT count(*) FROM pgfence.pgfence_leases
						WHERE owner = $1 AND name = ANY($2) AND expires_at > now()`, owner, set).Scan(&held); qerr != nil {
						t.Error(qerr)
						return
					}
					mu.Lock()
					refusals++
					if held != 0 && held != len(set) {
						violations = append(violations, fmt.Sprintf("%s refused (%v) with %d of %v held", owner, err, held, set))
					}
					mu.Unlock()
					for _, l := range ls {
						_ = l.Release(context.WithoutCancel(wctx))
					}
					continue
				}
				time.Sleep(2 * time.Millisecond)
				for _, l := range ls {
					_ = l.Release(context.WithoutCancel(wctx))
				}
			}
		}()
	}
	wg.Wait()
	stop()
	wait()
	return violations, refusals, killed
}

// TestSetsUnderFaults: overlapping sets taken with TryAcquireSet while the
// holders' backends are killed: no refusal leaves a name held.
func TestSetsUnderFaults(t *testing.T) {
	t.Parallel()
	ctx := ctxFor(t, 2*time.Minute)
	db := pgtest.NewDB(t)
	rounds, _ := soak(150, 0)
	v, refusals, killed := setRun(t, ctx, db, rounds, func(ctx context.Context, k *leasetable.Locker, names []string) ([]pgfence.Lease, error) {
		return k.TryAcquireSet(ctx, names, nil)
	})
	t.Logf("refusals %d, backends terminated %d, violations %d", refusals, killed, len(v))
	require.Positive(t, refusals)
	require.Positive(t, killed)
	require.Empty(t, v)
}

// TestNaiveSetsAreDetected: the negative control, a set taken name by name
// (TryAcquire in order, stopping at the first refusal, as a non-atomic
// multi-lock does): a refusal leaves names held, and the check sees it.
func TestNaiveSetsAreDetected(t *testing.T) {
	t.Parallel()
	ctx := ctxFor(t, 2*time.Minute)
	db := pgtest.NewDB(t)
	v, refusals, _ := setRun(t, ctx, db, 60, func(ctx context.Context, k *leasetable.Locker, names []string) ([]pgfence.Lease, error) {
		var ls []pgfence.Lease
		for _, n := range names {
			l, err := k.TryAcquire(ctx, n, nil)
			if err != nil {
				return ls, err // the caller checks before giving these back
			}
			ls = append(ls, l)
		}
		return ls, nil
	})
	t.Logf("refusals %d, violations %d, first: %s", refusals, len(v), firstOr(v, "none"))
	require.NotEmpty(t, v, "negative control not detected")
}
