package advisory

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence"
	"github.com/pgfence/pgfence/internal/pgtest"
)

// TestNotifyingUnlockKeepsTokensDurable: an unlock that notifies a waiter
// lets its transaction commit without waiting for the WAL flush, but when
// lock requests share that transaction (mixedBatch's pipeline), the token
// draw raises synchronous_commit to on again, so their tokens commit
// durably. The control is the same pipeline with no grant: its commit is
// asynchronous, which shows the check reads the setting the commit uses.
func TestNotifyingUnlockKeepsTokensDurable(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.NewDB(t)
	sql := newStatements(pgx.Identifier{pgfence.DefaultSchema}.Sanitize())
	const held, free = int64(7101), int64(7102)

	// A waiter's interest in held (as a LISTEN connection takes it).
	waiter, err := db.Pool.Acquire(ctx)
	require.NoError(t, err)
	defer waiter.Release()
	var took []int64
	rows, err := waiter.Query(ctx, takeInterestSQL, []int64{held})
	require.NoError(t, err)
	took, err = pgx.CollectRows(rows, pgx.RowTo[int64])
	require.NoError(t, err)
	require.Equal(t, []int64{held}, took)
	defer func() { _, _ = waiter.Exec(ctx, dropInterestSQL, []int64{held}) }()

	for _, tc := range []struct {
		name  string
		grant bool
		want  string // synchronous_commit at the end of the transaction
	}{{"with a grant", true, "on"}, {"control: unlock alone", false, "off"}} {
		t.Run(tc.name, func(t *testing.T) {
			conn, err := db.Pool.Acquire(ctx)
			require.NoError(t, err)
			defer conn.Release()
			_, err = conn.Exec(ctx, `SELECT pg_catalog.pg_advisory_lock($1)`, held)
			require.NoError(t, err)
			b := &pgx.Batch{}
			b.Queue(unlockBatchSQL, []int64{held}, []bool{false}, []bool{true})
			if tc.grant {
				b.Queue(sql.tryLockBatch, []int64{free}, []bool{false})
			}
			b.Queue(`SELECT pg_catalog.current_setting('synchronous_commit')`)
			br := conn.SendBatch(ctx, b)
			var pos int64
			var ok bool
			var pid int32
			require.NoError(t, br.QueryRow().Scan(&pos, &ok, &pid))
			require.True(t, ok, "the unlock succeeded")
			if tc.grant {
				var token *int64
				require.NoError(t, br.QueryRow().Scan(&pos, &token, &pid))
				require.NotNil(t, token, "the lock was granted")
			}
			var setting string
			require.NoError(t, br.QueryRow().Scan(&setting))
			require.NoError(t, br.Close())
			require.Equal(t, tc.want, setting)
			_, err = conn.Exec(ctx, `SELECT pg_catalog.pg_advisory_unlock_all()`)
			require.NoError(t, err)
		})
	}
}
