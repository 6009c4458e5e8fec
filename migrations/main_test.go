package migrations_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"go.uber.org/goleak"
	"net/url"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/golang-migrate/migrate/v4"
	_ "github.com/golang-migrate/migrate/v4/database/pgx/v5" // the migrate CLI's pgx5:// driver
	"github.com/golang-migrate/migrate/v4/source/iofs"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/migrations"
)

// TestMain runs the tests under pgtest. golang-migrate's own Up (the migrate
// CLI, which some tests run) buffers the next migration in a goroutine that
// stays blocked when a migration before it fails: that goroutine is the
// library's, not pgfence's.
//
// The examples find their database in DATABASE_URL, as a program would.
func TestMain(m *testing.M) {
	db, drop := pgtest.ExampleDB()
	if err := os.Setenv("DATABASE_URL", db.URL); err != nil {
		panic(err)
	}
	pgtest.MainWithOptions(m, pgtest.Options{AfterRun: drop, LeakOptions: []goleak.Option{
		goleak.IgnoreAnyFunction("github.com/golang-migrate/migrate/v4.(*Migration).Buffer"),
	}})
}

// testCtx is a context for one test's statements.
func testCtx(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// newRoles creates login roles, one per prefix, with names unique to the
// run, and returns their names in order. Roles belong to the server, not a
// database: call newRoles before creating the databases the roles are used
// in, so the roles are dropped after those databases are.
func newRoles(t *testing.T, prefixes ...string) []string {
	t.Helper()
	ctx := testCtx(t)
	srv := pgtest.Shared(t)
	admin, err := pgx.Connect(ctx, srv.AdminURL)
	require.NoError(t, err)
	defer func() { _ = admin.Close(context.Background()) }()
	var rnd [4]byte
	_, _ = rand.Read(rnd[:])
	// Over TCP the test server asks for a password (the postgres role's,
	// which TCPURL carries); the roles get the same one, so that asTCP can
	// log them in there too.
	tcp, err := pgx.ParseConfig(srv.TCPURL)
	require.NoError(t, err)
	names := make([]string, 0, len(prefixes))
	for _, p := range prefixes {
		name := fmt.Sprintf("pgf_%s_%s", p, hex.EncodeToString(rnd[:]))
		_, err := admin.Exec(ctx, "CREATE ROLE "+pgx.Identifier{name}.Sanitize()+" LOGIN")
		require.NoError(t, err)
		if tcp.Password != "" {
			_, err := admin.Exec(ctx, "ALTER ROLE "+pgx.Identifier{name}.Sanitize()+" PASSWORD "+quoteLiteral(tcp.Password))
			require.NoError(t, err)
		}
		names = append(names, name)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		admin, err := pgx.Connect(ctx, srv.AdminURL)
		if err != nil {
			t.Errorf("drop roles: %v", err)
			return
		}
		defer func() { _ = admin.Close(context.Background()) }()
		for _, name := range names {
			if _, err := admin.Exec(ctx, "DROP ROLE IF EXISTS "+pgx.Identifier{name}.Sanitize()); err != nil {
				t.Errorf("drop role %s: %v", name, err)
			}
		}
	})
	return names
}

// emptyDB returns a fresh database with no pgfence object and no pgfence
// schema.
func emptyDB(t *testing.T) *pgtest.DB {
	t.Helper()
	ctx := testCtx(t)
	db := pgtest.NewDB(t)
	require.NoError(t, migrations.Down(ctx, migrations.Target{URL: db.URL}, nil))
	_, err := db.Pool.Exec(ctx, "DROP SCHEMA pgfence")
	require.NoError(t, err)
	return db
}

// edit replaces old with new in the definition of function fn (a
// regprocedure in schema pgfence): the negative controls remove one check
// of a function this way.
type edit struct{ fn, old, new string }

// weaken redefines each edited function in db from its current definition
// (pg_get_functiondef, which keeps its settings, owner and grants), with
// every occurrence of old replaced by new; it fails t unless old occurs.
func weaken(t *testing.T, db *pgtest.DB, edits ...edit) {
	t.Helper()
	for _, e := range edits {
		var def string
		require.NoError(t, db.Pool.QueryRow(testCtx(t), "SELECT pg_get_functiondef($1::regprocedure)", "pgfence."+e.fn).Scan(&def))
		require.Contains(t, def, e.old, "the control's edit must match %s", e.fn)
		exec(t, db, strings.ReplaceAll(def, e.old, e.new))
	}
}

// quoteLiteral quotes s as an SQL string literal.
func quoteLiteral(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }

// asTCP is as over TCP, for tests that need a client address; the role
// must come from newRoles.
func asTCP(t *testing.T, db *pgtest.DB, role string) *pgx.ConnConfig {
	t.Helper()
	cfg, err := pgx.ParseConfig(db.TCPURL)
	require.NoError(t, err)
	cfg.User = role
	return cfg
}

// as returns the connection configuration of db for role (the test servers
// trust every role on their private socket).
func as(t *testing.T, db *pgtest.DB, role string) *pgx.ConnConfig {
	t.Helper()
	cfg, err := pgx.ParseConfig(db.URL)
	require.NoError(t, err)
	cfg.User = role
	return cfg
}

// connAs opens a connection to db as role, closed when t ends.
func connAs(t *testing.T, db *pgtest.DB, role string) *pgx.Conn {
	t.Helper()
	conn, err := pgx.ConnectConfig(testCtx(t), as(t, db, role))
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	return conn
}

// exec runs statements on db as its superuser.
func exec(t *testing.T, db *pgtest.DB, sqls ...string) {
	t.Helper()
	for _, sql := range sqls {
		_, err := db.Pool.Exec(testCtx(t), sql)
		require.NoError(t, err, sql)
	}
}

// cliMigrate returns golang-migrate, as the migrate CLI runs it, on db as
// role, on the documented path: search_path=schema and pgfence's table.
func cliMigrate(t *testing.T, db *pgtest.DB, role, schema string) *migrate.Migrate {
	t.Helper()
	cfg := as(t, db, role)
	u := fmt.Sprintf("pgx5://%s@/%s?host=%s&port=%d&sslmode=disable&search_path=%s&x-migrations-table=%s",
		url.PathEscape(role), url.PathEscape(cfg.Database), url.QueryEscape(cfg.Host), cfg.Port, url.QueryEscape(schema), migrations.Table)
	src, err := iofs.New(migrations.FS, ".")
	require.NoError(t, err)
	m, err := migrate.NewWithSourceInstance("iofs", src, u)
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = m.Close() })
	return m
}

// requireSQLState fails unless err is a PostgreSQL error with code.
func requireSQLState(t *testing.T, err error, code string) {
	t.Helper()
	require.Error(t, err)
	var pgErr *pgconn.PgError
	require.True(t, errors.As(err, &pgErr), "not a PostgreSQL error: %v", err)
	require.Equal(t, code, pgErr.Code, "%v", err)
}

// objectsIn lists the relations, functions and types in schema.
func objectsIn(t *testing.T, db *pgtest.DB, schema string) []string {
	t.Helper()
	rows, err := db.Pool.Query(testCtx(t), `
		SELECT 'relation ' || c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = $1
		UNION ALL
		SELECT 'function ' || p.proname FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace WHERE n.nspname = $1
		UNION ALL
		SELECT 'type ' || y.typname FROM pg_type y JOIN pg_namespace n ON n.oid = y.typnamespace WHERE n.nspname = $1
		ORDER BY 1`, schema)
	require.NoError(t, err)
	objs, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	return objs
}
