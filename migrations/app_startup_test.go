package migrations_test

import (
	"errors"
	"fmt"
	"testing"

	"github.com/golang-migrate/migrate/v4/database"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence/internal/install"
	"github.com/pgfence/pgfence/migrations"
)

// TestUpAsAppRoleAtLatest: an application role with only what Grant gives
// runs Up and Version at start-up. At the latest version Up returns nil,
// creates nothing and does not wait for the migrations lock, which another
// session holds meanwhile.
func TestUpAsAppRoleAtLatest(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	roles := newRoles(t, "owner", "app")
	owner, app := roles[0], roles[1]
	db := ownedInstall(t, owner, app, "")
	before := objectsIn(t, db, "pgfence")

	id, err := database.GenerateAdvisoryLockId(db.Name, "pgfence", migrations.Table)
	require.NoError(t, err)
	holder := connAs(t, db, owner)
	_, err = holder.Exec(ctx, "SELECT pg_advisory_lock($1::bigint)", id)
	require.NoError(t, err)

	target := migrations.Target{ConnConfig: as(t, db, app)}
	require.NoError(t, migrations.Up(ctx, target, nil))
	v, dirty, err := migrations.Version(ctx, target, nil)
	require.NoError(t, err)
	require.Equal(t, migrations.Latest(), v)
	require.False(t, dirty)
	require.Equal(t, before, objectsIn(t, db, "pgfence"))
}

// TestUpAsAppRolePending: with the migration pending in the owner's schema,
// Up as the application role refuses before changing anything and names
// the schema's owner, as whom to migrate. Control: the owner's Up applies
// the pending migration.
func TestUpAsAppRolePending(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	roles := newRoles(t, "owner", "app")
	owner, app := roles[0], roles[1]
	db := ownedInstall(t, owner, app, "")
	ownerTarget := migrations.Target{ConnConfig: as(t, db, owner)}
	latest := migrations.Latest()
	require.NoError(t, migrations.Down(ctx, ownerTarget, nil))

	err := migrations.Up(ctx, migrations.Target{ConnConfig: as(t, db, app)}, nil)
	require.ErrorContains(t, err, fmt.Sprintf(`schema "pgfence" is owned by role %q, not %q (pgfence's owner)`, owner, app))
	v, _, err := migrations.Version(ctx, ownerTarget, nil)
	require.NoError(t, err)
	require.Zero(t, v)
	require.Empty(t, objectsIn(t, db, "pgfence"))

	require.NoError(t, migrations.Up(ctx, ownerTarget, nil))
	v, _, err = migrations.Version(ctx, ownerTarget, nil)
	require.NoError(t, err)
	require.Equal(t, latest, v)
}

// TestVersionNamesMissingGrant: a role given everything Grant gives but
// SELECT on the migrations table cannot read the version; Version and Up
// fail with PostgreSQL's error (SQLSTATE 42501), which names the grant and
// the privilege missing, and only that one. Control: the granted role reads
// it (TestUpAsAppRoleAtLatest).
func TestVersionNamesMissingGrant(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	roles := newRoles(t, "owner", "partial")
	owner, partial := roles[0], roles[1]
	db := ownedInstall(t, owner, partial, "")
	_, err := connAs(t, db, owner).Exec(ctx, "REVOKE SELECT ON pgfence."+migrations.Table+" FROM "+pgx.Identifier{partial}.Sanitize())
	require.NoError(t, err)

	target := migrations.Target{ConnConfig: as(t, db, partial)}
	_, _, verr := migrations.Version(ctx, target, nil)
	uerr := migrations.Up(ctx, target, nil)
	for _, err := range []error{verr, uerr} {
		requireSQLState(t, err, "42501")
		var pe *install.PermissionError
		require.True(t, errors.As(err, &pe), "%v", err)
		require.Equal(t, []string{`SELECT on table "pgfence"."` + migrations.Table + `"`}, pe.Missing)
		require.ErrorContains(t, err, "hint: as pgfence's owner, run `pgfence grant "+partial+"` (missing: SELECT on table")
		var pgErr *pgconn.PgError
		require.ErrorAs(t, err, &pgErr)
	}
}
