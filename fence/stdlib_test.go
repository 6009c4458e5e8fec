package fence_test

import (
	"context"
	"database/sql"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence"
	"github.com/pgfence/pgfence/fence"
	"github.com/pgfence/pgfence/leasetable"
)

// The builders on *sql.DB, *sql.Conn and *sql.Tx through pgx's
// database/sql driver: the same outcomes as on pgx.
func TestStdlib(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	db, err := sql.Open("pgx", b.db.URL)
	require.NoError(t, err)
	t.Cleanup(func() { _ = db.Close() })
	conn, err := db.Conn(ctx)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	tx, err := db.BeginTx(ctx, nil)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback() }()

	tok, newer := b.nextToken(t), b.nextToken(t)
	for id, q := range map[int]fence.StdlibQuerier{1: db, 2: conn, 3: tx} {
		if id == 3 {
			_, err := tx.ExecContext(ctx, "INSERT INTO accounts (id, balance) VALUES (3, 0)")
			require.NoError(t, err)
		} else {
			b.account(t, id, 0, 0)
		}
		d := fence.Stdlib(q)
		tag, err := addBalance.Exec(ctx, d, tok, 5, id)
		require.NoError(t, err, "id %d", id)
		require.Equal(t, int64(1), tag.RowsAffected())

		var balance int64
		require.NoError(t, claimAccount.QueryRow(ctx, d, tok, id).Scan(&balance))
		require.Equal(t, int64(5), balance)

		_, err = addBalance.Exec(ctx, d, newer, 1, id)
		require.NoError(t, err)
		_, err = addBalance.Exec(ctx, d, tok, 1, id)
		var stale *fence.StaleTokenError
		require.ErrorAs(t, err, &stale, "id %d", id)
		require.Equal(t, newer, stale.Current)
		err = claimAccount.QueryRow(ctx, d, tok, 99).Scan(&balance)
		require.ErrorIs(t, err, pgx.ErrNoRows)
		_, err = fence.Claim("accounts").Where("id = ANY($1)").Exec(ctx, d, newer, []int32{int32(id), 99})
		require.NoError(t, err, "several rows (here one of two ids): the full statement")

		_, err = fence.CheckResult(q.ExecContext(ctx, "UPDATE accounts SET fence_token = $1 WHERE id = $2", tok, id))
		require.ErrorAs(t, err, &stale, "the trigger's rejection, through database/sql")
		if id == 3 {
			break // tx is aborted now
		}
		_, err = fence.CheckResult(q.ExecContext(ctx, "UPDATE accounts SET fence_token = $1 WHERE id = 99", newer))
		require.ErrorIs(t, err, pgx.ErrNoRows)
		require.ErrorIs(t, err, sql.ErrNoRows)
	}
}

// The one-pool route for a service that uses database/sql: the lockers
// take the *pgxpool.Pool, and stdlib.OpenDBFromPool gives the *sql.DB on
// the same pool, so the service opens one pool, not two.
func TestStdlibOnePool(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	pool := b.db.NewPool(t, func(c *pgxpool.Config) { c.MaxConns = 4 })
	db := stdlib.OpenDBFromPool(pool)
	t.Cleanup(func() { _ = db.Close() })
	locker, err := leasetable.New(ctx, pool, &leasetable.Config{Schema: b.schema, TTL: time.Minute})
	require.NoError(t, err)
	t.Cleanup(locker.Close)
	b.account(t, 1, 0, 0)

	lease, err := locker.TryAcquire(ctx, "ledger", nil)
	require.NoError(t, err)
	tx, err := db.BeginTx(ctx, nil)
	require.NoError(t, err)
	var balance int64
	secret := lease.(*leasetable.Lease).Secret()
	stmt := claimAccount.UnderLease("ledger", secret).LeaseSchema(b.schema)
	require.NoError(t, stmt.QueryRow(ctx, fence.Stdlib(tx), lease.Token(), 1).Scan(&balance))
	_, err = addBalance.UnderLease("ledger", secret).LeaseSchema(b.schema).Exec(ctx, fence.Stdlib(tx), lease.Token(), 7, 1)
	require.NoError(t, err)
	require.NoError(t, tx.Commit())
	require.NoError(t, lease.Release(ctx))

	got, _ := b.row(t, 1)
	require.Equal(t, int64(7), got)
	require.LessOrEqual(t, pool.Stat().TotalConns(), int32(4), "one pool serves the Locker and database/sql")

	// After the release, the lease check rejects the old token.
	_, err = addBalance.UnderLease("ledger", secret).LeaseSchema(b.schema).Exec(ctx, fence.Stdlib(db), lease.Token(), 7, 1)
	require.ErrorIs(t, err, pgfence.ErrLeaseLost)
}
