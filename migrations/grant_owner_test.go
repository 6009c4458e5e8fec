package migrations_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

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

// TestGrantSQLAtEachVersion: the statements for version v run on an install
// at v, so every function they name exists there; from migration 12 on they
// name the new signatures of pgfence_renew, pgfence_release and
// pgfence_lease_held and SELECT on pgfence_notify_key, and not the old ones.
func TestGrantSQLAtEachVersion(t *testing.T) {
	t.Parallel()
	role := newRoles(t, "app")[0]
	latest := migrations.Latest()
	require.Equal(t, migrations.GrantSQLAt("", "app", latest, nil), migrations.GrantSQL("", "app", nil))
	for _, v := range []uint{3, 5, 9, 11, latest} {
		t.Run(fmt.Sprint(v), func(t *testing.T) {
			t.Parallel()
			db := dbAt(t, v)
			stmts := migrations.GrantSQLAt("", role, v, &migrations.GrantOpts{Operator: true})
			tx, err := db.Pool.Begin(testCtx(t))
			require.NoError(t, err)
			defer func() { _ = tx.Rollback(context.Background()) }()
			for _, stmt := range stmts {
				_, err := tx.Exec(testCtx(t), stmt)
				require.NoError(t, err, stmt)
			}
			all := strings.Join(stmts, ";\n")
			before12 := []string{
				"pgfence_renew(pg_catalog.text[], pg_catalog.int8[], pg_catalog.int8[])",
				"pgfence_release(pg_catalog.text[], pg_catalog.int8[], pg_catalog.int8[], pg_catalog.text)",
				"pgfence_lease_held(pg_catalog.text, pg_catalog.int8)",
			}
			from12 := []string{
				"pgfence_renew(pg_catalog.text[], pg_catalog.int8[], pg_catalog.text[], pg_catalog.int8[])",
				"pgfence_release(pg_catalog.text[], pg_catalog.int8[], pg_catalog.text[], pg_catalog.int8[])",
				"pgfence_lease_held(pg_catalog.text, pg_catalog.int8, pg_catalog.text)",
				`"pgfence"."pgfence_notify_key"`,
			}
			present, absent := before12, from12
			if v >= 12 {
				present, absent = from12, before12
			}
			for _, s := range present {
				require.Contains(t, all, s)
			}
			for _, s := range absent {
				require.NotContains(t, all, s)
			}
			require.Contains(t, all, `"pgfence"."`+migrations.Table+`"`)
			require.Equal(t, v >= 5, strings.Contains(all, "pgfence_leader_proclaim("))
		})
	}
}
