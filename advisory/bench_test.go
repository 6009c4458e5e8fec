package advisory_test

import (
	"context"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence/advisory"
	"github.com/pgfence/pgfence/internal/pgtest"
)

// BenchmarkLockerTryLockUnlock measures a TryLock + Unlock cycle through a
// Locker: two round trips, the first also drawing a durable fencing token.
func BenchmarkLockerTryLockUnlock(b *testing.B) {
	ctx := context.Background()
	db := pgtest.NewDB(b)
	l := newLocker(b, db.Pool, nil)
	key := advisory.ID(1)
	for b.Loop() {
		lk, err := l.TryLock(ctx, key, nil)
		require.NoError(b, err)
		require.NoError(b, lk.Unlock(ctx))
	}
}

// BenchmarkLockerTryLockUnlockParallel runs cycles on distinct keys from
// many goroutines, which the Locker spreads over its sessions.
func BenchmarkLockerTryLockUnlockParallel(b *testing.B) {
	ctx := context.Background()
	db := pgtest.NewDB(b)
	l := newLocker(b, db.Pool, nil)
	var next atomic.Int64
	b.RunParallel(func(pb *testing.PB) {
		key := advisory.ID(next.Add(1))
		for pb.Next() {
			lk, err := l.TryLock(ctx, key, nil)
			require.NoError(b, err)
			require.NoError(b, lk.Unlock(ctx))
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
			"SELECT CASE WHEN pg_try_advisory_lock($1) THEN pgfence_next_token() END", int64(1)).Scan(&token))
		require.NotNil(b, token)
		var ok bool
		require.NoError(b, conn.QueryRow(ctx, "SELECT pg_advisory_unlock($1)", int64(1)).Scan(&ok))
		require.True(b, ok)
	}
}

// BenchmarkTryLockHeldInThisLocker measures TryLock's refusal of a key held
// by another caller of the same Locker, which costs no round trip: what a
// caller spinning on a busy key pays per attempt.
func BenchmarkTryLockHeldInThisLocker(b *testing.B) {
	ctx := context.Background()
	db := pgtest.NewDB(b)
	l := newLocker(b, db.Pool, nil)
	key := advisory.Name("busy")
	lk, err := l.TryLock(ctx, key, nil)
	require.NoError(b, err)
	b.Cleanup(func() { require.NoError(b, lk.Unlock(ctx)) })
	for b.Loop() {
		if _, err := l.TryLock(ctx, key, nil); err == nil {
			b.Fatal("TryLock of a held key succeeded")
		}
	}
}
