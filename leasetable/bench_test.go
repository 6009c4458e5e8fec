package leasetable_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/leasetable"
)

// BenchmarkTryAcquireRelease measures uncontended acquire+release cycles of
// one name, one at a time: two round trips per cycle, the acquire's commit
// waiting for a WAL flush.
func BenchmarkTryAcquireRelease(b *testing.B) {
	ctx := context.Background()
	db := pgtest.NewDB(b)
	k, err := leasetable.New(ctx, db.Pool, nil)
	if err != nil {
		b.Fatal(err)
	}
	defer k.Close()
	for b.Loop() {
		l, err := k.TryAcquire(ctx, "bench", nil)
		if err != nil {
			b.Fatal(err)
		}
		if err := l.Release(ctx); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkTryAcquireReleaseParallel runs cycles on distinct names from
// parallel goroutines sharing one Locker.
func BenchmarkTryAcquireReleaseParallel(b *testing.B) {
	ctx := context.Background()
	db := pgtest.NewDB(b)
	k, err := leasetable.New(ctx, db.Pool, nil)
	if err != nil {
		b.Fatal(err)
	}
	defer k.Close()
	var id atomic.Int64
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		name := fmt.Sprintf("bench-%d", id.Add(1))
		for pb.Next() {
			l, err := k.TryAcquire(ctx, name, nil)
			if err != nil {
				b.Error(err)
				return
			}
			if err := l.Release(ctx); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

// durableClients is the number of concurrent clients in
// BenchmarkDurableCycles, as in the project's performance targets.
const durableClients = 16

// BenchmarkDurableCycles measures acquire+release cycles per second with 16
// concurrent clients over distinct names, on a dedicated server that flushes
// WAL for real (fsync, full_page_writes and synchronous_commit on), side by
// side with the ceiling of any one-statement-per-call design: two raw
// single-row UPDATEs per cycle issued with pgx on a table shaped like
// pgfence_leases. The two alternate in durableRounds rounds, so that a
// change of load on a shared machine affects both alike: compare the
// medians of their cycles/s metrics in one run; absolute figures depend on
// the disk.
func BenchmarkDurableCycles(b *testing.B) {
	_, srv := pgtest.NewCluster(b, &pgtest.ClusterOptions{Settings: map[string]string{
		"fsync": "on", "full_page_writes": "on", "synchronous_commit": "on",
	}})
	db := srv.NewDB(b)
	pool := db.NewPool(b, func(c *pgxpool.Config) {
		c.MaxConns, c.MinConns = durableClients, durableClients
	})
	ctx := context.Background()
	_, err := pool.Exec(ctx, ceilingTableSQL)
	require.NoError(b, err)

	_, err = pool.Exec(ctx, `INSERT INTO bench_ceiling (name, owner, fence, expires_at)
		SELECT 'c-' || g, 'nobody', 0, '-infinity' FROM generate_series(1, $1::int) AS g`, durableClients)
	require.NoError(b, err)
	k, err := leasetable.New(ctx, pool, nil)
	require.NoError(b, err)
	defer k.Close()
	for range durableRounds {
		durableRound(ctx, b, pool, k)
	}
}

// durableRounds is how many times BenchmarkDurableCycles alternates between
// the ceiling and leasetable.
const durableRounds = 5

func durableRound(ctx context.Context, b *testing.B, pool *pgxpool.Pool, k *leasetable.Locker) {
	b.Run("raw-2update", func(b *testing.B) {
		owner := "ceiling"
		runClients(b, func(client int) error {
			name := fmt.Sprintf("c-%d", client+1)
			var fence int64
			if err := pool.QueryRow(ctx, ceilingAcquireSQL, name, owner).Scan(&fence); err != nil {
				return err
			}
			tag, err := pool.Exec(ctx, ceilingReleaseSQL, name, owner, fence)
			if err == nil && tag.RowsAffected() != 1 {
				err = fmt.Errorf("ceiling release of %q changed %d rows", name, tag.RowsAffected())
			}
			return err
		})
	})
	b.Run("leasetable", func(b *testing.B) {
		runClients(b, func(client int) error {
			l, err := k.TryAcquire(ctx, fmt.Sprintf("l-%d", client), nil)
			if err != nil {
				return err
			}
			return l.Release(ctx)
		})
	})
}

// The ceiling table has pgfence_leases' shape and storage settings.
const ceilingTableSQL = `CREATE TABLE bench_ceiling (
    name        text        NOT NULL PRIMARY KEY,
    owner       text        NOT NULL,
    fence       bigint      NOT NULL DEFAULT 0,
    acquired_at timestamptz NOT NULL DEFAULT now(),
    expires_at  timestamptz NOT NULL
) WITH (fillfactor = 75, autovacuum_vacuum_scale_factor = 0.05, autovacuum_vacuum_threshold = 100)`

// ceilingAcquireSQL takes a free row: one single-row UPDATE.
const ceilingAcquireSQL = `UPDATE bench_ceiling
SET owner = $2, fence = fence + 1, acquired_at = now(), expires_at = now() + interval '30 seconds'
WHERE name = $1 AND expires_at <= now()
RETURNING fence`

// ceilingReleaseSQL expires the row in place, owner-checked: one single-row
// UPDATE.
const ceilingReleaseSQL = `UPDATE bench_ceiling SET expires_at = '-infinity'
WHERE name = $1 AND owner = $2 AND fence = $3`

// runClients runs b.N cycles spread over durableClients goroutines and
// reports cycles per second.
func runClients(b *testing.B, cycle func(client int) error) {
	var next atomic.Int64
	var wg sync.WaitGroup
	b.ResetTimer()
	for c := range durableClients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for next.Add(1) <= int64(b.N) {
				if err := cycle(c); err != nil {
					b.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	b.StopTimer()
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "cycles/s")
}
