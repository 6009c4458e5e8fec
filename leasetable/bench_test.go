package leasetable_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/leasetable"
)

// BenchmarkTryAcquireRelease measures uncontended acquire+release cycles of
// one name, one at a time: two round trips per cycle, the acquire's commit
// waiting for a WAL flush.
func BenchmarkTryAcquireRelease(b *testing.B) {
	ctx := context.Background()
	db := pgtest.NewDB(b)
	k, err := leasetable.New(db.Pool, nil)
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
	k, err := leasetable.New(db.Pool, nil)
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
