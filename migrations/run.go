package migrations

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/golang-migrate/migrate/v4/database"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgfence/pgfence/internal/install"
)

// cleanupTimeout bounds the statements that tidy up after a run, which run
// even when ctx has ended.
const cleanupTimeout = 5 * time.Second

// Up creates the schema when it does not exist (which needs CREATE on the
// database) and applies the pending migration to it, as current_user, which
// owns every object it creates. At [Latest] it only reads, without the
// migrations lock, so an application role with what [Grant] gives can call
// it at start-up; it still checks who owns the schema and its objects.
//
// Before changing anything Up refuses: a second install in another schema
// of the database; a schema that current_user does not own, or that holds
// an object another role owns; an install owned by another role, naming
// it; a dirty schema; and one migrated by a newer pgfence. Runs on one
// schema are serialised with the migrate CLI's advisory lock.
//
// ctx bounds everything, connecting included. When ctx ends the statement
// in progress is cancelled, the migration rolled back, and the error wraps
// ctx.Err().
func Up(ctx context.Context, t Target, cfg *Config) error {
	return up(ctx, t, cfg, nil)
}

// testHooks change a run for the package's tests; nil in production.
type testHooks struct {
	skipOwnerCheck bool // Up installs whoever owns the schema and its objects
	skipGrantCheck bool // Grant does not check what it granted
}

func up(ctx context.Context, t Target, cfg *Config, h *testHooks) error {
	return run(ctx, t, cfg, "up", func(r *runner) error {
		v, dirty, err := r.readOnlyVersion()
		if err != nil {
			return err
		}
		if v == Latest() && !dirty {
			return r.checkUpToDate(h)
		}
		if err := r.lock(); err != nil {
			return err
		}
		if err := r.refuseSecondInstall(); err != nil {
			return err
		}
		// A dirty or newer schema is refused by r.up before any change.
		if (h == nil || !h.skipOwnerCheck) && !dirty && v < Latest() {
			if err := r.checkInstaller(v); err != nil {
				return err
			}
		}
		if err := r.createSchema(); err != nil {
			return err
		}
		if err := r.setSearchPath(); err != nil {
			return err
		}
		if err := r.ensureTable(); err != nil {
			return err
		}
		return r.up()
	})
}

// Down reverts the applied migration, then drops the [Table], leaving no
// pgfence object; the schema stays. It returns nil when nothing is applied,
// and refuses a dirty schema or one migrated by a newer pgfence. Dropping
// pgfence_guard fails while a table's trigger uses it: drop those first.
// ctx bounds everything as for [Up].
func Down(ctx context.Context, t Target, cfg *Config) error {
	return run(ctx, t, cfg, "down", func(r *runner) error {
		if err := r.setSearchPath(); err != nil {
			return err
		}
		return r.down()
	})
}

// Version reports the version applied to the schema (0 when none is, or
// when the schema or its [Table] does not exist) and whether a failed run
// of the migrate CLI left it dirty. It only reads, so any role [Grant] was
// run for can call it; a missing privilege fails with a *pgconn.PgError
// (SQLSTATE 42501) whose message names the grant. ctx bounds everything.
func Version(ctx context.Context, t Target, cfg *Config) (version uint, dirty bool, err error) {
	err = run(ctx, t, cfg, "version", func(r *runner) error {
		version, dirty, err = r.readOnlyVersion()
		return err
	})
	return version, dirty, err
}

// readOnlyVersion reads the version in a read-only transaction; a missing
// privilege is explained.
func (r *runner) readOnlyVersion() (uint, bool, error) {
	tx, err := r.conn.BeginTx(r.ctx, pgx.TxOptions{AccessMode: pgx.ReadOnly})
	if err != nil {
		return 0, false, err
	}
	defer r.rollback(tx)
	v, dirty, err := readVersion(r.ctx, tx, r.schema)
	if err != nil {
		r.rollback(tx)
		return 0, false, r.explainDenied(err, []privilege{
			{"schema", pgx.Identifier{r.schema}.Sanitize(), "USAGE"},
			{"table", r.table(), "SELECT"},
		})
	}
	return v, dirty, nil
}

// runner is one run of Up, Down or Version on one connection.
type runner struct {
	ctx    context.Context
	conn   *pgx.Conn
	schema string
	// database is current_database(), for the advisory lock's key.
	database string
	// role is current_user: the role that owns what the run creates.
	role string
	// oldSearchPath is the session's search_path before the run changed
	// it, restored when the run ends; nil when it was not changed.
	oldSearchPath *string
	locked        bool
}

// cleanupCtx bounds a statement that must run even after ctx ended.
func (r *runner) cleanupCtx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(r.ctx), cleanupTimeout)
}

// rollback ends tx unless it was committed.
func (r *runner) rollback(tx pgx.Tx) {
	ctx, cancel := r.cleanupCtx()
	defer cancel()
	_ = tx.Rollback(ctx)
}

// run connects to t, runs f and cleans up. Errors are prefixed with
// "pgfence: migrations: what: " and wrap ctx.Err() when ctx ended.
func run(ctx context.Context, t Target, cfg *Config, what string, f func(*runner) error) (err error) {
	defer func() {
		if err == nil {
			return
		}
		if cerr := ctx.Err(); cerr != nil && !errors.Is(err, cerr) {
			err = fmt.Errorf("%w: %w", cerr, err)
		}
		err = fmt.Errorf("pgfence: migrations: %s: %w", what, err)
	}()
	schema, err := cfg.schema()
	if err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	conn, release, err := t.connect(ctx)
	if err != nil {
		return err
	}
	r := &runner{ctx: ctx, conn: conn, schema: schema}

	// When ctx ends pgx closes the connection; cancel the statement too, so
	// the server stops running it. A connection a cancel was sent on never
	// goes back to a pool: the cancel could reach what it runs next.
	cancelled := make(chan struct{})
	stop := context.AfterFunc(ctx, func() {
		defer close(cancelled)
		cctx, cancel := context.WithTimeout(context.Background(), cleanupTimeout)
		defer cancel()
		_ = conn.PgConn().CancelRequest(cctx)
	})
	defer func() {
		fired := !stop()
		if fired {
			<-cancelled
		}
		release(err == nil && !fired)
	}()

	if err := conn.QueryRow(ctx, "SELECT pg_catalog.current_database(), current_user").Scan(&r.database, &r.role); err != nil {
		return err
	}
	if what == "down" || what == "grant" { // Up locks once it knows it has work
		if err := r.lock(); err != nil {
			return err
		}
	}
	err = f(r)
	if cerr := r.finish(err == nil); err == nil {
		err = cerr
	}
	return err
}

// finish undoes the session changes of the run: it releases the advisory
// lock and restores the search_path, so a pooled connection goes back as it
// came. It is skipped when the run failed: the connection is closed then.
func (r *runner) finish(ok bool) error {
	if !ok || r.conn.IsClosed() {
		return nil
	}
	ctx, cancel := r.cleanupCtx()
	defer cancel()
	if r.locked {
		if _, err := r.conn.Exec(ctx, "SELECT pg_catalog.pg_advisory_unlock($1)", r.lockKey()); err != nil {
			return fmt.Errorf("release the migrations lock: %w", err)
		}
	}
	if r.oldSearchPath != nil {
		if _, err := r.conn.Exec(ctx, "SELECT pg_catalog.set_config('search_path', $1, false)", *r.oldSearchPath); err != nil {
			return fmt.Errorf("restore search_path: %w", err)
		}
	}
	return nil
}

// connect opens the run's connection. release gives it back: to the pool
// when ok, else closed (a failed run may leave a lock or a setting behind).
func (t Target) connect(ctx context.Context) (conn *pgx.Conn, release func(ok bool), err error) {
	n := 0
	if t.URL != "" {
		n++
	}
	if t.ConnConfig != nil {
		n++
	}
	if t.Pool != nil {
		n++
	}
	if n != 1 {
		return nil, nil, fmt.Errorf("the Target must set exactly one of URL, ConnConfig and Pool (%d are set)", n)
	}
	closeConn := func(c *pgx.Conn) {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
		defer cancel()
		_ = c.Close(ctx)
	}
	switch {
	case t.Pool != nil:
		pc, err := t.Pool.Acquire(ctx)
		if err != nil {
			return nil, nil, fmt.Errorf("acquire a connection from the pool: %w", err)
		}
		return pc.Conn(), func(ok bool) {
			if !ok {
				closeConn(pc.Conn()) // the pool discards a closed connection
			}
			pc.Release()
		}, nil
	default:
		var cc *pgx.ConnConfig
		if t.ConnConfig != nil {
			cc = t.ConnConfig.Copy()
		} else {
			if strings.TrimSpace(t.URL) == "" {
				return nil, nil, errors.New("the database URL is empty")
			}
			if cc, err = pgx.ParseConfig(t.URL); err != nil {
				return nil, nil, fmt.Errorf("parse the database URL: %w", err)
			}
		}
		c, err := pgx.ConnectConfig(ctx, cc)
		if err != nil {
			return nil, nil, fmt.Errorf("connect: %w", err)
		}
		return c, func(bool) { closeConn(c) }, nil
	}
}

// lockKey is the advisory lock golang-migrate's PostgreSQL drivers take for
// this schema and table, so Up and Down never run beside the migrate CLI on
// the same install.
func (r *runner) lockKey() int64 {
	id, _ := database.GenerateAdvisoryLockId(r.database, r.schema, Table)
	key, _ := strconv.ParseInt(id, 10, 64)
	return key
}

// lock takes the migrations lock, waiting for any other run to end.
func (r *runner) lock() error {
	if _, err := r.conn.Exec(r.ctx, "SELECT pg_catalog.pg_advisory_lock($1)", r.lockKey()); err != nil {
		return fmt.Errorf("take the migrations lock: %w", err)
	}
	r.locked = true
	return nil
}

// refuseSecondInstall fails when another schema of the database already
// holds pgfence. Temporary tables are ignored: any role may create one.
const otherInstallsSQL = `
SELECT n.nspname FROM pg_catalog.pg_class c
JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
WHERE c.relname = 'pgfence_leases' AND c.relkind IN ('r', 'p')
  AND n.nspname <> $1 AND n.nspname !~ '^pg_(toast_)?temp_'
ORDER BY n.nspname`

func (r *runner) refuseSecondInstall() error {
	rows, err := r.conn.Query(r.ctx, otherInstallsSQL, r.schema)
	if err != nil {
		return err
	}
	others, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return err
	}
	if len(others) > 0 {
		return fmt.Errorf("pgfence is already installed in schema %q of this database; "+
			"a second install in schema %q would draw tokens from a second sequence: migrate schema %q instead (Config.Schema)",
			others[0], r.schema, others[0])
	}
	return nil
}

// explainDenied adds to a permission error (SQLSTATE 42501) which of privs
// current_user lacks; other errors are returned as they are. The failed
// transaction must have ended.
func (r *runner) explainDenied(err error, privs []privilege) error {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != install.InsufficientPrivilege {
		return err
	}
	lacking, qerr := missingPrivileges(r.ctx, r.conn, r.role, privs)
	if qerr != nil || len(lacking) == 0 {
		return install.WrapPermission(err, r.role, r.schema)
	}
	return install.WrapPermission(err, r.role, r.schema, lacking...)
}

// installOwnerSQL reads the role that owns the install: the owner of its
// version table; no row when it does not exist.
const installOwnerSQL = `
SELECT pg_catalog.pg_get_userbyid(c.relowner) FROM pg_catalog.pg_class c
JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = $1 AND c.relname = $2`

// installOwner returns the role that owns the install, or "" when there is
// none.
func (r *runner) installOwner() (string, error) {
	var owner string
	err := r.conn.QueryRow(r.ctx, installOwnerSQL, r.schema, Table).Scan(&owner)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", nil
	}
	return owner, err
}

// checkInstaller refuses a run of Up by a role other than the owner of the
// install, which is at version v, then checks the schema as
// [runner.checkOwners] does for current_user.
func (r *runner) checkInstaller(v uint) error {
	owner, err := r.installOwner()
	if err != nil {
		return err
	}
	if owner != "" && owner != r.role {
		return fmt.Errorf("pgfence in schema %q is at version %d, not %d, and is owned by role %q, not %q: "+
			"run migrations (pgfence migrate up) as %q", r.schema, v, Latest(), owner, r.role, owner)
	}
	return r.checkOwners(r.role)
}

// schemaOwnerSQL reads the owner of the schema and whether it is role $2,
// directly or as pg_database_owner of a database that role owns (schema
// public since PostgreSQL 15); no row when the schema does not exist.
const schemaOwnerSQL = `
SELECT pg_catalog.pg_get_userbyid(n.nspowner),
       n.nspowner = r.oid OR (d.datdba = r.oid AND n.nspowner =
           (SELECT a.oid FROM pg_catalog.pg_roles a WHERE a.rolname = 'pg_database_owner')) IS TRUE
FROM pg_catalog.pg_namespace n, pg_catalog.pg_roles r, pg_catalog.pg_database d
WHERE n.nspname = $1 AND r.rolname = $2 AND d.datname = pg_catalog.current_database()`

// foreignObjectsSQL lists the first objects in schema $1 that role $2 does
// not own, with their owners: any of them can shadow or replace pgfence's.
const foreignObjectsSQL = `
WITH s AS (SELECT oid FROM pg_catalog.pg_namespace WHERE nspname = $1),
o AS (
    SELECT CASE c.relkind WHEN 'S' THEN 'sequence' WHEN 'v' THEN 'view' WHEN 'm' THEN 'materialized view'
           WHEN 'i' THEN 'index' WHEN 'I' THEN 'index' WHEN 'c' THEN 'type' WHEN 'f' THEN 'foreign table'
           ELSE 'table' END AS kind, c.relname::text AS name, c.relowner AS owner
    FROM pg_catalog.pg_class c WHERE c.relnamespace = (SELECT oid FROM s)
    UNION ALL SELECT 'function', p.oid::pg_catalog.regprocedure::text, p.proowner
    FROM pg_catalog.pg_proc p WHERE p.pronamespace = (SELECT oid FROM s)
    UNION ALL SELECT 'type', t.typname::text, t.typowner
    FROM pg_catalog.pg_type t WHERE t.typnamespace = (SELECT oid FROM s)
    UNION ALL SELECT 'operator', op.oid::pg_catalog.regoperator::text, op.oprowner
    FROM pg_catalog.pg_operator op WHERE op.oprnamespace = (SELECT oid FROM s)
    UNION ALL SELECT 'collation', co.collname::text, co.collowner
    FROM pg_catalog.pg_collation co WHERE co.collnamespace = (SELECT oid FROM s)
    UNION ALL SELECT 'conversion', cv.conname::text, cv.conowner
    FROM pg_catalog.pg_conversion cv WHERE cv.connamespace = (SELECT oid FROM s)
    UNION ALL SELECT 'operator class', oc.opcname::text, oc.opcowner
    FROM pg_catalog.pg_opclass oc WHERE oc.opcnamespace = (SELECT oid FROM s)
    UNION ALL SELECT 'operator family', of.opfname::text, of.opfowner
    FROM pg_catalog.pg_opfamily of WHERE of.opfnamespace = (SELECT oid FROM s)
    UNION ALL SELECT 'text search configuration', tc.cfgname::text, tc.cfgowner
    FROM pg_catalog.pg_ts_config tc WHERE tc.cfgnamespace = (SELECT oid FROM s)
    UNION ALL SELECT 'text search dictionary', td.dictname::text, td.dictowner
    FROM pg_catalog.pg_ts_dict td WHERE td.dictnamespace = (SELECT oid FROM s)
    UNION ALL SELECT 'statistics object', se.stxname::text, se.stxowner
    FROM pg_catalog.pg_statistic_ext se WHERE se.stxnamespace = (SELECT oid FROM s)
)
SELECT o.kind, o.name, pg_catalog.pg_get_userbyid(o.owner) FROM o
WHERE o.owner <> (SELECT r.oid FROM pg_catalog.pg_roles r WHERE r.rolname = $2)
ORDER BY 1, 2 LIMIT 5`

// checkOwners refuses a schema that exists and is not owned by owner, or
// that holds an object owner does not own: the owner of either may drop
// and replace pgfence's functions.
func (r *runner) checkOwners(owner string) error {
	s := pgx.Identifier{r.schema}.Sanitize()
	var found string
	var ok bool
	err := r.conn.QueryRow(r.ctx, schemaOwnerSQL, r.schema, owner).Scan(&found, &ok)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil // Up creates it
	}
	if err != nil {
		return fmt.Errorf("read the owner of schema %q: %w", r.schema, err)
	}
	if !ok {
		return fmt.Errorf("schema %q is owned by role %q, not %q (pgfence's owner): "+
			"drop it or ALTER SCHEMA %s OWNER TO %s, then run migrate up as its owner",
			r.schema, found, owner, s, pgx.Identifier{owner}.Sanitize())
	}
	rows, err := r.conn.Query(r.ctx, foreignObjectsSQL, r.schema, owner)
	if err != nil {
		return fmt.Errorf("read the owners of the objects in schema %q: %w", r.schema, err)
	}
	var objs []string
	var kind, name, by string
	if _, err := pgx.ForEachRow(rows, []any{&kind, &name, &by}, func() error {
		objs = append(objs, fmt.Sprintf("%s %s owned by role %q", kind, name, by))
		return nil
	}); err != nil {
		return fmt.Errorf("read the owners of the objects in schema %q: %w", r.schema, err)
	}
	if len(objs) > 0 {
		return fmt.Errorf("schema %q holds objects not owned by role %q, pgfence's owner (%s): "+
			"the role that owns one could shadow or replace pgfence's functions; drop them, then run migrate up as %q",
			r.schema, owner, strings.Join(objs, "; "), owner)
	}
	return nil
}

// checkUpToDate checks, for an install at [Latest], that the install's
// owner owns the schema and everything in it.
func (r *runner) checkUpToDate(h *testHooks) error {
	if h != nil && h.skipOwnerCheck {
		return nil
	}
	owner, err := r.installOwner()
	if err != nil {
		return err
	}
	return r.checkOwners(owner)
}

// createSchema creates the schema unless it exists (checked first: CREATE
// SCHEMA IF NOT EXISTS needs CREATE on the database even then).
func (r *runner) createSchema() error {
	var exists bool
	if err := r.conn.QueryRow(r.ctx,
		"SELECT EXISTS (SELECT FROM pg_catalog.pg_namespace WHERE nspname = $1)", r.schema).Scan(&exists); err != nil {
		return err
	}
	if exists {
		return nil
	}
	if _, err := r.conn.Exec(r.ctx, "CREATE SCHEMA IF NOT EXISTS "+pgx.Identifier{r.schema}.Sanitize()); err != nil {
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == install.InsufficientPrivilege {
			return fmt.Errorf("create schema %q: %w; hint: role %q needs CREATE on database %q, or a schema created for it "+
				"(CREATE SCHEMA %s AUTHORIZATION %s)", r.schema, err, r.role, r.database,
				pgx.Identifier{r.schema}.Sanitize(), pgx.Identifier{r.role}.Sanitize())
		}
		return fmt.Errorf("create schema %q: %w", r.schema, err)
	}
	return nil
}

// setSearchPath makes the schema the session's only schema: the migration
// files create their objects in current_schema().
func (r *runner) setSearchPath() error {
	var old string
	if err := r.conn.QueryRow(r.ctx, "SELECT pg_catalog.current_setting('search_path')").Scan(&old); err != nil {
		return err
	}
	r.oldSearchPath = &old
	if _, err := r.conn.Exec(r.ctx, "SELECT pg_catalog.set_config('search_path', $1, false)",
		pgx.Identifier{r.schema}.Sanitize()); err != nil {
		return fmt.Errorf("set search_path: %w", err)
	}
	return nil
}

func (r *runner) table() string { return pgx.Identifier{r.schema, Table}.Sanitize() }

// ensureTable creates the version table, as golang-migrate does, unless it
// exists.
func (r *runner) ensureTable() error {
	exists, err := tableExists(r.ctx, r.conn, r.schema)
	if err != nil || exists {
		return err
	}
	if _, err := r.conn.Exec(r.ctx, "CREATE TABLE IF NOT EXISTS "+r.table()+
		" (version bigint NOT NULL PRIMARY KEY, dirty boolean NOT NULL)"); err != nil {
		return fmt.Errorf("create %s: %w", r.table(), err)
	}
	return nil
}

// querier is what readVersion needs: a connection or a transaction.
type querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

func tableExists(ctx context.Context, q querier, schema string) (bool, error) {
	var exists bool
	err := q.QueryRow(ctx, `SELECT EXISTS (
    SELECT FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
    WHERE n.nspname = $1 AND c.relname = $2)`, schema, Table).Scan(&exists)
	return exists, err
}

// readVersion reads the version table; a missing table or an empty one is
// version 0.
func readVersion(ctx context.Context, q querier, schema string) (uint, bool, error) {
	exists, err := tableExists(ctx, q, schema)
	if err != nil || !exists {
		return 0, false, err
	}
	var v int64
	var dirty bool
	err = q.QueryRow(ctx, "SELECT version, dirty FROM "+pgx.Identifier{schema, Table}.Sanitize()+" LIMIT 1").Scan(&v, &dirty)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, fmt.Errorf("read the version: %w", err)
	}
	if v < 0 {
		return 0, dirty, nil // golang-migrate's "no version", recorded dirty by a failed first migration
	}
	return uint(v), dirty, nil
}

// current reads the version for a run that changes it, refusing a dirty
// schema and one newer than these migrations.
func (r *runner) current(ms []migration) (uint, error) {
	v, dirty, err := readVersion(r.ctx, r.conn, r.schema)
	if err != nil {
		return 0, err
	}
	if dirty {
		return 0, fmt.Errorf("schema %q is dirty at version %d: a migration run by another tool failed part-way; "+
			"repair the schema by hand, then record the version with the migrate CLI's force command", r.schema, v)
	}
	if latest := ms[len(ms)-1].version; v > latest {
		return 0, fmt.Errorf("schema %q is at version %d, newer than this pgfence's latest migration %d", r.schema, v, latest)
	}
	return v, nil
}

// up applies the migrations after the current version, each in its own
// transaction with the new version.
func (r *runner) up() error {
	ms, err := load()
	if err != nil {
		return err
	}
	v, err := r.current(ms)
	if err != nil {
		return err
	}
	for _, m := range ms {
		if m.version > v {
			if err := r.apply(m.version, m.identifier, "up", m.up, int64(m.version)); err != nil {
				return err
			}
		}
	}
	return nil
}

// down reverts the applied migrations, newest first, then drops the version
// table.
func (r *runner) down() error {
	ms, err := load()
	if err != nil {
		return err
	}
	exists, err := tableExists(r.ctx, r.conn, r.schema)
	if err != nil || !exists {
		return err
	}
	v, err := r.current(ms)
	if err != nil {
		return err
	}
	for i := len(ms) - 1; i >= 0; i-- {
		m := ms[i]
		if m.version > v {
			continue
		}
		prev := int64(-1)
		if i > 0 {
			prev = int64(ms[i-1].version)
		}
		if err := r.apply(m.version, m.identifier, "down", m.down, prev); err != nil {
			return err
		}
	}
	if _, err := r.conn.Exec(r.ctx, "DROP TABLE IF EXISTS "+r.table()); err != nil {
		return fmt.Errorf("drop %s: %w", r.table(), err)
	}
	return nil
}

// apply runs one migration file and records version next (none when
// negative) in one transaction. The file is sent as one simple-protocol
// query, as the migrate CLI sends it.
func (r *runner) apply(version uint, identifier, direction, body string, next int64) error {
	tx, err := r.conn.Begin(r.ctx)
	if err != nil {
		return err
	}
	defer r.rollback(tx)
	if _, err := tx.Exec(r.ctx, body); err != nil {
		return fmt.Errorf("migration %06d_%s.%s.sql: %w", version, identifier, direction, err)
	}
	if _, err := tx.Exec(r.ctx, "DELETE FROM "+r.table()); err != nil {
		return fmt.Errorf("record the version: %w", err)
	}
	if next >= 0 {
		if _, err := tx.Exec(r.ctx, "INSERT INTO "+r.table()+" (version, dirty) VALUES ($1, false)", next); err != nil {
			return fmt.Errorf("record the version: %w", err)
		}
	}
	if err := tx.Commit(r.ctx); err != nil {
		return fmt.Errorf("migration %06d_%s.%s.sql: commit: %w", version, identifier, direction, err)
	}
	return nil
}
