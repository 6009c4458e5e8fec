package migrations_test

import (
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/migrations"
)

// checkerInstall returns a fresh database with pgfence installed by role
// owner (not a superuser) and checker granted with CheckOnly.
func checkerInstall(t *testing.T, owner, checker string) *pgtest.DB {
	t.Helper()
	ctx := testCtx(t)
	db := emptyDB(t)
	exec(t, db, "GRANT CREATE ON DATABASE "+pgx.Identifier{db.Name}.Sanitize()+" TO "+pgx.Identifier{owner}.Sanitize())
	target := migrations.Target{ConnConfig: as(t, db, owner)}
	require.NoError(t, migrations.Up(ctx, target, nil))
	require.NoError(t, migrations.Grant(ctx, target, checker, nil, &migrations.GrantOpts{CheckOnly: true}))
	return db
}

// fenceCheck runs pgfence_fence_check(resource, token) in a transaction of
// its own on c and commits.
func fenceCheck(t *testing.T, c *pgx.Conn, resource string, token int64) error {
	t.Helper()
	return pgx.BeginFunc(testCtx(t), c, func(tx pgx.Tx) error {
		_, err := tx.Exec(testCtx(t), "SELECT pgfence.pgfence_fence_check($1, $2)", resource, token)
		return err
	})
}

// TestCheckOnlyGrant: a role granted CheckOnly calls pgfence_fence_check
// and pgfence_schema_version and nothing else of pgfence's: no other
// function, no table, no sequence; it cannot lower a resource's token,
// directly or through the function. The control grants UPDATE on the
// registry: the same role then lowers the token, so the denial is what
// stopped it.
func TestCheckOnlyGrant(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	roles := newRoles(t, "owner", "checker")
	owner, checker := roles[0], roles[1]
	db := checkerInstall(t, owner, checker)

	var granted []string
	rows, err := db.Pool.Query(ctx, `
		SELECT p.oid::regprocedure::text FROM pg_proc p
		WHERE p.pronamespace = 'pgfence'::regnamespace AND has_function_privilege($1, p.oid, 'EXECUTE')
		UNION ALL
		SELECT c.relname || ' ' || priv FROM pg_class c, unnest(ARRAY['SELECT', 'INSERT', 'UPDATE', 'DELETE', 'TRUNCATE']) AS priv
		WHERE c.relnamespace = 'pgfence'::regnamespace AND c.relkind IN ('r', 'S') AND has_table_privilege($1, c.oid, priv)
		ORDER BY 1`, checker)
	require.NoError(t, err)
	granted, err = pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.Equal(t, []string{"pgfence.pgfence_fence_check(text,bigint)", "pgfence.pgfence_schema_version()"}, granted)

	c := connAs(t, db, checker)
	require.NoError(t, fenceCheck(t, c, "orders", 7))
	requireSQLState(t, fenceCheck(t, c, "orders", 5), "PF001")
	var v int
	require.NoError(t, c.QueryRow(ctx, "SELECT pgfence.pgfence_schema_version()").Scan(&v))
	require.Equal(t, int(migrations.Latest()), v)
	for _, sql := range []string{
		"UPDATE pgfence.pgfence_fence_registry SET token = 1",
		"DELETE FROM pgfence.pgfence_fence_registry",
		"INSERT INTO pgfence.pgfence_fence_registry (resource, token) VALUES ('other', 1)",
		"SELECT * FROM pgfence.pgfence_fence_registry",
		"TRUNCATE pgfence.pgfence_fence_registry",
		"SELECT pgfence.pgfence_next_token()",
		"SELECT pgfence.pgfence_present(1)",
		"SELECT * FROM pgfence.pgfence_acquire(ARRAY['orders'], 'me', ARRAY[1000000::bigint])",
		"SELECT * FROM pgfence.pgfence_leases",
	} {
		_, err := c.Exec(ctx, sql)
		requireSQLState(t, err, "42501")
	}
	var token int64
	require.NoError(t, db.Pool.QueryRow(ctx, "SELECT token FROM pgfence.pgfence_fence_registry WHERE resource = 'orders'").Scan(&token))
	require.Equal(t, int64(7), token)

	// Control.
	exec(t, db, "GRANT UPDATE ON pgfence.pgfence_fence_registry TO "+pgx.Identifier{checker}.Sanitize())
	_, err = c.Exec(ctx, "UPDATE pgfence.pgfence_fence_registry SET token = 1")
	require.NoError(t, err)
	require.NoError(t, fenceCheck(t, c, "orders", 5), "control: with the token lowered the stale token passes")
}

// TestGrantCheckOnlyWithOperator: the two options contradict each other.
func TestGrantCheckOnlyWithOperator(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDB(t)
	err := migrations.Grant(testCtx(t), migrations.Target{URL: db.URL}, "postgres", nil,
		&migrations.GrantOpts{CheckOnly: true, Operator: true})
	require.ErrorContains(t, err, "cannot be combined")
}

// TestFenceCheckHostileSearchPath: a role that may create objects in
// public plants a look-alike registry there, holding a low token, and the
// checker calls pgfence_fence_check with public first on its search_path:
// the real registry decides. The control unpins the function's
// search_path: the look-alike then accepts the stale token.
func TestFenceCheckHostileSearchPath(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	roles := newRoles(t, "owner", "checker", "attacker")
	owner, checker, attacker := roles[0], roles[1], roles[2]
	db := checkerInstall(t, owner, checker)
	exec(t, db, "GRANT CREATE ON SCHEMA public TO "+pgx.Identifier{attacker}.Sanitize())
	_, err := connAs(t, db, attacker).Exec(ctx, `
		CREATE TABLE public.pgfence_fence_registry (resource text, token bigint, raised_at timestamptz DEFAULT now(),
			CONSTRAINT pgfence_fence_registry_pkey PRIMARY KEY (resource));
		INSERT INTO public.pgfence_fence_registry (resource, token) VALUES ('orders', 1);
		GRANT ALL ON public.pgfence_fence_registry TO PUBLIC`)
	require.NoError(t, err)

	c := connAs(t, db, checker)
	_, err = c.Exec(ctx, "SET search_path = public, pgfence")
	require.NoError(t, err)
	require.NoError(t, fenceCheck(t, c, "orders", 9))
	requireSQLState(t, fenceCheck(t, c, "orders", 5), "PF001")
	var planted int64
	require.NoError(t, db.Pool.QueryRow(ctx, "SELECT token FROM public.pgfence_fence_registry").Scan(&planted))
	require.Equal(t, int64(1), planted, "the look-alike is never touched")

	// Control.
	_, err = connAs(t, db, owner).Exec(ctx, "ALTER FUNCTION pgfence.pgfence_fence_check(text, bigint) RESET search_path")
	require.NoError(t, err)
	require.NoError(t, fenceCheck(t, c, "orders", 5), "control: unpinned, the look-alike accepts the stale token")
	require.NoError(t, db.Pool.QueryRow(ctx, "SELECT token FROM public.pgfence_fence_registry").Scan(&planted))
	require.Equal(t, int64(5), planted)
}

// TestFenceCheckInput: the registry refuses empty, too long and NULL
// resource names and tokens that are not positive, writing nothing.
func TestFenceCheckInput(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	db := pgtest.NewDB(t)
	c := db.Conn(t)
	for _, tc := range []struct {
		resource any
		token    any
		msg      string
	}{
		{"", int64(1), "1 to 512 bytes long, not 0 bytes"},
		{stringOf('x', 513), int64(1), "not 513 bytes"},
		{nil, int64(1), "not NULL"},
		{"r", int64(0), "fencing token 0 is not positive"},
		{"r", int64(-5), "fencing token -5 is not positive"},
		{"r", nil, "is not positive"},
	} {
		_, err := c.Exec(ctx, "SELECT pgfence.pgfence_fence_check($1::text, $2::bigint)", tc.resource, tc.token)
		requireSQLState(t, err, "22023")
		require.ErrorContains(t, err, tc.msg)
	}
	require.NoError(t, fenceCheck(t, c, stringOf('x', 512), 1), "512 bytes is the limit")
	var n int
	require.NoError(t, c.QueryRow(ctx, "SELECT count(*) FROM pgfence.pgfence_fence_registry").Scan(&n))
	require.Equal(t, 1, n)
}

// stringOf returns n copies of b.
func stringOf(b byte, n int) string { return strings.Repeat(string(b), n) }
