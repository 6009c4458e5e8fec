package advisory_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence"
	"github.com/pgfence/pgfence/advisory"
	"github.com/pgfence/pgfence/internal/pgtest"
)

func begin(t *testing.T, db *pgtest.DB) pgx.Tx {
	t.Helper()
	tx, err := db.Pool.Begin(context.Background())
	require.NoError(t, err)
	t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
	return tx
}

func TestTryAcquireTx(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.NewDB(t)
	l := newLocker(t, db.Pool, nil)
	key := advisory.Name("account:42")

	for _, end := range []string{"commit", "rollback"} {
		tx1, tx2 := begin(t, db), begin(t, db)
		tok1, err := l.TryAcquireTx(ctx, tx1, key, nil)
		require.NoError(t, err)
		_, err = l.TryAcquireTx(ctx, tx2, key, nil)
		require.ErrorIs(t, err, pgfence.ErrNotAcquired)
		_, err = l.TryAcquireKey(ctx, key, nil)
		require.ErrorIs(t, err, pgfence.ErrNotAcquired, "xact and session locks share the key space")
		require.Equal(t, 1, heldAdvisoryLocks(t, db.Pool))

		if end == "commit" {
			require.NoError(t, tx1.Commit(ctx))
		} else {
			require.NoError(t, tx1.Rollback(ctx))
		}
		require.Equal(t, 0, heldAdvisoryLocks(t, db.Pool), "released at %s", end)
		tok2, err := l.TryAcquireTx(ctx, tx2, key, nil)
		require.NoError(t, err)
		require.Greater(t, tok2, tok1)
		require.NoError(t, tx2.Rollback(ctx))
	}

	// Shared xact locks.
	tx1, tx2 := begin(t, db), begin(t, db)
	shared := &advisory.AcquireOpts{Shared: true}
	_, err := l.TryAcquireTx(ctx, tx1, key, shared)
	require.NoError(t, err)
	_, err = l.TryAcquireTx(ctx, tx2, key, shared)
	require.NoError(t, err)
	_, err = l.TryAcquireKey(ctx, key, nil)
	require.ErrorIs(t, err, pgfence.ErrNotAcquired)
	lk, err := l.TryAcquireKey(ctx, key, shared)
	require.NoError(t, err)
	require.NoError(t, lk.Release(ctx))
}

func TestAcquireTx(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.NewDB(t)
	l := newLocker(t, db.Pool, nil)
	key := advisory.ID(4242)

	tx1 := begin(t, db)
	tok1, err := l.AcquireTx(ctx, tx1, key, nil)
	require.NoError(t, err)

	// WaitTimeout: not acquired, and tx2 is still usable with its
	// lock_timeout as before.
	tx2 := begin(t, db)
	_, err = tx2.Exec(ctx, "SET LOCAL lock_timeout = '7s'")
	require.NoError(t, err)
	_, err = l.AcquireTx(ctx, tx2, key, &advisory.AcquireOpts{WaitTimeout: 50 * time.Millisecond})
	require.ErrorIs(t, err, pgfence.ErrNotAcquired)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	var lockTimeout string
	require.NoError(t, tx2.QueryRow(ctx, "SHOW lock_timeout").Scan(&lockTimeout))
	require.Equal(t, "7s", lockTimeout)

	// A waiting AcquireTx gets the lock when tx1 commits.
	var tok2 int64
	var lockErr error
	got := make(chan struct{})
	go func() {
		defer close(got)
		tok2, lockErr = l.AcquireTx(ctx, tx2, key, nil)
	}()
	require.NoError(t, tx1.Commit(ctx))
	<-got
	require.NoError(t, lockErr)
	require.Greater(t, tok2, tok1)
	require.Equal(t, 1, heldAdvisoryLocks(t, db.Pool))

	// With WaitTimeout, granted: the savepoint is released into tx2, and
	// lock_timeout is back.
	tok3, err := l.AcquireTx(ctx, tx2, advisory.ID(4243), &advisory.AcquireOpts{WaitTimeout: time.Second, Shared: true})
	require.NoError(t, err)
	require.Greater(t, tok3, tok2)
	require.NoError(t, tx2.QueryRow(ctx, "SHOW lock_timeout").Scan(&lockTimeout))
	require.Equal(t, "7s", lockTimeout)
	require.Equal(t, 2, heldAdvisoryLocks(t, db.Pool))
	require.NoError(t, tx2.Rollback(ctx))
	require.Zero(t, heldAdvisoryLocks(t, db.Pool))
}
