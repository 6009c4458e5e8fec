package fence_test

import (
	"context"
	"io/fs"
	"slices"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/migrations"
)

// guardFunctions are the trigger functions and the ones they call.
var guardFunctions = []string{
	"pgfence_guard", "pgfence_guard_strict", "pgfence_guard_truncate", "pgfence_last_token", "pgfence_schema_version",
}

// functionState is what the migration test reads of one function.
type functionState struct {
	schema, config, source string
	definer, publicExec    bool
}

// functions returns the state of every function named pgfence_* in the
// database, by name; an overloaded name (pgfence_acquire_permit) by name
// and identity arguments.
func functions(t *testing.T, conn *pgx.Conn) map[string]functionState {
	t.Helper()
	rows, err := conn.Query(context.Background(), `
		SELECT CASE WHEN pg_catalog.count(*) OVER (PARTITION BY p.proname, n.nspname) OPERATOR(pg_catalog.>) 1
		            THEN p.proname OPERATOR(pg_catalog.||) '(' OPERATOR(pg_catalog.||) pg_catalog.pg_get_function_identity_arguments(p.oid) OPERATOR(pg_catalog.||) ')'
		            ELSE p.proname::pg_catalog.text END,
		       n.nspname, coalesce(pg_catalog.array_to_string(p.proconfig, ';'), ''), p.prosrc, p.prosecdef,
		       pg_catalog.has_function_privilege('public', p.oid, 'EXECUTE')
		FROM pg_catalog.pg_proc AS p JOIN pg_catalog.pg_namespace AS n ON n.oid OPERATOR(pg_catalog.=) p.pronamespace
		WHERE p.proname LIKE 'pgfence\_%'`)
	require.NoError(t, err)
	out := map[string]functionState{}
	for rows.Next() {
		var name string
		var f functionState
		require.NoError(t, rows.Scan(&name, &f.schema, &f.config, &f.source, &f.definer, &f.publicExec))
		_, dup := out[name]
		require.False(t, dup, "%s is installed twice", name)
		out[name] = f
	}
	require.NoError(t, rows.Err())
	return out
}

// migration returns the text of one of pgfence's migration files.
func migration(t *testing.T, name string) string {
	t.Helper()
	b, err := migrations.FS.ReadFile(name)
	require.NoError(t, err)
	return string(b)
}

// TestBaselineGuardFunctions checks what the baseline migration installs
// for the triggers: every function in pgfence's schema (none in pg_catalog,
// where creating them under the pinned search_path would put them), each
// with that search_path pinned, pgfence_last_token SECURITY DEFINER and not
// executable by PUBLIC; that its down migration drops them, and that up
// applies again afterwards.
func TestBaselineGuardFunctions(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.NewDB(t)
	conn := db.Conn(t)
	schema, err := pgfenceSchema(ctx, conn)
	require.NoError(t, err)
	// As the migrator runs them: on a connection whose search_path is
	// pgfence's schema, each file in one transaction.
	_, err = conn.Exec(ctx, "SELECT pg_catalog.set_config('search_path', $1, false)", pgx.Identifier{schema}.Sanitize())
	require.NoError(t, err)
	var quoted string
	require.NoError(t, conn.QueryRow(ctx, "SELECT pg_catalog.quote_ident($1)", schema).Scan(&quoted))
	pinned := "search_path=pg_catalog, " + quoted + ", pg_temp"
	checkUp := func(version int) {
		t.Helper()
		fns := functions(t, conn)
		for _, name := range guardFunctions {
			f, ok := fns[name]
			require.True(t, ok, "%s is missing", name)
			require.Equal(t, schema, f.schema, name)
			require.Equal(t, pinned, f.config, name)
			require.Equal(t, name == "pgfence_last_token", f.definer, name)
			require.False(t, f.publicExec, "%s: EXECUTE is revoked from PUBLIC", name)
		}
		var v int
		require.NoError(t, conn.QueryRow(ctx, "SELECT "+pgx.Identifier{schema, "pgfence_schema_version"}.Sanitize()+"()").Scan(&v))
		require.Equal(t, version, v)
	}
	checkUp(int(migrations.Latest())) // as migrated

	// Every down file, newest first, as migrations.Down runs them.
	downs, err := fs.Glob(migrations.FS, "*.down.sql")
	require.NoError(t, err)
	slices.Reverse(downs)
	require.Equal(t, "000001_baseline.down.sql", downs[len(downs)-1])
	for _, down := range downs {
		_, err = conn.Exec(ctx, migration(t, down))
		require.NoError(t, err, down)
	}
	fns := functions(t, conn)
	for _, name := range guardFunctions {
		require.NotContains(t, fns, name)
	}

	_, err = conn.Exec(ctx, migration(t, "000001_baseline.up.sql"))
	require.NoError(t, err)
	checkUp(1) // the baseline alone
}
