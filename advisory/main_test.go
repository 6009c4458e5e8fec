package advisory_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence"
	"github.com/pgfence/pgfence/advisory"
	"github.com/pgfence/pgfence/internal/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// fastConfig checks sessions often, so loss tests finish quickly.
func fastConfig(appName string) *advisory.Config {
	return &advisory.Config{
		SessionCheckInterval: 100 * time.Millisecond,
		QueryTimeout:         2 * time.Second,
		ApplicationName:      appName,
	}
}

// newLocker returns a Locker on pool, closed when t ends.
func newLocker(t testing.TB, pool *pgxpool.Pool, cfg *advisory.Config) *advisory.Locker {
	t.Helper()
	k, err := advisory.New(context.Background(), pool, cfg)
	require.NoError(t, err)
	t.Cleanup(k.Close)
	return k
}

// heldAdvisoryLocks counts the advisory locks on keys (the bigint form,
// objsubid 1) granted in pool's database, held by any session. Interest
// locks (the two-int4 form, objsubid 2) are left out: a LISTEN connection
// releases them asynchronously, after the Acquire that needed them
// returned.
func heldAdvisoryLocks(t testing.TB, pool *pgxpool.Pool) int {
	t.Helper()
	var n int
	require.NoError(t, pool.QueryRow(context.Background(), `
		SELECT count(*) FROM pg_locks
		WHERE locktype = 'advisory' AND granted AND objsubid = 1
		  AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`).Scan(&n))
	return n
}

// holderPIDs returns the backend pids holding key in pool's database.
func holderPIDs(t testing.TB, pool *pgxpool.Pool, key advisory.Key) []int32 {
	t.Helper()
	k := uint64(key.Int64())
	rows, err := pool.Query(context.Background(), `
		SELECT pid FROM pg_locks
		WHERE locktype = 'advisory' AND granted AND objsubid = 1
		  AND classid = $1::bigint::oid AND objid = $2::bigint::oid
		  AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
		ORDER BY pid`, int64(k>>32), int64(k&0xffffffff))
	return collectPIDs(t, rows, err)
}

// collectPIDs reads the pid column of a query's rows.
func collectPIDs(t testing.TB, rows pgx.Rows, err error) []int32 {
	t.Helper()
	require.NoError(t, err)
	pids, err := pgx.CollectRows(rows, pgx.RowTo[int32])
	require.NoError(t, err)
	return pids
}

// sessionCount counts the backends on pool's database with application_name
// appName.
func sessionCount(t testing.TB, pool *pgxpool.Pool, appName string) int {
	t.Helper()
	var n int
	require.NoError(t, pool.QueryRow(context.Background(), `
		SELECT count(*) FROM pg_stat_activity
		WHERE datname = current_database() AND application_name = $1`, appName).Scan(&n))
	return n
}

// waitDone waits for a lock's Done, failing the test after a generous bound
// that only guards against hanging (it is not the property under test).
func waitDone(t testing.TB, lk pgfence.Lease) {
	t.Helper()
	select {
	case <-lk.Done():
	case <-time.After(30 * time.Second):
		t.Fatalf("lock %q: Done did not close", lk.Name())
	}
}

// exampleDatabase creates a migrated database for an Example and returns its
// URL and a function that drops it.
func exampleDatabase() (url string, drop func()) {
	db, drop := pgtest.ExampleDB()
	db.Pool.Close()
	return db.URL, drop
}
