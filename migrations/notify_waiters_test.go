package migrations_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence/internal/notifier"
	"github.com/pgfence/pgfence/internal/pgtest"
)

// leaseInterestClass is the first half of a lease name's interest key (the
// bytes "pgfl"), as leasetable.InterestClassID.
const leaseInterestClass = 1885824620

// holdInterest opens a session of db that holds the interest key of each
// name shared, as a waiting Locker's LISTEN connection does.
func holdInterest(t *testing.T, db *pgtest.DB, names ...string) *pgx.Conn {
	t.Helper()
	ctx := testCtx(t)
	key, err := notifier.LoadKey(ctx, db.Pool, "pgfence")
	require.NoError(t, err)
	conn, err := pgx.Connect(ctx, db.URL)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	for _, n := range names {
		var ok bool
		require.NoError(t, conn.QueryRow(ctx, "SELECT pg_try_advisory_lock_shared($1, $2)", leaseInterestClass, key.InterestID(n)).Scan(&ok))
		require.True(t, ok)
	}
	return conn
}

// endInterest closes a session of holdInterest and waits until its backend
// is gone, with the locks it held: the server ends a session after its
// client closed it, not at once.
func endInterest(t *testing.T, db *pgtest.DB, conn *pgx.Conn) {
	t.Helper()
	ctx := testCtx(t)
	pid := conn.PgConn().PID()
	require.NoError(t, conn.Close(ctx))
	require.Eventually(t, func() bool {
		var gone bool
		require.NoError(t, db.Pool.QueryRow(ctx,
			`SELECT NOT EXISTS (SELECT FROM pg_catalog.pg_locks WHERE pid = $1)`, pid).Scan(&gone))
		return gone
	}, 30*time.Second, 5*time.Millisecond, "the interest session's backend ended")
}

// notifyWatch LISTENs on pgfence_lease_released in a session of db.
type notifyWatch struct {
	t      *testing.T
	db     *pgtest.DB
	conn   *pgx.Conn
	key    notifier.Key
	marker int
}

func newNotifyWatch(t *testing.T, db *pgtest.DB) *notifyWatch {
	t.Helper()
	ctx := testCtx(t)
	conn, err := pgx.Connect(ctx, db.URL)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	_, err = conn.Exec(ctx, "LISTEN pgfence_lease_released")
	require.NoError(t, err)
	key, err := notifier.LoadKey(ctx, db.Pool, "pgfence")
	require.NoError(t, err)
	return &notifyWatch{t: t, db: db, conn: conn, key: key}
}

// since returns the names (among names) announced since the last call, up
// to a marker notification the watch sends itself: notifications arrive in
// commit order, so nothing here waits on a timeout.
func (w *notifyWatch) since(names ...string) []string {
	w.t.Helper()
	ctx := testCtx(w.t)
	w.marker++
	want := fmt.Sprintf("marker-%d", w.marker)
	_, err := w.db.Pool.Exec(ctx, `SELECT pg_notify('pgfence_lease_released', $1)`, want)
	require.NoError(w.t, err)
	got := []string{}
	for {
		n, err := w.conn.WaitForNotification(ctx)
		require.NoError(w.t, err)
		if n.Payload == want {
			return got
		}
		tag, _, ok := w.key.Verify(n.Payload)
		require.True(w.t, ok, "payload %q", n.Payload)
		which := "unknown"
		for _, name := range names {
			if w.key.Tag(name) == tag {
				which = name
			}
		}
		got = append(got, which)
	}
}

// release releases the named leases, each acquired for the test, in one
// pgfence_release call.
func releaseAll(t *testing.T, db *pgtest.DB, names ...string) {
	t.Helper()
	ctx := testCtx(t)
	var tokens []int64
	var secrets, zero = []string{}, []int64{}
	for _, n := range names {
		rows := acquireOne(t, ctx, db.Pool, n, "o")
		require.True(t, rows[0].acquired)
		tokens, secrets, zero = append(tokens, rows[0].token), append(secrets, rows[0].secret), append(zero, 0)
	}
	var released int
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM pgfence.pgfence_release($1, $2, $3, $4)`,
		names, tokens, secrets, zero).Scan(&released))
	require.Equal(t, len(names), released)
}

// TestReleaseNotifiesOnlyWaiters: a release, of one lease or a batch, and a
// forced release notify a name only while some session holds its interest
// key; 200 uncontended acquire/release cycles send no notification. The
// controls are the notifications that do arrive once interest is held: the
// watch would see a release's notification, and Go's interest key is the
// one the function tries.
func TestReleaseNotifiesOnlyWaiters(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	db := pgtest.NewDB(t)
	w := newNotifyWatch(t, db)

	for range 200 {
		releaseAll(t, db, "a")
	}
	releaseAll(t, db, "b", "c")
	require.Empty(t, w.since("a", "b", "c"), "no waiter, no notification")

	interest := holdInterest(t, db, "a", "c")
	releaseAll(t, db, "a")
	require.Equal(t, []string{"a"}, w.since("a", "b", "c"))
	releaseAll(t, db, "b", "c")
	require.Equal(t, []string{"c"}, w.since("a", "b", "c"), "in a batch, only the name someone waits for")

	acquireOne(t, ctx, db.Pool, "c", "o")
	_, err := db.Pool.Exec(ctx, `SELECT * FROM pgfence.pgfence_force_release('c', 'test')`)
	require.NoError(t, err)
	require.Equal(t, []string{"c"}, w.since("a", "b", "c"), "a forced release notifies a waiter")

	endInterest(t, db, interest)
	acquireOne(t, ctx, db.Pool, "b", "o")
	_, err = db.Pool.Exec(ctx, `SELECT * FROM pgfence.pgfence_force_release('b', 'test')`)
	require.NoError(t, err)
	releaseAll(t, db, "a")
	require.Empty(t, w.since("a", "b", "c"), "interest ends with the waiter's session")
}

// TestReleaseHoldsInterestKeyToCommit: a release that found no waiter
// holds the name's interest key until it commits, so a waiter that
// registers meanwhile gets its shared lock only once the release is
// visible, and its next attempt takes the lease. Negative control: a
// release that tries the key shared lets the waiter register before the
// commit, after the release chose not to notify.
func TestReleaseHoldsInterestKeyToCommit(t *testing.T) {
	t.Parallel()
	for _, control := range []bool{false, true} {
		t.Run(fmt.Sprintf("control=%t", control), func(t *testing.T) {
			t.Parallel()
			ctx := testCtx(t)
			db := pgtest.NewDB(t)
			if control {
				weaken(t, db, edit{"pgfence_notify_waiters(text, bigint)", "pg_try_advisory_xact_lock(", "pg_try_advisory_xact_lock_shared("})
			}
			key, err := notifier.LoadKey(ctx, db.Pool, "pgfence")
			require.NoError(t, err)
			rows := acquireOne(t, ctx, db.Pool, "x", "holder")
			tx, err := db.Pool.Begin(ctx)
			require.NoError(t, err)
			defer func() { _ = tx.Rollback(ctx) }()
			var released int
			require.NoError(t, tx.QueryRow(ctx, `SELECT count(*) FROM pgfence.pgfence_release('{x}', $1, $2, '{0}')`,
				[]int64{rows[0].token}, []string{rows[0].secret}).Scan(&released))
			require.Equal(t, 1, released)

			waiter, err := pgx.Connect(ctx, db.URL)
			require.NoError(t, err)
			defer func() { _ = waiter.Close(ctx) }()
			var registered bool
			require.NoError(t, waiter.QueryRow(ctx, "SELECT pg_try_advisory_lock_shared($1, $2)", leaseInterestClass, key.InterestID("x")).Scan(&registered))
			if control {
				require.True(t, registered, "control: the waiter registers before the release commits")
				return
			}
			require.False(t, registered, "the release holds the interest key until it commits")
			require.NoError(t, tx.Commit(ctx))
			require.NoError(t, waiter.QueryRow(ctx, "SELECT pg_try_advisory_lock_shared($1, $2)", leaseInterestClass, key.InterestID("x")).Scan(&registered))
			require.True(t, registered)
			require.True(t, acquireOne(t, ctx, waiter, "x", "waiter")[0].acquired, "registered after the commit, the waiter sees the release")
		})
	}
}
