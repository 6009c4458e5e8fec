package leader_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/leader"
	"github.com/pgfence/pgfence/leasetable"
)

// durableDB returns a database on a throwaway cluster of its own that
// flushes its WAL as a production server does (fsync, full_page_writes and
// synchronous_commit on; the harness's shared server runs with fsync off),
// so that the hand-over includes the acquiring commit's flush.
func durableDB(b *testing.B) *pgtest.DB {
	b.Helper()
	_, s := pgtest.NewCluster(b, &pgtest.ClusterOptions{Settings: map[string]string{
		"fsync": "on", "full_page_writes": "on", "synchronous_commit": "on",
	}})
	return s.NewDB(b)
}

// reportQuantiles reports the median and 99th percentile of ds in ms.
func reportQuantiles(b *testing.B, ds []time.Duration) {
	b.Helper()
	if len(ds) == 0 {
		return
	}
	slices.Sort(ds)
	q := func(p float64) float64 {
		return float64(ds[min(len(ds)-1, int(p*float64(len(ds))))]) / float64(time.Millisecond)
	}
	b.ReportMetric(q(0.50), "p50-ms")
	b.ReportMetric(q(0.99), "p99-ms")
	b.ReportMetric(float64(ds[len(ds)-1])/float64(time.Millisecond), "max-ms")
}

// BenchmarkResignHandover measures the hand-over on Resign: from the
// leader's Resign call until the follower's Campaign returns (its lease
// acquired and its value proclaimed). "one-locker": two Electors of one
// process sharing a Locker (the follower is woken directly);
// "two-lockers": two processes' Lockers (woken through LISTEN/NOTIFY).
func BenchmarkResignHandover(b *testing.B) {
	for _, shared := range []bool{true, false} {
		name := "two-lockers"
		if shared {
			name = "one-locker"
		}
		b.Run(name, func(b *testing.B) {
			ctx := context.Background()
			db := durableDB(b)
			newLocker := func() *leasetable.Locker {
				k, err := leasetable.New(ctx, db.Pool, nil)
				require.NoError(b, err)
				b.Cleanup(k.Close)
				return k
			}
			ka := newLocker()
			kb := ka
			if !shared {
				kb = newLocker()
			}
			var es [2]*leader.Elector
			for i, k := range []*leasetable.Locker{ka, kb} {
				e, err := leader.New(ctx, db.Pool, &leader.Config{Locker: k, Election: "bench", Value: "replica"})
				require.NoError(b, err)
				b.Cleanup(e.Close)
				es[i] = e
			}
			term, err := es[0].Campaign(ctx)
			require.NoError(b, err)
			// Open the followers' LISTEN connections before timing.
			wctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
			_, _ = es[1].Campaign(wctx)
			cancel()
			var ds []time.Duration
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				follower := es[(i+1)%2]
				won := make(chan *leader.Term, 1)
				go func() {
					t, err := follower.Campaign(ctx)
					if err != nil {
						b.Error(err)
					}
					won <- t
				}()
				b.StopTimer()
				time.Sleep(5 * time.Millisecond) // the follower is waiting
				b.StartTimer()
				start := time.Now()
				require.NoError(b, term.Resign(ctx))
				term = <-won
				ds = append(ds, time.Since(start))
			}
			b.StopTimer()
			require.NoError(b, term.Resign(ctx))
			reportQuantiles(b, ds)
		})
	}
}

// BenchmarkCrashTakeover measures how long after a crashed leader's lease
// expired (on the database clock) a waiting follower's term began (on the
// same clock). The crashed leader is a lease of 200ms that nobody renews.
func BenchmarkCrashTakeover(b *testing.B) {
	ctx := context.Background()
	db := durableDB(b)
	k, err := leasetable.New(ctx, db.Pool, nil)
	require.NoError(b, err)
	b.Cleanup(k.Close)
	e, err := leader.New(ctx, db.Pool, &leader.Config{Locker: k, Election: "crash", Value: "follower"})
	require.NoError(b, err)
	b.Cleanup(e.Close)
	var ds []time.Duration
	for i := 0; i < b.N; i++ {
		var expires time.Time
		require.NoError(b, db.Pool.QueryRow(ctx,
			"SELECT expires_at FROM pgfence.pgfence_acquire(ARRAY['crash'], 'crashed', ARRAY[200000::bigint]) WHERE acquired").Scan(&expires))
		t, err := e.Campaign(ctx)
		require.NoError(b, err)
		ds = append(ds, t.BeganAt().Sub(expires))
		require.NoError(b, t.Resign(ctx))
	}
	reportQuantiles(b, ds)
}
