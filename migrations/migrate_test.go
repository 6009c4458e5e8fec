package migrations_test

import (
	"context"
	"fmt"
	"io/fs"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/golang-migrate/migrate/v4/database"
	migratepgx "github.com/golang-migrate/migrate/v4/database/pgx/v5"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/migrations"
)

func TestLatest(t *testing.T) {
	t.Parallel()
	// The baseline, notify-waiters, the fence registry, the schedule's slots
	// and the semaphores, each with its down file.
	ups, err := fs.Glob(migrations.FS, "*.up.sql")
	require.NoError(t, err)
	downs, err := fs.Glob(migrations.FS, "*.down.sql")
	require.NoError(t, err)
	require.Equal(t, []string{"000001_baseline.up.sql", "000002_notify_waiters.up.sql", "000003_fence_registry.up.sql", "000004_schedule_slots.up.sql", "000005_semaphores.up.sql", "000006_permit_line.up.sql", "000007_permit_slot_lookup.up.sql", "000008_permit_handover.up.sql", "000009_handover_without_flush.up.sql"}, ups)
	require.Equal(t, []string{"000001_baseline.down.sql", "000002_notify_waiters.down.sql", "000003_fence_registry.down.sql", "000004_schedule_slots.down.sql", "000005_semaphores.down.sql", "000006_permit_line.down.sql", "000007_permit_slot_lookup.down.sql", "000008_permit_handover.down.sql", "000009_handover_without_flush.down.sql"}, downs)
	require.Equal(t, uint(9), migrations.Latest())
}

func TestUpCreatesSchemaAndIsIdempotent(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	db := emptyDB(t)
	cfg := &migrations.Config{Schema: `Odd "Schema"`}
	target := migrations.Target{URL: db.URL}

	require.NoError(t, migrations.Up(ctx, target, cfg))
	require.Contains(t, objectsIn(t, db, `Odd "Schema"`), "relation pgfence_leases")
	require.Contains(t, objectsIn(t, db, `Odd "Schema"`), "relation "+migrations.Table)
	require.Contains(t, objectsIn(t, db, `Odd "Schema"`), "function pgfence_acquire")
	require.Empty(t, objectsIn(t, db, "public"), "nothing is installed outside the schema")

	require.NoError(t, migrations.Up(ctx, target, cfg), "a second Up is a no-op")
	v, dirty, err := migrations.Version(ctx, target, cfg)
	require.NoError(t, err)
	require.False(t, dirty)
	require.Equal(t, migrations.Latest(), v)

	// Every function has its search_path pinned to the schema.
	var unpinned []string
	rows, err := db.Pool.Query(ctx, `
		SELECT p.proname FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
		WHERE n.nspname = $1 AND (p.proconfig IS NULL OR NOT p.proconfig @> ARRAY[$2])`,
		`Odd "Schema"`, `search_path=pg_catalog, "Odd ""Schema""", pg_temp`)
	require.NoError(t, err)
	unpinned, err = pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.Empty(t, unpinned)
}

func TestUpDefaultSchema(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	db := emptyDB(t)
	require.NoError(t, migrations.Up(ctx, migrations.Target{URL: db.URL}, nil))
	require.Contains(t, objectsIn(t, db, "pgfence"), "relation pgfence_leases")
	v, _, err := migrations.Version(ctx, migrations.Target{URL: db.URL}, &migrations.Config{})
	require.NoError(t, err)
	require.Equal(t, migrations.Latest(), v)
}

// TestBaselineCatalog: what the baseline installs beyond its objects'
// names: the functions that run as the owner, nothing for PUBLIC, the token
// sequence's settings, the version, and a notification key of its own per
// install.
func TestBaselineCatalog(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	db := pgtest.NewDB(t)
	list := func(sql string) []string {
		t.Helper()
		rows, err := db.Pool.Query(ctx, sql)
		require.NoError(t, err)
		out, err := pgx.CollectRows(rows, pgx.RowTo[string])
		require.NoError(t, err)
		return out
	}
	require.Equal(t, []string{"pgfence_acquire", "pgfence_acquire_permit", "pgfence_acquire_permit", "pgfence_acquire_set", "pgfence_claim_permit", "pgfence_fence_check", "pgfence_force_release", "pgfence_last_token", "pgfence_leader_proclaim",
		"pgfence_lease_held", "pgfence_next_token", "pgfence_next_tokens", "pgfence_prune_delete", "pgfence_prune_scan",
		"pgfence_release", "pgfence_renew", "pgfence_slot_begin", "pgfence_slot_finish", "pgfence_slots_prune", "pgfence_unclaim_permit"},
		list(`SELECT proname::text FROM pg_proc WHERE pronamespace = 'pgfence'::regnamespace AND prosecdef ORDER BY 1`))
	require.Empty(t, list(`
		SELECT p.oid::regprocedure::text FROM pg_proc p
		WHERE p.pronamespace = 'pgfence'::regnamespace AND has_function_privilege('public', p.oid, 'EXECUTE')
		UNION ALL
		SELECT c.relname::text FROM pg_class c
		WHERE c.relnamespace = 'pgfence'::regnamespace AND c.relkind IN ('r', 'S')
		  AND (has_table_privilege('public', c.oid, 'SELECT') OR has_table_privilege('public', c.oid, 'UPDATE'))`))
	require.Equal(t, []string{"1024 1 false"}, list(`SELECT seqincrement || ' ' || seqcache || ' ' || seqcycle FROM pg_sequence
		WHERE seqrelid = 'pgfence.pgfence_leases_fence_seq'::regclass`))
	require.Equal(t, []string{fmt.Sprint(migrations.Latest())}, list(`SELECT pgfence.pgfence_schema_version()::text`))

	keys := list(`SELECT encode(key, 'hex') FROM pgfence.pgfence_notify_key`)
	require.Len(t, keys, 1)
	require.Len(t, keys[0], 64)
	fresh := emptyDB(t)
	require.NoError(t, migrations.Up(ctx, migrations.Target{URL: fresh.URL}, nil))
	var other string
	require.NoError(t, fresh.Pool.QueryRow(ctx, `SELECT encode(key, 'hex') FROM pgfence.pgfence_notify_key`).Scan(&other))
	require.NotEqual(t, keys[0], other, "each install draws its own key")
}

func TestUpTargets(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)

	t.Run("ConnConfig", func(t *testing.T) {
		t.Parallel()
		db := emptyDB(t)
		cfg, err := pgx.ParseConfig(db.URL)
		require.NoError(t, err)
		require.NoError(t, migrations.Up(ctx, migrations.Target{ConnConfig: cfg}, nil))
		require.Empty(t, cfg.RuntimeParams["search_path"], "the caller's config is not changed")
		require.Contains(t, objectsIn(t, db, "pgfence"), "relation pgfence_leases")
	})

	t.Run("Pool", func(t *testing.T) {
		t.Parallel()
		db := emptyDB(t)
		pool := db.NewPool(t, func(c *pgxpool.Config) { c.MaxConns = 1 })
		_, err := pool.Exec(ctx, "SET search_path = public, pg_temp")
		require.NoError(t, err)
		require.NoError(t, migrations.Up(ctx, migrations.Target{Pool: pool}, nil))
		require.Contains(t, objectsIn(t, db, "pgfence"), "relation pgfence_leases")
		// The pool's only connection came back as it was.
		var path string
		var locks int
		require.NoError(t, pool.QueryRow(ctx, "SHOW search_path").Scan(&path))
		require.Equal(t, "public, pg_temp", path)
		require.NoError(t, pool.QueryRow(ctx,
			"SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid()").Scan(&locks))
		require.Zero(t, locks)
		require.Equal(t, int32(1), pool.Stat().TotalConns())
	})

	t.Run("NoneOrTwo", func(t *testing.T) {
		t.Parallel()
		db := pgtest.NewDB(t)
		cfg, err := pgx.ParseConfig(db.URL)
		require.NoError(t, err)
		for _, target := range []migrations.Target{
			{},
			{URL: db.URL, ConnConfig: cfg},
			{URL: db.URL, Pool: db.Pool},
			{URL: db.URL, ConnConfig: cfg, Pool: db.Pool},
		} {
			require.ErrorContains(t, migrations.Up(ctx, target, nil), "exactly one of URL, ConnConfig and Pool")
			_, _, err := migrations.Version(ctx, target, nil)
			require.ErrorContains(t, err, "exactly one of URL, ConnConfig and Pool")
		}
	})
}

func TestUpRejectsBadInput(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	db := pgtest.NewDB(t)
	for schema, msg := range map[string]string{
		strings.Repeat("s", 64): "longer than 63 bytes",
		"a\x00b":                "NUL",
	} {
		err := migrations.Up(ctx, migrations.Target{URL: db.URL}, &migrations.Config{Schema: schema})
		require.ErrorContains(t, err, msg)
		require.ErrorContains(t, err, "pgfence: migrations: up: ")
	}
	// 63 bytes is fine (negative control): the refusal is the other install.
	err := migrations.Up(ctx, migrations.Target{URL: db.URL}, &migrations.Config{Schema: strings.Repeat("s", 63)})
	require.ErrorContains(t, err, `already installed in schema "pgfence"`)

	require.ErrorContains(t, migrations.Up(ctx, migrations.Target{URL: " "}, nil), "database URL is empty")
	require.ErrorContains(t, migrations.Up(ctx, migrations.Target{URL: "postgres://%zz"}, nil), "parse the database URL")

	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	require.ErrorIs(t, migrations.Up(cancelled, migrations.Target{URL: db.URL}, nil), context.Canceled)
}

// TestContextBoundsConnect: a server that accepts the TCP connection and
// never answers must not hold Up, Down, Version or Grant past their ctx.
func TestContextBoundsConnect(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	var mu sync.Mutex
	var accepted []net.Conn
	acceptDone := make(chan struct{})
	go func() {
		defer close(acceptDone)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			accepted = append(accepted, c)
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		_ = ln.Close()
		<-acceptDone
		mu.Lock()
		defer mu.Unlock()
		for _, c := range accepted {
			_ = c.Close()
		}
	})
	target := migrations.Target{URL: "postgres://postgres@" + ln.Addr().String() + "/x?sslmode=disable"}
	calls := map[string]func(context.Context) error{
		"Up":   func(ctx context.Context) error { return migrations.Up(ctx, target, nil) },
		"Down": func(ctx context.Context) error { return migrations.Down(ctx, target, nil) },
		"Version": func(ctx context.Context) error {
			_, _, err := migrations.Version(ctx, target, nil)
			return err
		},
		"Grant": func(ctx context.Context) error { return migrations.Grant(ctx, target, "app", nil, nil) },
	}
	for name, call := range calls {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			defer cancel()
			done := make(chan error, 1)
			go func() { done <- call(ctx) }()
			select {
			case err := <-done:
				require.ErrorIs(t, err, context.DeadlineExceeded)
			case <-time.After(time.Minute):
				t.Fatalf("%s did not return after its context ended", name)
			}
		})
	}
}

// TestContextStopsRunMidMigration: when ctx ends while a migration waits for
// a lock, the statement is cancelled on the server, the migration is rolled
// back and the version stays where it was, clean.
func TestContextStopsRunMidMigration(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	db := pgtest.NewDB(t)
	target := migrations.Target{URL: db.URL}
	require.NoError(t, migrations.Down(ctx, target, nil))

	// An uncommitted table of the same name: the migration's CREATE TABLE
	// waits for its transaction.
	blocker, err := db.Pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = blocker.Rollback(context.Background()) }()
	_, err = blocker.Exec(ctx, "CREATE TABLE pgfence.pgfence_leases (name text)")
	require.NoError(t, err)

	cfg, err := pgx.ParseConfig(db.URL)
	require.NoError(t, err)
	cfg.RuntimeParams["application_name"] = "pgfence-cancel-test"
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- migrations.Up(runCtx, migrations.Target{ConnConfig: cfg}, nil) }()

	waitFor(t, db, "SELECT count(*) = 1 FROM pg_stat_activity WHERE application_name = 'pgfence-cancel-test' AND wait_event_type = 'Lock'")
	cancel()
	select {
	case err := <-done:
		require.ErrorIs(t, err, context.Canceled)
	case <-time.After(time.Minute):
		t.Fatal("Up did not return after its context was cancelled")
	}
	// The server stopped waiting too: the backend is gone.
	waitFor(t, db, "SELECT count(*) = 0 FROM pg_stat_activity WHERE application_name = 'pgfence-cancel-test'")
	v, dirty, err := migrations.Version(ctx, target, nil)
	require.NoError(t, err)
	require.Zero(t, v)
	require.False(t, dirty)
	require.NotContains(t, objectsIn(t, db, "pgfence"), "function pgfence_acquire")

	// Negative control: without the cancel the same run completes.
	require.NoError(t, blocker.Rollback(ctx))
	require.NoError(t, migrations.Up(ctx, target, nil))
	v, _, err = migrations.Version(ctx, target, nil)
	require.NoError(t, err)
	require.Equal(t, migrations.Latest(), v)
}

// waitFor polls query (which returns one boolean) until it is true.
func waitFor(t *testing.T, db *pgtest.DB, query string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for {
		var ok bool
		require.NoError(t, db.Pool.QueryRow(ctx, query).Scan(&ok))
		if ok {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("still false after a minute: %s", query)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// TestVersionWritesNothing: Version needs no CREATE privilege, creates no
// schema or table on a fresh database, and reads the version where the role
// may read it.
func TestVersionWritesNothing(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	roles := newRoles(t, "reader")
	reader := roles[0]
	fresh := emptyDB(t)
	installed := pgtest.NewDB(t)

	v, dirty, err := migrations.Version(ctx, migrations.Target{ConnConfig: as(t, fresh, reader)}, nil)
	require.NoError(t, err)
	require.Zero(t, v)
	require.False(t, dirty)
	var schemas int
	require.NoError(t, fresh.Pool.QueryRow(ctx, "SELECT count(*) FROM pg_namespace WHERE nspname = 'pgfence'").Scan(&schemas))
	require.Zero(t, schemas)
	require.Empty(t, objectsIn(t, fresh, "public"))

	exec(t, installed,
		"GRANT USAGE ON SCHEMA pgfence TO "+pgx.Identifier{reader}.Sanitize(),
		"GRANT SELECT ON pgfence."+migrations.Table+" TO "+pgx.Identifier{reader}.Sanitize())
	v, dirty, err = migrations.Version(ctx, migrations.Target{ConnConfig: as(t, installed, reader)}, nil)
	require.NoError(t, err)
	require.Equal(t, migrations.Latest(), v)
	require.False(t, dirty)

	// Negative control: golang-migrate's own driver, which the previous
	// Version used, creates the table just to open the database.
	sqlDB := stdlib.OpenDB(*as(t, fresh, "postgres"))
	defer sqlDB.Close()
	drv, err := migratepgx.WithInstance(sqlDB, &migratepgx.Config{MigrationsTable: migrations.Table})
	require.NoError(t, err)
	require.NoError(t, drv.Close())
	require.Contains(t, objectsIn(t, fresh, "public"), "relation "+migrations.Table)
}

func TestUpRefusesSecondInstall(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	db := pgtest.NewDB(t) // pgfence is in schema pgfence

	err := migrations.Up(ctx, migrations.Target{URL: db.URL}, &migrations.Config{Schema: "other"})
	require.ErrorContains(t, err, `pgfence is already installed in schema "pgfence" of this database`)
	require.ErrorContains(t, err, `second install in schema "other"`)
	var n int
	require.NoError(t, db.Pool.QueryRow(ctx, "SELECT count(*) FROM pg_namespace WHERE nspname = 'other'").Scan(&n))
	require.Zero(t, n, "Up refused before creating anything")

	// A temporary table of the same name is no install.
	conn, err := db.Pool.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	_, err = conn.Exec(ctx, "CREATE TEMP TABLE pgfence_leases (x int)")
	require.NoError(t, err)
	require.NoError(t, migrations.Up(ctx, migrations.Target{URL: db.URL}, nil))

	// The migrate CLI path: the baseline refuses too (golang-migrate leaves
	// the schema dirty at 1, with nothing applied).
	exec(t, db, "CREATE SCHEMA other2")
	m := cliMigrate(t, db, "postgres", "other2")
	err = m.Up()
	require.ErrorContains(t, err, "pgfence: already installed in schema pgfence of this database")
	v, dirty, err := m.Version()
	require.NoError(t, err)
	require.Equal(t, uint(1), v)
	require.True(t, dirty)
	require.NotContains(t, objectsIn(t, db, "other2"), "relation pgfence_leases")

	// Negative control: TestCLIPath runs the same CLI path, successfully,
	// on a database where pgfence is not installed elsewhere.
}

// TestCLIPath applies the files with golang-migrate as the migrate CLI does
// (search_path and x-migrations-table in the URL), then reads and reverts
// the install with this package: both see the same install.
func TestCLIPath(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	db := emptyDB(t)
	exec(t, db, "CREATE SCHEMA pgfence")
	require.NoError(t, cliMigrate(t, db, "postgres", "pgfence").Up())
	require.Contains(t, objectsIn(t, db, "pgfence"), "function pgfence_force_release")
	require.Empty(t, objectsIn(t, db, "public"))

	target := migrations.Target{URL: db.URL}
	v, dirty, err := migrations.Version(ctx, target, nil)
	require.NoError(t, err)
	require.False(t, dirty)
	require.Equal(t, migrations.Latest(), v)
	require.NoError(t, migrations.Up(ctx, target, nil))
	require.NoError(t, migrations.Down(ctx, target, nil))
	require.Empty(t, objectsIn(t, db, "pgfence"))
}

// TestUpRefusesDirty: a schema a failed CLI run left dirty is not touched.
func TestUpRefusesDirty(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	db := pgtest.NewDB(t)
	exec(t, db, "UPDATE pgfence."+migrations.Table+" SET dirty = true")
	err := migrations.Up(ctx, migrations.Target{URL: db.URL}, nil)
	require.ErrorContains(t, err, fmt.Sprintf(`schema "pgfence" is dirty at version %d`, migrations.Latest()))
	err = migrations.Down(ctx, migrations.Target{URL: db.URL}, nil)
	require.ErrorContains(t, err, "dirty")
	v, dirty, err := migrations.Version(ctx, migrations.Target{URL: db.URL}, nil)
	require.NoError(t, err)
	require.True(t, dirty)
	require.Equal(t, migrations.Latest(), v)
}

func TestMigrateUsesOwnTableAndLeavesAppTableAlone(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	db := emptyDB(t)
	// The application's own golang-migrate table, at its own version.
	exec(t, db, `CREATE TABLE schema_migrations (version bigint NOT NULL PRIMARY KEY, dirty boolean NOT NULL);
		INSERT INTO schema_migrations VALUES (42, false)`)
	require.NoError(t, migrations.Up(ctx, migrations.Target{URL: db.URL}, nil))
	require.NoError(t, migrations.Down(ctx, migrations.Target{URL: db.URL}, nil))
	var appVersion int64
	require.NoError(t, db.Pool.QueryRow(ctx, "SELECT version FROM schema_migrations").Scan(&appVersion))
	require.Equal(t, int64(42), appVersion)
}

func TestMigrateConcurrentCallers(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	db := emptyDB(t)
	var wg sync.WaitGroup
	errs := make([]error, 4)
	for i := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = migrations.Up(ctx, migrations.Target{URL: db.URL}, nil)
		}()
	}
	wg.Wait()
	for _, err := range errs {
		require.NoError(t, err)
	}
	v, _, err := migrations.Version(ctx, migrations.Target{URL: db.URL}, nil)
	require.NoError(t, err)
	require.Equal(t, migrations.Latest(), v)
}

// TestUpWaitsForCLILock: Up takes the migrate CLI's advisory lock for the
// schema, so the two never run side by side.
func TestUpWaitsForCLILock(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	db := emptyDB(t)
	id, err := database.GenerateAdvisoryLockId(db.Name, "pgfence", migrations.Table)
	require.NoError(t, err)
	holder, err := db.Pool.Acquire(ctx)
	require.NoError(t, err)
	defer holder.Release()
	_, err = holder.Exec(ctx, "SELECT pg_advisory_lock($1::bigint)", id)
	require.NoError(t, err)

	cfg, err := pgx.ParseConfig(db.URL)
	require.NoError(t, err)
	cfg.RuntimeParams["application_name"] = "pgfence-lock-test"
	done := make(chan error, 1)
	go func() { done <- migrations.Up(ctx, migrations.Target{ConnConfig: cfg}, nil) }()
	waitFor(t, db, "SELECT count(*) = 1 FROM pg_stat_activity WHERE application_name = 'pgfence-lock-test' AND wait_event_type = 'Lock' AND wait_event = 'advisory'")
	_, err = holder.Exec(ctx, "SELECT pg_advisory_unlock($1::bigint)", id)
	require.NoError(t, err)
	require.NoError(t, <-done)
}

func TestDownRemovesEverything(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	db := pgtest.NewDB(t)
	require.NotEmpty(t, objectsIn(t, db, "pgfence"))
	require.NoError(t, migrations.Down(ctx, migrations.Target{URL: db.URL}, nil))
	require.Empty(t, objectsIn(t, db, "pgfence"))
	v, dirty, err := migrations.Version(ctx, migrations.Target{URL: db.URL}, nil)
	require.NoError(t, err)
	require.Zero(t, v)
	require.False(t, dirty)
	require.NoError(t, migrations.Down(ctx, migrations.Target{URL: db.URL}, nil), "a second Down is a no-op")
	require.NoError(t, migrations.Up(ctx, migrations.Target{URL: db.URL}, nil), "and Up installs again")
}

func TestGrantSQL(t *testing.T) {
	t.Parallel()
	require.Equal(t, []string{
		`GRANT USAGE ON SCHEMA "pgfence" TO "app"`,
		`GRANT SELECT ON TABLE "pgfence"."pgfence_leases", "pgfence"."pgfence_leaders", "pgfence"."pgfence_notify_key", "pgfence"."pgfence_schema_migrations", "pgfence"."pgfence_slots", "pgfence"."pgfence_semaphores" TO "app"`,
		`GRANT EXECUTE ON FUNCTION "pgfence".pgfence_next_token(), "pgfence".pgfence_schema_version(), ` +
			`"pgfence".pgfence_acquire(pg_catalog.text[], pg_catalog.text, pg_catalog.int8[]), ` +
			`"pgfence".pgfence_release(pg_catalog.text[], pg_catalog.int8[], pg_catalog.text[], pg_catalog.int8[]), ` +
			`"pgfence".pgfence_renew(pg_catalog.text[], pg_catalog.int8[], pg_catalog.text[], pg_catalog.int8[]), ` +
			`"pgfence".pgfence_lease_held(pg_catalog.text, pg_catalog.int8, pg_catalog.text), ` +
			`"pgfence".pgfence_prune_scan(pg_catalog.text, pg_catalog.int4, pg_catalog.interval), ` +
			`"pgfence".pgfence_prune_delete(pg_catalog.text[], pg_catalog.int8[], pg_catalog.interval), ` +
			`"pgfence".pgfence_leader_proclaim(pg_catalog.text, pg_catalog.int8, pg_catalog.text, pg_catalog.text), ` +
			`"pgfence".pgfence_next_tokens(pg_catalog.bool[]), ` +
			`"pgfence".pgfence_guard(), "pgfence".pgfence_guard_strict(), "pgfence".pgfence_guard_truncate(), ` +
			`"pgfence".pgfence_last_token(), "pgfence".pgfence_present(pg_catalog.int8), ` +
			`"pgfence".pgfence_protect(pg_catalog.regclass, pg_catalog.name, pg_catalog.bool), ` +
			`"pgfence".pgfence_maintenance(pg_catalog.regclass), ` +
			`"pgfence".pgfence_fence_check(pg_catalog.text, pg_catalog.int8), ` +
			`"pgfence".pgfence_slot_begin(pg_catalog.text, pg_catalog.text, pg_catalog.int8, pg_catalog.text), ` +
			`"pgfence".pgfence_slot_finish(pg_catalog.text, pg_catalog.text, pg_catalog.int8, pg_catalog.text, pg_catalog.text, pg_catalog.text), ` +
			`"pgfence".pgfence_slots_prune(pg_catalog.interval), ` +
			`"pgfence".pgfence_acquire_permit(pg_catalog.text, pg_catalog.int4, pg_catalog.text, pg_catalog.int8), ` +
			`"pgfence".pgfence_acquire_permit(pg_catalog.text, pg_catalog.int4, pg_catalog.text, pg_catalog.int8, pg_catalog.bool), ` +
			`"pgfence".pgfence_acquire_set(pg_catalog.text[], pg_catalog.text, pg_catalog.int8[]), ` +
			`"pgfence".pgfence_claim_permit(pg_catalog.text, pg_catalog.int4, pg_catalog.text, pg_catalog.int8, pg_catalog.text, pg_catalog.bytea, pg_catalog.int8, pg_catalog.int8, pg_catalog.text), ` +
			`"pgfence".pgfence_unclaim_permit(pg_catalog.text, pg_catalog.text, pg_catalog.bool) TO "app"`,
	}, migrations.GrantSQL("", "app", nil))
	require.Equal(t, []string{
		`GRANT USAGE ON SCHEMA "we""ird" TO "svc"`,
		`GRANT EXECUTE ON FUNCTION "we""ird".pgfence_fence_check(pg_catalog.text, pg_catalog.int8), "we""ird".pgfence_schema_version() TO "svc"`,
	}, migrations.GrantSQL(`we"ird`, "svc", &migrations.GrantOpts{CheckOnly: true}))

	op := migrations.GrantSQL(`we"ird`, `Ro le`, &migrations.GrantOpts{Operator: true})
	require.Len(t, op, 5)
	require.Equal(t, `GRANT USAGE ON SCHEMA "we""ird" TO "Ro le"`, op[0])
	require.Equal(t, `GRANT EXECUTE ON FUNCTION "we""ird".pgfence_force_release(pg_catalog.text, pg_catalog.text) TO "Ro le"`, op[3])
	require.Equal(t, `GRANT SELECT ON TABLE "we""ird"."pgfence_forced_releases" TO "Ro le"`, op[4])
}

func TestGrantChecks(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	db := pgtest.NewDB(t)
	target := migrations.Target{URL: db.URL}
	require.ErrorContains(t, migrations.Grant(ctx, target, "public", nil, nil), "means every role")
	require.ErrorContains(t, migrations.Grant(ctx, target, "", nil, nil), "role name is empty")
	require.ErrorContains(t, migrations.Grant(ctx, target, strings.Repeat("r", 64), nil, nil), "longer than 63 bytes")
	requireSQLState(t, migrations.Grant(ctx, target, "pgfence_no_such_role", nil, nil), "42704")

	require.NoError(t, migrations.Down(ctx, target, nil))
	require.ErrorContains(t, migrations.Grant(ctx, target, "postgres", nil, nil), "run Up first")
	require.NoError(t, migrations.Up(ctx, target, nil))
	require.NoError(t, migrations.Grant(ctx, target, "postgres", nil, nil), "negative control: at the latest version it grants")
}
