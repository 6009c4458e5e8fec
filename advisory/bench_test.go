package advisory_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence/advisory"
	"github.com/pgfence/pgfence/internal/pgtest"
)

// BenchmarkLockerTryAcquireRelease measures a TryAcquireKey + Release cycle through a
// Locker: two round trips, the first also drawing a durable fencing token.
func BenchmarkLockerTryAcquireRelease(b *testing.B) {
	ctx := context.Background()
	db := pgtest.NewDB(b)
	l := newLocker(b, db.Pool, nil)
	key := advisory.ID(1)
	for b.Loop() {
		lk, err := l.TryAcquireKey(ctx, key, nil)
		require.NoError(b, err)
		require.NoError(b, lk.Release(ctx))
	}
}

// BenchmarkLockerTryAcquireReleaseParallel runs cycles on distinct keys from
// many goroutines, which share the Locker's sessions.
func BenchmarkLockerTryAcquireReleaseParallel(b *testing.B) {
	ctx := context.Background()
	db := pgtest.NewDB(b)
	l := newLocker(b, db.Pool, nil)
	var next atomic.Int64
	b.RunParallel(func(pb *testing.PB) {
		key := advisory.ID(next.Add(1))
		for pb.Next() {
			lk, err := l.TryAcquireKey(ctx, key, nil)
			require.NoError(b, err)
			require.NoError(b, lk.Release(ctx))
		}
	})
}

// BenchmarkRawTryLockUnlock is the baseline: pg_try_advisory_lock and
// pg_advisory_unlock on one connection, without a token.
func BenchmarkRawTryLockUnlock(b *testing.B) {
	ctx := context.Background()
	conn := pgtest.NewDB(b).Conn(b)
	for b.Loop() {
		var ok bool
		require.NoError(b, conn.QueryRow(ctx, "SELECT pg_try_advisory_lock($1)", int64(1)).Scan(&ok))
		require.True(b, ok)
		require.NoError(b, conn.QueryRow(ctx, "SELECT pg_advisory_unlock($1)", int64(1)).Scan(&ok))
		require.True(b, ok)
	}
}

// BenchmarkRawTryLockTokenUnlock is the baseline plus the token draw
// (pgfence_next_token), to separate its cost from the Locker's.
func BenchmarkRawTryLockTokenUnlock(b *testing.B) {
	ctx := context.Background()
	conn := pgtest.NewDB(b).Conn(b)
	for b.Loop() {
		var token *int64
		require.NoError(b, conn.QueryRow(ctx,
			"SELECT CASE WHEN pg_try_advisory_lock($1) THEN pgfence.pgfence_next_token() END", int64(1)).Scan(&token))
		require.NotNil(b, token)
		var ok bool
		require.NoError(b, conn.QueryRow(ctx, "SELECT pg_advisory_unlock($1)", int64(1)).Scan(&ok))
		require.True(b, ok)
	}
}

// BenchmarkTryAcquireHeldInThisLocker measures TryAcquireKey's refusal of a key held
// by another caller of the same Locker, which costs no round trip: what a
// caller spinning on a busy key pays per attempt.
func BenchmarkTryAcquireHeldInThisLocker(b *testing.B) {
	ctx := context.Background()
	db := pgtest.NewDB(b)
	l := newLocker(b, db.Pool, nil)
	key := advisory.Name("busy")
	lk, err := l.TryAcquireKey(ctx, key, nil)
	require.NoError(b, err)
	b.Cleanup(func() { require.NoError(b, lk.Release(ctx)) })
	for b.Loop() {
		if _, err := l.TryAcquireKey(ctx, key, nil); err == nil {
			b.Fatal("TryAcquireKey of a held key succeeded")
		}
	}
}

// BenchmarkMaxSessions measures TryAcquireKey + Release throughput of one Locker
// shared by 16 clients on distinct keys, on a durable server (fsync,
// full_page_writes and synchronous_commit on, so each grant's token draw
// waits for a WAL flush), with MaxSessions 1, 2, 4 and 8. Each op is one
// round in which every setting runs for a second in turn; the metrics are
// the medians over the rounds of each setting's cycles per second and of
// its ratio to DefaultMaxSessions in the same round.
//
// Run it with: go test -run '^$' -bench MaxSessions -benchtime 3x ./advisory/
func BenchmarkMaxSessions(b *testing.B) {
	const clients, round = 16, time.Second
	settings := []int{1, 2, 4, 8}
	ctx := context.Background()
	_, srv := pgtest.NewCluster(b, &pgtest.ClusterOptions{Settings: map[string]string{
		"fsync": "on", "full_page_writes": "on", "synchronous_commit": "on",
	}})
	db := srv.NewDB(b)
	lockers := make([]*advisory.Locker, len(settings))
	for i, n := range settings {
		lockers[i] = newLocker(b, db.Pool, &advisory.Config{MaxSessions: n})
	}
	rates := make([][]float64, len(settings))
	for b.Loop() {
		for i, l := range lockers {
			var wg sync.WaitGroup
			var cycles atomic.Int64
			errs := make(chan error, clients)
			deadline := time.Now().Add(round)
			for c := range clients {
				wg.Add(1)
				go func() {
					defer wg.Done()
					key := advisory.ID(int64(1000*i + c))
					for time.Now().Before(deadline) {
						lk, err := l.TryAcquireKey(ctx, key, nil)
						if err == nil {
							err = lk.Release(ctx)
						}
						if err != nil {
							errs <- err
							return
						}
						cycles.Add(1)
					}
				}()
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				require.NoError(b, err)
			}
			rates[i] = append(rates[i], float64(cycles.Load())/round.Seconds())
		}
	}
	base := slices.Index(settings, advisory.DefaultMaxSessions)
	for i, n := range settings {
		ratios := make([]float64, len(rates[i]))
		for r := range ratios {
			ratios[r] = rates[i][r] / rates[base][r]
		}
		b.ReportMetric(medianOf(rates[i]), fmt.Sprintf("sessions%d-cycles/s", n))
		if i != base {
			b.ReportMetric(medianOf(ratios), fmt.Sprintf("sessions%d-x-default", n))
		}
	}
	b.ReportMetric(0, "ns/op")
}

func medianOf(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	return s[len(s)/2]
}

// BenchmarkContendedLockAcrossLockers runs AcquireKey + Release cycles from 16
// Lockers (each its own process, as far as the server can tell) on a few
// keys, with wake-ups by NOTIFY and without (polling alone). Waiters
// register as soon as another session refuses them, and every Release of a
// waited key sends NOTIFY, with holds of 2ms as of 30ms. It reports cycles per second over all Lockers.
func BenchmarkContendedLockAcrossLockers(b *testing.B) {
	for _, c := range []struct {
		keys int
		hold time.Duration
	}{{4, 2 * time.Millisecond}, {2, 30 * time.Millisecond}} {
		for _, disable := range []bool{false, true} {
			b.Run(fmt.Sprintf("keys=%d/hold=%v/DisableListen=%v", c.keys, c.hold, disable), func(b *testing.B) {
				ctx := context.Background()
				db := pgtest.NewDB(b)
				const lockers = 16
				ls := make([]*advisory.Locker, lockers)
				for i := range ls {
					ls[i] = newLocker(b, db.Pool, &advisory.Config{MaxSessions: 1, DisableListen: disable})
				}
				var next atomic.Int64
				var wg sync.WaitGroup
				b.ResetTimer()
				start := time.Now()
				for i, l := range ls {
					wg.Add(1)
					go func() {
						defer wg.Done()
						key := advisory.ID(int64(1<<40 + i%c.keys))
						for next.Add(1) <= int64(b.N) {
							lk, err := l.AcquireKey(ctx, key, nil)
							if err != nil {
								b.Error(err)
								return
							}
							time.Sleep(c.hold)
							if err := lk.Release(ctx); err != nil {
								b.Error(err)
								return
							}
						}
					}()
				}
				wg.Wait()
				b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "cycles/s")
			})
		}
	}
}
