package pgfence_test

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence"
	"github.com/pgfence/pgfence/advisory"
	"github.com/pgfence/pgfence/fence"
	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/leasetable"
)

// The end-to-end tests in this package run against PostgreSQL in Docker
// (testcontainers) when a Docker engine is available, as a user's CI would,
// and against the harness's throwaway cluster otherwise.
//
// The examples find their database in DATABASE_URL, as a user's program
// would: TestMain gives them one of their own.
func TestMain(m *testing.M) {
	db, drop := pgtest.ExampleDB()
	if err := os.Setenv("DATABASE_URL", db.URL); err != nil {
		panic(err)
	}
	pgtest.MainWithOptions(m, pgtest.Options{PreferDocker: true, AfterRun: drop})
}

// TestStaleHolderIsFencedEndToEnd tells pgfence's story through the public
// API only: apply the migrations, protect a table, take a lease, lose it
// while "paused", and watch the protected row reject the stale holder's
// writes — through the fence builder, through a lease-checked write, and
// through the trigger for raw SQL — while the new holder's write lands.
func TestStaleHolderIsFencedEndToEnd(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.NewDB(t)

	_, err := db.Pool.Exec(ctx, `
		CREATE TABLE accounts (
			id          int PRIMARY KEY,
			balance     bigint NOT NULL,
			fence_token bigint NOT NULL DEFAULT 0);
		CREATE TRIGGER accounts_fence BEFORE UPDATE OR DELETE ON accounts
			FOR EACH ROW EXECUTE FUNCTION pgfence.pgfence_guard('fence_token');
		INSERT INTO accounts (id, balance) VALUES (42, 100)`)
	require.NoError(t, err)

	// Two services, each with its own pool and Locker.
	lockerA, err := leasetable.New(ctx, db.NewPool(t, nil), &leasetable.Config{TTL: 5 * time.Second})
	require.NoError(t, err)
	defer lockerA.Close()
	lockerB, err := leasetable.New(ctx, db.NewPool(t, nil), &leasetable.Config{TTL: 5 * time.Second})
	require.NoError(t, err)
	defer lockerB.Close()

	leaseA, err := lockerA.TryAcquire(ctx, "account:42", nil)
	require.NoError(t, err)
	_, err = lockerB.TryAcquire(ctx, "account:42", nil)
	require.ErrorIs(t, err, pgfence.ErrNotAcquired)

	deposit := fence.Update("accounts").Set("balance = balance + $1").Where("id = $2")
	_, err = deposit.Exec(ctx, db.Pool, leaseA.Token(), 10, 42)
	require.NoError(t, err, "the holder writes")

	// A is paused past its lease: the database lets the lease expire (here
	// the expiry is forced, as the clock would do it), and B takes over.
	_, err = db.Pool.Exec(ctx, "UPDATE pgfence.pgfence_leases SET expires_at = now() WHERE name = 'account:42'")
	require.NoError(t, err)
	leaseB, err := lockerB.TryAcquire(ctx, "account:42", nil)
	require.NoError(t, err)
	require.Greater(t, leaseB.Token(), leaseA.Token())
	_, err = deposit.Exec(ctx, db.Pool, leaseB.Token(), 50, 42)
	require.NoError(t, err, "the new holder writes")

	// A resumes, still believing it holds the lease. Every write is rejected.
	_, err = deposit.Exec(ctx, db.Pool, leaseA.Token(), 1000, 42)
	require.ErrorIs(t, err, pgfence.ErrFenced)
	var stale *fence.StaleTokenError
	require.ErrorAs(t, err, &stale)
	require.Equal(t, leaseA.Token(), stale.Presented)
	require.Equal(t, leaseB.Token(), stale.Current)

	_, err = deposit.UnderLease("account:42", leaseA.(*leasetable.Lease).Secret()).Exec(ctx, db.Pool, leaseA.Token(), 1000, 42)
	require.ErrorIs(t, err, pgfence.ErrLeaseLost, "a lease-checked write sees the lease is gone")

	_, err = db.Pool.Exec(ctx, "UPDATE accounts SET balance = 0, fence_token = $1 WHERE id = 42", leaseA.Token())
	var pgErr *pgconn.PgError
	require.ErrorAs(t, err, &pgErr, "the trigger rejects a raw write carrying the old token")
	require.Equal(t, fence.SQLState, pgErr.Code)
	require.ErrorIs(t, fence.Classify(err), pgfence.ErrFenced)

	var balance, token int64
	require.NoError(t, db.Pool.QueryRow(ctx, "SELECT balance, fence_token FROM accounts WHERE id = 42").Scan(&balance, &token))
	require.Equal(t, int64(160), balance, "100 + A's 10 + B's 50; nothing of A's after it lost the lease")
	require.Equal(t, leaseB.Token(), token)

	// A's watchdog finds out too: its renewal no longer matches.
	select {
	case <-leaseA.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the stale holder was never told it lost the lease")
	}
	require.ErrorIs(t, leaseA.Err(), pgfence.ErrLeaseLost)
	require.ErrorIs(t, leaseA.Release(ctx), pgfence.ErrNotHeld)
	require.NoError(t, leaseB.Release(ctx))
}

// TestAdvisoryTokensFenceTheSameRows shows that both strategies draw from
// one sequence: a row written under an advisory lock rejects an earlier
// lease holder, and the other way round.
func TestAdvisoryTokensFenceTheSameRows(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.NewDB(t)
	_, err := db.Pool.Exec(ctx, `CREATE TABLE jobs (id int PRIMARY KEY, state text NOT NULL, fence_token bigint NOT NULL DEFAULT 0);
		INSERT INTO jobs (id, state) VALUES (1, 'new')`)
	require.NoError(t, err)

	leases, err := leasetable.New(ctx, db.Pool, nil)
	require.NoError(t, err)
	defer leases.Close()
	locks, err := advisory.New(ctx, db.Pool, nil)
	require.NoError(t, err)
	defer locks.Close()

	lease, err := leases.TryAcquire(ctx, "job:1", nil)
	require.NoError(t, err)
	require.NoError(t, lease.Release(ctx))

	// A transaction-scoped advisory lock, then a session one.
	tx, err := db.Pool.Begin(ctx)
	require.NoError(t, err)
	txToken, err := locks.TryAcquireTx(ctx, tx, advisory.Name("job:1"), nil)
	require.NoError(t, err)
	require.Greater(t, txToken, lease.Token())
	setState := fence.Update("jobs").Set("state = $1").Where("id = $2")
	_, err = setState.Exec(ctx, tx, txToken, "running", 1)
	require.NoError(t, err)
	require.NoError(t, tx.Commit(ctx))

	lk, err := locks.TryAcquire(ctx, "job:1", nil)
	require.NoError(t, err)
	require.Greater(t, lk.Token(), txToken)
	_, err = setState.Exec(ctx, db.Pool, lk.Token(), "done", 1)
	require.NoError(t, err)
	require.NoError(t, lk.Release(ctx))

	for _, old := range []int64{lease.Token(), txToken} {
		_, err = setState.Exec(ctx, db.Pool, old, "clobbered", 1)
		require.ErrorIs(t, err, pgfence.ErrFenced)
	}
	var state string
	require.NoError(t, db.Pool.QueryRow(ctx, "SELECT state FROM jobs WHERE id = 1").Scan(&state))
	require.Equal(t, "done", state)
}
