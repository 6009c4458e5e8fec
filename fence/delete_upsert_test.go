package fence_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence"
	"github.com/pgfence/pgfence/fence"
)

var deleteAccount = fence.Delete("accounts").Where("id = $1")

func countAccounts(t *testing.T, b *testBundle) int {
	t.Helper()
	var n int
	require.NoError(t, b.pool.QueryRow(context.Background(), "SELECT count(*) FROM accounts").Scan(&n))
	return n
}

func TestDelete(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	stale, cur, newer := b.nextToken(t), b.nextToken(t), b.nextToken(t)
	b.account(t, 1, 100, cur)

	_, err := deleteAccount.Exec(ctx, b.pool, stale, 1)
	var se *fence.StaleTokenError
	require.ErrorAs(t, err, &se)
	require.Equal(t, cur, se.Current)
	require.Equal(t, 1, countAccounts(t, b))

	_, err = deleteAccount.Strict().Exec(ctx, b.pool, cur, 1)
	require.ErrorIs(t, err, pgfence.ErrFenced)
	require.Equal(t, 1, countAccounts(t, b))

	tag, err := deleteAccount.Exec(ctx, b.pool, newer, 1)
	require.NoError(t, err)
	require.Equal(t, "DELETE 1", tag.String())
	require.Equal(t, 0, countAccounts(t, b))

	_, err = deleteAccount.Exec(ctx, b.pool, newer, 1)
	require.ErrorIs(t, err, pgx.ErrNoRows)
}

func TestDeleteUnderLease(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	b.account(t, 1, 100, 0)
	tokA, secA := b.acquireLease(t, "ledger", "A")
	b.acquireLease(t, "ledger", "B")
	_, err := deleteAccount.LeaseSchema(b.schema).UnderLease("ledger", secA).Exec(ctx, b.pool, tokA, 1)
	require.ErrorIs(t, err, pgfence.ErrLeaseLost)
	require.Equal(t, 1, countAccounts(t, b))
}

func TestDeleteSetsTokenForTheTrigger(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	older, newer := b.nextToken(t), b.nextToken(t)
	b.account(t, 1, 100, older)
	b.account(t, 2, 100, newer)

	tx, err := b.pool.Begin(ctx)
	require.NoError(t, err)
	t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
	_, err = deleteAccount.Exec(ctx, tx, older, 1)
	require.NoError(t, err)
	// The rest of the transaction carries the token: a raw DELETE of a
	// row written by a newer holder is rejected by the trigger.
	_, err = fence.Check(tx.Exec(ctx, "DELETE FROM accounts WHERE id = 2"))
	var se *fence.StaleTokenError
	require.ErrorAs(t, err, &se)
	require.Equal(t, older, se.Presented)
	require.Equal(t, newer, se.Current)
}

var upsertAccount = fence.Upsert("accounts").Columns("id", "balance").Values("$1", "$2").OnConflict("id")

func TestUpsert(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	t1, t2, t3 := b.nextToken(t), b.nextToken(t), b.nextToken(t)

	tag, err := upsertAccount.Exec(ctx, b.pool, t2, 1, 100)
	require.NoError(t, err)
	require.Equal(t, "INSERT 0 1", tag.String())
	bal, tok := b.row(t, 1)
	require.Equal(t, int64(100), bal)
	require.Equal(t, t2, tok)

	_, err = upsertAccount.Exec(ctx, b.pool, t1, 1, 999)
	var se *fence.StaleTokenError
	require.ErrorAs(t, err, &se)
	require.Equal(t, t1, se.Presented)
	require.Equal(t, t2, se.Current)
	bal, _ = b.row(t, 1)
	require.Equal(t, int64(100), bal)

	_, err = upsertAccount.Exec(ctx, b.pool, t2, 1, 200)
	require.NoError(t, err, "the same holder may write again")
	_, err = upsertAccount.Strict().Exec(ctx, b.pool, t2, 1, 300)
	require.ErrorIs(t, err, pgfence.ErrFenced)

	add := upsertAccount.Set("balance = accounts.balance + excluded.balance")
	_, err = add.Exec(ctx, b.pool, t3, 1, 5)
	require.NoError(t, err)
	bal, tok = b.row(t, 1)
	require.Equal(t, int64(205), bal)
	require.Equal(t, t3, tok)
}

func TestUpsertUnderLease(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	tokA, secA := b.acquireLease(t, "ledger", "A")
	_, err := upsertAccount.LeaseSchema(b.schema).UnderLease("ledger", secA).Exec(ctx, b.pool, tokA, 1, 100)
	require.NoError(t, err)
	tokB, secB := b.acquireLease(t, "ledger", "B")
	_, err = upsertAccount.LeaseSchema(b.schema).UnderLease("ledger", secA).Exec(ctx, b.pool, tokA, 2, 100)
	require.ErrorIs(t, err, pgfence.ErrLeaseLost)
	require.Equal(t, 1, countAccounts(t, b), "nothing inserted")
	_, err = upsertAccount.LeaseSchema(b.schema).UnderLease("ledger", secB).Exec(ctx, b.pool, tokB, 1, 7)
	require.NoError(t, err)
	bal, tok := b.row(t, 1)
	require.Equal(t, int64(7), bal, "the new holder's upsert updated the row")
	require.Equal(t, tokB, tok)
}

func TestUpsertConcurrentInsertWhileWaiting(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	a, newer := b.nextToken(t), b.nextToken(t)

	tx, err := b.pool.Begin(ctx)
	require.NoError(t, err)
	t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
	_, err = upsertAccount.Exec(ctx, tx, newer, 1, 500)
	require.NoError(t, err)

	stmt := fence.Upsert("accounts").Columns("id", "balance").Values("$1::int + 0 * length('upsert_a')", "$2").OnConflict("id")
	err = blockedBehind(t, b, "upsert_a",
		func() error { _, err := stmt.Exec(ctx, b.pool, a, 1, 1); return err },
		func() error { return tx.Commit(ctx) })
	var se *fence.StaleTokenError
	require.ErrorAs(t, err, &se)
	require.Equal(t, a, se.Presented)
	bal, tok := b.row(t, 1)
	require.Equal(t, int64(500), bal)
	require.Equal(t, newer, tok)
}
