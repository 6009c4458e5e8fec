package migrations_test

import (
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence/migrations"
)

// TestUpRefusesSchemaOfAnotherRole: a role with CREATE on the database
// creates schema pgfence before the owner installs and opens it to the
// owner. Up refuses it, naming its owner, and changes nothing. Negative
// control: installed without the check, the schema's owner drops
// pgfence_next_token and puts its own in its place, which the application
// then calls; Up refuses the install afterwards, at the latest version.
func TestUpRefusesSchemaOfAnotherRole(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	roles := newRoles(t, "owner", "mallory", "app")
	owner, mallory, app := roles[0], roles[1], roles[2]
	db := emptyDB(t)
	for _, r := range []string{owner, mallory} {
		exec(t, db, "GRANT CREATE ON DATABASE "+pgx.Identifier{db.Name}.Sanitize()+" TO "+pgx.Identifier{r}.Sanitize())
	}
	_, err := connAs(t, db, mallory).Exec(ctx, "CREATE SCHEMA pgfence; GRANT USAGE ON SCHEMA pgfence TO PUBLIC; GRANT CREATE ON SCHEMA pgfence TO "+pgx.Identifier{owner}.Sanitize())
	require.NoError(t, err)
	target := migrations.Target{ConnConfig: as(t, db, owner)}

	err = migrations.Up(ctx, target, nil)
	require.ErrorContains(t, err, fmt.Sprintf(`schema "pgfence" is owned by role %q, not %q`, mallory, owner))
	require.ErrorContains(t, err, fmt.Sprintf(`ALTER SCHEMA "pgfence" OWNER TO %q`, owner))
	require.Empty(t, objectsIn(t, db, "pgfence"), "nothing was installed")

	// Negative control.
	require.NoError(t, migrations.UpWithoutOwnerCheck(ctx, target, nil))
	require.NoError(t, migrations.Grant(ctx, target, app, nil, nil))
	_, err = connAs(t, db, mallory).Exec(ctx, `DROP FUNCTION pgfence.pgfence_next_token() CASCADE;
		CREATE FUNCTION pgfence.pgfence_next_token() RETURNS bigint LANGUAGE sql AS 'SELECT 1'`)
	require.NoError(t, err, "the schema's owner drops a function the owner made")
	var token int64
	require.NoError(t, connAs(t, db, app).QueryRow(ctx, "SELECT pgfence.pgfence_next_token()").Scan(&token))
	require.Equal(t, int64(1), token, "the application draws the forged token")

	err = migrations.Up(ctx, target, nil)
	require.ErrorContains(t, err, fmt.Sprintf(`schema "pgfence" is owned by role %q, not %q`, mallory, owner),
		"at the latest version too")
}

// TestUpRefusesObjectOfAnotherRole: the owner creates the schema and lets
// another role create objects in it, which plants a function there first.
// Up refuses, naming the object and its owner, and installs nothing.
// Negative control: without the check the install goes ahead beside the
// planted function, which the other role still owns and may change.
func TestUpRefusesObjectOfAnotherRole(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	roles := newRoles(t, "owner", "mallory")
	owner, mallory := roles[0], roles[1]
	db := emptyDB(t)
	exec(t, db, "GRANT CREATE ON DATABASE "+pgx.Identifier{db.Name}.Sanitize()+" TO "+pgx.Identifier{owner}.Sanitize())
	ownerConn := connAs(t, db, owner)
	_, err := ownerConn.Exec(ctx, "CREATE SCHEMA pgfence; GRANT USAGE, CREATE ON SCHEMA pgfence TO "+pgx.Identifier{mallory}.Sanitize())
	require.NoError(t, err)
	_, err = connAs(t, db, mallory).Exec(ctx,
		"CREATE FUNCTION pgfence.pgfence_check_us(bigint[], integer, text) RETURNS void LANGUAGE sql SET search_path = pg_catalog, pgfence, pg_temp AS ''")
	require.NoError(t, err)
	target := migrations.Target{ConnConfig: as(t, db, owner)}

	err = migrations.Up(ctx, target, nil)
	require.ErrorContains(t, err, fmt.Sprintf(`schema "pgfence" holds objects not owned by role %q`, owner))
	require.ErrorContains(t, err, fmt.Sprintf(`function pgfence.pgfence_check_us(bigint[],integer,text) owned by role %q`, mallory))
	require.Equal(t, []string{"function pgfence_check_us"}, objectsIn(t, db, "pgfence"), "nothing was installed")

	// Negative control.
	require.NoError(t, migrations.UpWithoutOwnerCheck(ctx, target, nil))
	v, _, err := migrations.Version(ctx, target, nil)
	require.NoError(t, err)
	require.Equal(t, migrations.Latest(), v)
	var by string
	require.NoError(t, db.Pool.QueryRow(ctx,
		"SELECT proowner::regrole::text FROM pg_proc WHERE oid = 'pgfence.pgfence_check_us(bigint[], integer, text)'::regprocedure").Scan(&by))
	require.Equal(t, mallory, by, "the planted function survives the install")
	err = migrations.Up(ctx, target, nil)
	require.ErrorContains(t, err, fmt.Sprintf(`function pgfence.pgfence_check_us(bigint[],integer,text) owned by role %q`, mallory),
		"at the latest version too")
}
