package migrations_test

import (
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence/internal/pgtest"
)

// TestPermitLineKeepsGrants: migration 000006 gives its new
// pgfence_acquire_permit to the roles that could call version 5's, and to
// no one else (not PUBLIC, not a role without that grant: the control).
func TestPermitLineKeepsGrants(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	roles := newRoles(t, "granted", "other")
	db := emptyDB(t)
	exec(t, db, "CREATE SCHEMA pgfence")
	m := cliMigrate(t, db, "postgres", "pgfence")
	require.NoError(t, m.Migrate(5))
	exec(t, db, "GRANT EXECUTE ON FUNCTION pgfence.pgfence_acquire_permit(text, integer, text, bigint) TO "+pgx.Identifier{roles[0]}.Sanitize())
	require.NoError(t, m.Migrate(6))
	may := func(role string) bool {
		var ok bool
		require.NoError(t, db.Pool.QueryRow(ctx,
			`SELECT pg_catalog.has_function_privilege($1, 'pgfence.pgfence_acquire_permit(text, integer, text, bigint, boolean)', 'EXECUTE')`,
			role).Scan(&ok))
		return ok
	}
	require.True(t, may(roles[0]), "the role granted version 5's function")
	require.False(t, may(roles[1]), "control: a role without it")
	require.False(t, may("public"))
	// And down again: version 5's function is untouched.
	require.NoError(t, m.Migrate(5))
	var ok bool
	require.NoError(t, db.Pool.QueryRow(ctx,
		`SELECT pg_catalog.has_function_privilege($1, 'pgfence.pgfence_acquire_permit(text, integer, text, bigint)', 'EXECUTE')`,
		roles[0]).Scan(&ok))
	require.True(t, ok)
}

// TestPermitReleaseNotifiesOnlyWaiters: since migration 000006 a permit's
// release notifies its semaphore's waiters only while a session holds the
// semaphore's interest key, as a lease's release does (version 5 notified
// every time). The control is the notification that arrives once the key
// is held.
func TestPermitReleaseNotifiesOnlyWaiters(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	db := pgtest.NewDB(t)
	w := newNotifyWatch(t, db)
	const key = "s\x1f" // the semaphore's waiters' name
	cycle := func() {
		t.Helper()
		var name, secret string
		var token int64
		require.NoError(t, db.Pool.QueryRow(ctx,
			`SELECT name, fence, secret FROM pgfence.pgfence_acquire_permit('s', 2, 'o', 60000000, false)`).Scan(&name, &token, &secret))
		var released int
		require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM pgfence.pgfence_release($1, $2, $3, '{0}')`,
			[]string{name}, []int64{token}, []string{secret}).Scan(&released))
		require.Equal(t, 1, released)
	}
	for range 50 {
		cycle()
	}
	require.Empty(t, w.since(key), "no waiter, no notification")
	interest := holdInterest(t, db, key)
	cycle()
	require.Equal(t, []string{key}, w.since(key), "a waiter is notified")
	endInterest(t, db, interest)
	cycle()
	require.Empty(t, w.since(key), "interest ends with the waiter's session")
}
