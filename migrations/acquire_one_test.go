package migrations_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence/internal/pgtest"
)

// acquireRow is one row of pgfence_acquire's result.
type acquireRow struct {
	acquired bool
	owner    string
	token    int64
}

// querier is what acquireOne needs of a pool or a transaction.
type querier interface {
	Query(context.Context, string, ...any) (pgx.Rows, error)
}

// callAcquire calls pgfence_acquire for one name with the TTL ttl and
// returns its rows.
func callAcquire(ctx context.Context, q querier, name, owner string, ttl time.Duration) ([]acquireRow, error) {
	rows, err := q.Query(ctx, `SELECT acquired, owner, fence FROM pgfence.pgfence_acquire($1, $2, $3)`,
		[]string{name}, owner, []int64{ttl.Microseconds()})
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (acquireRow, error) {
		var a acquireRow
		err := r.Scan(&a.acquired, &a.owner, &a.token)
		return a, err
	})
}

// acquireOne is callAcquire with a one-minute TTL that fails t on an
// error.
func acquireOne(t *testing.T, ctx context.Context, q querier, name, owner string) []acquireRow {
	t.Helper()
	out, err := callAcquire(ctx, q, name, owner, time.Minute)
	require.NoError(t, err)
	return out
}

// TestMigration000007: taking over a freed lease draws exactly one token
// (000003's statement drew two, one of them for the row it tried to insert),
// a refusal draws none, and an acquire that waited for a concurrent taker's
// row lock reports that taker as the holder. Each is checked against an
// install stopped at version 6 as the negative control. Reverting 000007
// leaves exactly what 000006 left, and Up restores version 7.
func TestMigration000007(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	latest := dbAt(t, 11) // the last version whose functions take 000003's arguments
	at6 := dbAt(t, 6)

	lastToken := func(db *pgtest.DB) int64 {
		t.Helper()
		var v int64
		require.NoError(t, db.Pool.QueryRow(ctx, "SELECT last_value FROM pgfence.pgfence_leases_fence_seq").Scan(&v))
		return v
	}
	release := func(db *pgtest.DB, name, owner string, token int64) {
		t.Helper()
		var n int
		require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM pgfence.pgfence_release($1, $2, '{0}', $3)`,
			[]string{name}, []int64{token}, owner).Scan(&n))
		require.Equal(t, 1, n)
	}
	// takeOver acquires a new name (inserted), releases it and acquires it
	// again (the freed row taken over); it returns the tokens drawn by the
	// take-over. Then another owner's attempt on the held lease must draw
	// none and report the holder.
	takeOver := func(db *pgtest.DB) int64 {
		t.Helper()
		first := acquireOne(t, ctx, db.Pool, "a", "one")
		require.Equal(t, []acquireRow{{true, "one", first[0].token}}, first)
		release(db, "a", "one", first[0].token)
		before := lastToken(db)
		second := acquireOne(t, ctx, db.Pool, "a", "two")
		require.Len(t, second, 1)
		require.True(t, second[0].acquired)
		require.Equal(t, lastToken(db), second[0].token)
		var step int64 // 1024 from migration 000010, 1 before
		require.NoError(t, db.Pool.QueryRow(ctx, "SELECT seqincrement FROM pg_sequence WHERE seqrelid = 'pgfence.pgfence_leases_fence_seq'::regclass").Scan(&step))
		drawn := (second[0].token - before) / step

		held := lastToken(db)
		refused := acquireOne(t, ctx, db.Pool, "a", "three")
		require.Equal(t, []acquireRow{{false, "two", second[0].token}}, refused)
		require.Equal(t, held, lastToken(db), "a refused attempt drew a token")
		return drawn
	}
	require.EqualValues(t, 1, takeOver(latest))
	require.EqualValues(t, 2, takeOver(at6), "negative control: 000003's statement draws twice")

	// A taker that commits while another acquire waits for its row lock:
	// the waiting acquire reports the taker, with its token.
	waitedFor := func(db *pgtest.DB) acquireRow {
		t.Helper()
		first := acquireOne(t, ctx, db.Pool, "b", "one")
		release(db, "b", "one", first[0].token)
		taker, err := db.Pool.Begin(ctx)
		require.NoError(t, err)
		defer func() { _ = taker.Rollback(ctx) }()
		took := acquireOne(t, ctx, taker, "b", "taker")
		require.True(t, took[0].acquired)
		type result struct {
			rows []acquireRow
			err  error
		}
		got := make(chan result, 1)
		go func() {
			rows, err := callAcquire(ctx, db.Pool, "b", "late", time.Minute)
			got <- result{rows, err}
		}()
		// Commit once the late acquire waits for the row lock.
		require.Eventually(t, func() bool {
			var waiting bool
			err := db.Pool.QueryRow(ctx, `SELECT EXISTS (SELECT FROM pg_stat_activity
				WHERE datname = current_database() AND wait_event_type = 'Lock' AND query LIKE '%pgfence_acquire%')`).Scan(&waiting)
			return err == nil && waiting
		}, 10*time.Second, 5*time.Millisecond)
		require.NoError(t, taker.Commit(ctx))
		res := <-got
		require.NoError(t, res.err)
		rows := res.rows
		require.Len(t, rows, 1)
		require.False(t, rows[0].acquired)
		return acquireRow{rows[0].acquired, rows[0].owner, rows[0].token - took[0].token}
	}
	require.Equal(t, acquireRow{false, "taker", 0}, waitedFor(latest))
	// Negative control: 000003's statement reports the row as its snapshot
	// saw it, freed by "one", not the taker that holds it.
	require.Equal(t, "one", waitedFor(at6).owner)

	requireRevertsTo(t, pgtest.NewDB(t), 6)
}
