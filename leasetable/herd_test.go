package leasetable_test

import (
	"context"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence"
	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/leasetable"
)

// TestHerdOfOneLockerAsksOnce: many Acquire calls of one Locker waiting
// for a lease that is handed over again and again ask the database about
// once per hand-over, not once per waiter: the waiters a release wakes wait
// for the first one's attempt and take its refusal as theirs. The count is
// the Attempts of every call's Acquired or NotAcquired event (the calls
// still waiting at the end are cancelled). The control spreads the same
// waiters over a Locker each, which must each ask, so the count can tell
// the two apart.
func TestHerdOfOneLockerAsksOnce(t *testing.T) {
	t.Parallel()
	const waiters, handovers = 20, 10
	for _, tc := range []struct {
		name    string
		lockers int
		atMost  int
		atLeast int
	}{
		// Each waiter's first attempt, then about one per hand-over
		// (plus one when a release's NOTIFY arrives after the in-process
		// wake-up it follows).
		{"one Locker", 1, waiters + 3*handovers, 0},
		{"control: a Locker per waiter", waiters, 1 << 30, waiters + 5*handovers},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			db := pgtest.NewDB(t)
			holder := newLocker(t, db.Pool, &leasetable.Config{Owner: "holder"})
			var asked atomic.Int64
			obs := pgfence.ObserverFunc(func(_ context.Context, e pgfence.Event) {
				switch e := e.(type) {
				case pgfence.Acquired:
					asked.Add(int64(e.Attempts))
				case pgfence.NotAcquired:
					asked.Add(int64(e.Attempts))
				}
			})
			pool := db.NewPool(t, nil)
			lockers := make([]*leasetable.Locker, tc.lockers)
			for i := range lockers {
				lockers[i] = newLocker(t, pool, &leasetable.Config{Owner: "waiter-" + strconv.Itoa(i), Observer: obs})
			}
			const name = "herd:ask-once"
			held, err := holder.TryAcquire(ctx, name, nil)
			require.NoError(t, err)
			wctx, stop := context.WithCancel(ctx)
			got := make(chan pgfence.Lease, waiters)
			var wg sync.WaitGroup
			for i := range waiters {
				wg.Add(1)
				go func() {
					defer wg.Done()
					l, err := lockers[i%len(lockers)].Acquire(wctx, name, nil)
					if err == nil {
						got <- l
					}
				}()
			}
			require.Eventually(t, func() bool {
				n := 0
				for _, l := range lockers {
					n += l.Stats().Waiting
				}
				return n == waiters
			}, 20*time.Second, 5*time.Millisecond, "every waiter waits")
			for range handovers {
				require.NoError(t, held.Release(ctx))
				select {
				case held = <-got:
				case <-ctx.Done():
					t.Fatal("no waiter took the lease")
				}
			}
			require.NoError(t, held.Release(ctx))
			stop()
			wg.Wait()
			close(got)
			for l := range got { // taken as the waiters were cancelled
				require.NoError(t, l.Release(ctx))
			}
			n := int(asked.Load())
			t.Logf("%d attempts by %d waiters on %d Lockers over %d hand-overs", n, waiters, tc.lockers, handovers)
			require.LessOrEqual(t, n, tc.atMost)
			require.GreaterOrEqual(t, n, tc.atLeast)
		})
	}
}
