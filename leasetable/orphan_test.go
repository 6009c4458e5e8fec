package leasetable_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/leasetable"
)

// TryAcquire calls whose contexts end while their statement is in flight
// leave no lease held once the Locker has settled: every lease taken for a
// caller that stopped waiting is given back within a round trip, long
// before its TTL. Negative control: rows exist for names whose TryAcquire
// failed, so leases were taken for callers that never learnt of them and
// the test exercised the race (with the statement cancelled along with its
// callers, as before 0.1.0's fix, some of them stay held for the TTL and
// the test fails).
func TestCancelledAcquiresLeaveNoOrphans(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	db := pgtest.NewDB(t)
	k := newLocker(t, db.Pool, &leasetable.Config{TTL: time.Minute})
	l, err := k.TryAcquire(ctx, "warm-up", nil) // a connection and a plan ready
	require.NoError(t, err)
	require.NoError(t, l.Release(ctx))
	const n = 300
	failed := make([]string, 0, n)
	var mu sync.Mutex
	var wg sync.WaitGroup
	for i := range n {
		// Spread the calls over about as long as their deadlines, so that
		// deadlines end at every point of the statements' round trips.
		time.Sleep(50 * time.Microsecond)
		wg.Add(1)
		go func() {
			defer wg.Done()
			name := fmt.Sprintf("orphan-%d", i)
			actx, cancel := context.WithTimeout(ctx, time.Duration(rand.N(4001))*time.Microsecond)
			defer cancel()
			l, err := k.TryAcquire(actx, name, nil)
			if err != nil {
				mu.Lock()
				failed = append(failed, name)
				mu.Unlock()
				return
			}
			require.NoError(t, l.Release(ctx))
		}()
	}
	wg.Wait()
	require.NotEmpty(t, failed, "some deadlines must end before the answer")

	var taken, held int
	require.Eventually(t, func() bool {
		require.NoError(t, db.Pool.QueryRow(ctx,
			`SELECT count(*) FILTER (WHERE expires_at > clock_timestamp()), count(*)
			 FROM pgfence.pgfence_leases WHERE name = ANY($1)`, failed).Scan(&held, &taken))
		return held == 0
	}, 10*time.Second, 10*time.Millisecond, "leases taken for cancelled TryAcquire calls are still held (TTL 1m)")
	if held > 0 {
		t.Fatalf("%d leases taken for cancelled TryAcquire calls are still held", held)
	}
	t.Logf("%d of %d TryAcquire calls failed; %d of those had taken their lease, all given back", len(failed), n, taken)
	require.Positive(t, taken, "negative control: leases were taken for callers that stopped waiting")
}
