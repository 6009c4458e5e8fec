package advisory_test

import (
	"context"
	"database/sql"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence"
	"github.com/pgfence/pgfence/advisory"
	"github.com/pgfence/pgfence/internal/pgtest"
)

// The transaction-level locks on database/sql transactions, on the one
// pool a service shares between the Locker and database/sql
// (stdlib.OpenDBFromPool), and on a *sql.DB of its own (sql.Open).
func TestSQLTx(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.NewDB(t)
	pool := db.NewPool(t, func(c *pgxpool.Config) { c.MaxConns = 4 })
	l := newLocker(t, pool, nil)
	shared := stdlib.OpenDBFromPool(pool)
	t.Cleanup(func() { _ = shared.Close() })
	own, err := sql.Open("pgx", db.URL)
	require.NoError(t, err)
	t.Cleanup(func() { _ = own.Close() })
	key := advisory.Name("account:7")

	for name, sdb := range map[string]*sql.DB{"OpenDBFromPool": shared, "sql.Open": own} {
		begin := func() *sql.Tx {
			tx, err := sdb.BeginTx(ctx, nil)
			require.NoError(t, err)
			t.Cleanup(func() { _ = tx.Rollback() })
			return tx
		}
		tx1, tx2 := begin(), begin()
		tok1, err := l.TryAcquireSQLTx(ctx, tx1, key, nil)
		require.NoError(t, err, name)
		_, err = l.TryAcquireSQLTx(ctx, tx2, key, nil)
		require.ErrorIs(t, err, pgfence.ErrNotAcquired, name)

		// WaitTimeout: not acquired, tx2 still usable, lock_timeout as before.
		_, err = tx2.ExecContext(ctx, "SET LOCAL lock_timeout = '7s'")
		require.NoError(t, err)
		_, err = l.AcquireSQLTx(ctx, tx2, key, &advisory.AcquireOpts{WaitTimeout: 50 * time.Millisecond})
		require.ErrorIs(t, err, pgfence.ErrNotAcquired, name)
		require.ErrorIs(t, err, context.DeadlineExceeded, name)
		var lockTimeout string
		require.NoError(t, tx2.QueryRowContext(ctx, "SHOW lock_timeout").Scan(&lockTimeout))
		require.Equal(t, "7s", lockTimeout)

		// A waiting AcquireSQLTx gets the lock when tx1 commits.
		got := make(chan struct{})
		var tok2 int64
		var lockErr error
		go func() {
			defer close(got)
			tok2, lockErr = l.AcquireSQLTx(ctx, tx2, key, &advisory.AcquireOpts{WaitTimeout: time.Minute})
		}()
		require.NoError(t, tx1.Commit())
		<-got
		require.NoError(t, lockErr, name)
		require.Greater(t, tok2, tok1)
		require.Equal(t, 1, heldAdvisoryLocks(t, db.Pool))
		require.NoError(t, tx2.QueryRowContext(ctx, "SHOW lock_timeout").Scan(&lockTimeout))
		require.Equal(t, "7s", lockTimeout)
		require.NoError(t, tx2.Rollback())
		require.Zero(t, heldAdvisoryLocks(t, db.Pool), name)
	}
	require.LessOrEqual(t, pool.Stat().TotalConns(), int32(4))
	_, err = l.TryAcquireSQLTx(ctx, nil, key, nil)
	require.Error(t, err)
}
