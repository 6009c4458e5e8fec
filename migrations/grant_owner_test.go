package migrations_test

import (
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/migrations"
)

// hasUsage reports whether role has USAGE on schema pgfence.
func hasUsage(t *testing.T, db *pgtest.DB, role string) bool {
	t.Helper()
	var ok bool
	require.NoError(t, db.Pool.QueryRow(testCtx(t), "SELECT has_schema_privilege($1, 'pgfence', 'USAGE')", role).Scan(&ok))
	return ok
}

// TestGrantChecksWhatItGranted: Grant run by a role that holds pgfence's
// privileges without the grant option (an application role) grants nothing:
// PostgreSQL only warns. Grant fails, naming what the role still lacks and
// the install's owner. Negative control: without the check it reports
// success, and the role still lacks USAGE. The owner's Grant then works.
func TestGrantChecksWhatItGranted(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	roles := newRoles(t, "owner", "app", "other")
	owner, app, other := roles[0], roles[1], roles[2]
	db := ownedInstall(t, owner, app, "")
	asApp := migrations.Target{ConnConfig: as(t, db, app)}

	err := migrations.Grant(ctx, asApp, other, nil, nil)
	require.ErrorContains(t, err, fmt.Sprintf(`role %q still lacks USAGE on schema "pgfence", SELECT on table "pgfence"."pgfence_leases"`, other))
	require.ErrorContains(t, err, `EXECUTE on function "pgfence".pgfence_next_token()`)
	require.ErrorContains(t, err, fmt.Sprintf("run Grant as the install's owner, %q", owner))
	require.False(t, hasUsage(t, db, other))

	require.NoError(t, migrations.GrantWithoutCheck(ctx, asApp, other, nil, nil), "negative control: reported as granted")
	require.False(t, hasUsage(t, db, other), "though nothing was")

	require.NoError(t, migrations.Grant(ctx, migrations.Target{ConnConfig: as(t, db, owner)}, other, nil, nil))
	require.True(t, hasUsage(t, db, other))
}

// TestGrantSQLRuns: GrantSQL's statements, with Operator, run on an install
// (every object they name exists) and give the role EXECUTE on every
// function of the schema but pgfence_notify_payload, pgfence_check_us,
// pgfence_notify_waiters and pgfence_hand_permit, which
// only the functions call, and pgfence_force_release without Operator.
func TestGrantSQLRuns(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	role := newRoles(t, "app")[0]
	db := pgtest.NewDB(t)
	stmts := migrations.GrantSQL("", role, &migrations.GrantOpts{Operator: true})
	exec(t, db, stmts[:3]...)
	denied := func() []string {
		t.Helper()
		rows, err := db.Pool.Query(ctx, `SELECT p.proname::text FROM pg_proc p
			WHERE p.pronamespace = 'pgfence'::regnamespace AND NOT has_function_privilege($1, p.oid, 'EXECUTE')
			ORDER BY 1`, role)
		require.NoError(t, err)
		names, err := pgx.CollectRows(rows, pgx.RowTo[string])
		require.NoError(t, err)
		return names
	}
	require.Equal(t, []string{"pgfence_check_us", "pgfence_force_release", "pgfence_hand_permit", "pgfence_notify_payload", "pgfence_notify_waiters"}, denied())
	exec(t, db, stmts[3:]...)
	require.Equal(t, []string{"pgfence_check_us", "pgfence_hand_permit", "pgfence_notify_payload", "pgfence_notify_waiters"}, denied())
}
