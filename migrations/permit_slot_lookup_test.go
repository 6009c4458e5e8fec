package migrations_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"
)

// TestPermitAcquireReadsSlotsByIndex: since migration 000007,
// pgfence_acquire_permit (both signatures) finds a semaphore's permit rows
// through the primary key whatever pgfence_leases' statistics say. The
// control is version 6, whose generic plan read the whole table into a
// hash once the statistics counted a few thousand rows: the same calls,
// the same table, sequential scans.
func TestPermitAcquireReadsSlotsByIndex(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	db := emptyDB(t)
	exec(t, db, "CREATE SCHEMA pgfence")
	m := cliMigrate(t, db, "postgres", "pgfence")
	require.NoError(t, m.Migrate(6))
	exec(t, db, `INSERT INTO pgfence.pgfence_leases (name, owner, fence, acquired_at, expires_at)
		SELECT 'bulk' || g, 'o', g, pg_catalog.now(), pg_catalog.now() + interval '1 hour' FROM pg_catalog.generate_series(1, 20000) g`,
		"ANALYZE pgfence.pgfence_leases")
	// seqScans runs calls in one transaction, rolled back, and returns the
	// sequential scans of pgfence_leases they made and whether each
	// acquired.
	seqScans := func(calls ...string) (scans int64, acquired []bool) {
		t.Helper()
		tx, err := db.Pool.Begin(ctx)
		require.NoError(t, err)
		defer func() { _ = tx.Rollback(ctx) }()
		// The view counts the backend's scans not yet reported, which may
		// include an earlier transaction's: the difference is this one's.
		scans = -seqScanned(t, tx)
		for _, c := range calls {
			var ok bool
			require.NoError(t, tx.QueryRow(ctx, c).Scan(&ok))
			acquired = append(acquired, ok)
		}
		scans += seqScanned(t, tx)
		return scans, acquired
	}
	calls := []string{
		`SELECT acquired FROM pgfence.pgfence_acquire_permit('s', 2, 'o', 60000000, false)`, // slot 0, inserted
		`SELECT acquired FROM pgfence.pgfence_acquire_permit('s', 2, 'o', 60000000)`,        // slot 1, by version 5's call
		`SELECT acquired FROM pgfence.pgfence_acquire_permit('s', 2, 'o', 60000000, true)`,  // both held: refused
	}
	scans, acquired := seqScans(calls...)
	require.Equal(t, []bool{true, true, false}, acquired)
	require.Positive(t, scans, "control: version 6 scans the table")

	require.NoError(t, m.Migrate(7))
	scans, acquired = seqScans(calls...)
	require.Equal(t, []bool{true, true, false}, acquired)
	require.Zero(t, scans, "version 7 reads permits by index")
	var version int
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT pgfence.pgfence_schema_version()`).Scan(&version))
	require.Equal(t, 7, version)

	// Down gives version 6's functions back: the control's scans return.
	require.NoError(t, m.Migrate(6))
	scans, _ = seqScans(calls...)
	require.Positive(t, scans)
}

// seqScanned returns the sequential scans of pgfence.pgfence_leases that
// tx's backend made and has not yet reported.
func seqScanned(t *testing.T, tx pgx.Tx) int64 {
	t.Helper()
	var n int64
	require.NoError(t, tx.QueryRow(testCtx(t),
		`SELECT coalesce(seq_scan, 0) FROM pg_catalog.pg_stat_xact_user_tables WHERE relid = 'pgfence.pgfence_leases'::pg_catalog.regclass`).Scan(&n))
	return n
}

// TestPermitQueuedBeforeCount: since migration 000007 a caller not in a
// semaphore's line is refused (queued) while a session holds the line key
// before it reads the count and takes the semaphore's lock: it answers even
// while a change of count holds that lock. The control is version 6, which
// waits for the lock. At both, a caller asking for another count than the
// recorded one still learns it, and once the line is empty a caller takes
// a permit.
func TestPermitQueuedBeforeCount(t *testing.T) {
	t.Parallel()
	for _, version := range []uint{6, 7} {
		t.Run(fmt.Sprint(version), func(t *testing.T) {
			t.Parallel()
			ctx := testCtx(t)
			db := emptyDB(t)
			exec(t, db, "CREATE SCHEMA pgfence")
			require.NoError(t, cliMigrate(t, db, "postgres", "pgfence").Migrate(version))
			type answer struct {
				acquired, queued bool
				permits          int
			}
			// call asks, as a caller not in the line, for a permit of n.
			call := func(q interface {
				QueryRow(context.Context, string, ...any) pgx.Row
			}, n int) (answer, error) {
				var a answer
				err := q.QueryRow(ctx,
					`SELECT acquired, queued, permits FROM pgfence.pgfence_acquire_permit('s', $1, 'o', 60000000, false)`, n).
					Scan(&a.acquired, &a.queued, &a.permits)
				return a, err
			}
			a, err := call(db.Pool, 2)
			require.NoError(t, err)
			require.Equal(t, answer{acquired: true, permits: 2}, a) // one of two held
			line, err := pgx.Connect(ctx, db.URL)
			require.NoError(t, err)
			defer func() { _ = line.Close(ctx) }()
			const lineKey = `hashtextextended('s' || chr(31) || chr(31), 7378831)`
			const semKey = `hashtextextended('s' || chr(31), 7378831)`
			_, err = line.Exec(ctx, `SELECT pg_advisory_lock(`+lineKey+`)`)
			require.NoError(t, err)
			a, err = call(db.Pool, 3)
			require.NoError(t, err)
			require.Equal(t, answer{permits: 2}, a, "another count is refused as such")
			_, err = line.Exec(ctx, `SELECT pg_advisory_lock(`+semKey+`)`) // as a change of count holds it
			require.NoError(t, err)
			// One call, bounded by the server: at version 6 it waits for
			// the lock until statement_timeout cancels it.
			tx, err := db.Pool.Begin(ctx)
			require.NoError(t, err)
			_, err = tx.Exec(ctx, `SET LOCAL statement_timeout = '2s'`)
			require.NoError(t, err)
			a, err = call(tx, 2)
			require.NoError(t, tx.Rollback(ctx))
			if version == 6 {
				var pgErr *pgconn.PgError
				require.ErrorAs(t, err, &pgErr, "control: version 6 waits for the semaphore's lock")
				require.Equal(t, pgerrcode.QueryCanceled, pgErr.Code)
			} else {
				require.NoError(t, err)
				require.Equal(t, answer{queued: true, permits: 2}, a, "a caller waits in the line")
			}
			_, err = line.Exec(ctx, `SELECT pg_advisory_unlock(`+semKey+`), pg_advisory_unlock(`+lineKey+`)`)
			require.NoError(t, err)
			a, err = call(db.Pool, 2)
			require.NoError(t, err)
			require.Equal(t, answer{acquired: true, permits: 2}, a, "the line is empty")
		})
	}
}
