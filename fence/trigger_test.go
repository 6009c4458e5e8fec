package fence_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence"
	"github.com/pgfence/pgfence/fence"
)

func TestTriggerRejectsRawUpdateWithOldToken(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	stale, cur := b.nextToken(t), b.nextToken(t)
	b.account(t, 1, 100, cur)

	_, err := fence.Check(b.pool.Exec(ctx,
		"UPDATE accounts SET balance = 0, fence_token = $1 WHERE id = $2", stale, 1))
	require.ErrorIs(t, err, pgfence.ErrFenced)
	var se *fence.StaleTokenError
	require.ErrorAs(t, err, &se)
	require.Equal(t, stale, se.Presented)
	require.Equal(t, cur, se.Current)
	var pgErr *pgconn.PgError
	require.ErrorAs(t, err, &pgErr)
	require.Equal(t, fence.SQLState, pgErr.Code)
	bal, _ := b.row(t, 1)
	require.Equal(t, int64(100), bal)

	_, err = fence.Check(b.pool.Exec(ctx, "UPDATE accounts SET fence_token = NULL WHERE id = 1"))
	require.ErrorIs(t, err, pgfence.ErrFenced, "NULL is not a token")

	_, err = fence.Check(b.pool.Exec(ctx,
		"UPDATE accounts SET balance = 1, fence_token = $1 WHERE id = $2", cur+1, 2))
	require.ErrorIs(t, err, pgx.ErrNoRows, "no such row")

	tag, err := fence.Check(b.pool.Exec(ctx,
		"UPDATE accounts SET balance = 1, fence_token = $1 WHERE id = $2", cur, 1))
	require.NoError(t, err)
	require.Equal(t, int64(1), tag.RowsAffected())
}

func TestTriggerRejectsRawDeleteWithOldToken(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	stale, cur := b.nextToken(t), b.nextToken(t)
	b.account(t, 1, 100, cur)

	const del = "WITH s AS (SELECT set_config('pgfence.token', $1::bigint::text, true)) " +
		"DELETE FROM accounts WHERE id = $2 AND EXISTS (SELECT FROM s)"
	tx, err := b.pool.Begin(ctx)
	require.NoError(t, err)
	t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
	_, err = tx.Exec(ctx, "SELECT set_config('pgfence.token', $1::bigint::text, true)", stale)
	require.NoError(t, err)
	_, err = fence.Check(tx.Exec(ctx, "DELETE FROM accounts WHERE id = 1"))
	require.ErrorIs(t, err, pgfence.ErrFenced)
	require.NoError(t, tx.Rollback(ctx))
	require.Equal(t, 1, countAccounts(t, b))

	_, err = fence.Check(b.pool.Exec(ctx, del, cur, 1))
	require.NoError(t, err)
	require.Equal(t, 0, countAccounts(t, b))
}

func TestTriggerAllowsUpdatesThatCarryNoToken(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.account(t, 1, 100, 5)
	// An UPDATE that leaves the column alone carries no token: the trigger
	// cannot tell who sent it and lets it through (documented).
	_, err := fence.Check(b.pool.Exec(context.Background(), "UPDATE accounts SET balance = 1 WHERE id = 1"))
	require.NoError(t, err)
}

func TestClassifyLeavesOtherErrorsAlone(t *testing.T) {
	t.Parallel()
	require.NoError(t, fence.Classify(nil))
	other := &pgconn.PgError{Code: "23505"}
	require.Same(t, other, fence.Classify(other).(*pgconn.PgError))
	se, ok := fence.Classify(&pgconn.PgError{Code: fence.SQLState, Detail: "garbled"}).(*fence.StaleTokenError)
	require.True(t, ok)
	require.Zero(t, se.Presented)
}
