package demo

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/pgfence/pgfence/internal/pgserver"
	"github.com/pgfence/pgfence/migrations"
)

// DatabaseName is the database the demo creates on a throwaway cluster.
const DatabaseName = "pgfence_demo"

// AccountID is the account row the demo's workers contend for.
const AccountID = 42

// InitialBalance is the balance of the demo's account before any worker
// writes.
const InitialBalance = 100

// Database is a throwaway PostgreSQL server holding the demo's database.
type Database struct {
	// URL connects to the demo's database.
	URL string
	// BinDir is the directory of the server binaries used.
	BinDir string

	cluster *pgserver.Cluster
}

// StartDatabase starts a throwaway PostgreSQL server from the local server
// binaries (PG_BINDIR, PATH, or the newest /usr/lib/postgresql/*/bin) and
// creates the demo's database on it. The server listens only on a unix
// socket in a private directory (mode 0700), not on TCP. Call Close to stop
// the server and remove its files. ctx bounds the start.
func StartDatabase(ctx context.Context) (*Database, error) {
	binDir := pgserver.FindBinDir()
	if binDir == "" {
		return nil, errors.New("no PostgreSQL server binaries (initdb, postgres) found: " +
			"install them (apt-get install postgresql), set PG_BINDIR, or pass a database with --database or DATABASE_URL")
	}
	c, err := pgserver.StartCluster(ctx, binDir, nil)
	if err != nil {
		return nil, fmt.Errorf("start a throwaway PostgreSQL: %w", err)
	}
	conn, err := pgx.Connect(ctx, c.URL("postgres"))
	if err != nil {
		c.Destroy()
		return nil, fmt.Errorf("connect to the throwaway PostgreSQL: %w", err)
	}
	defer func() { _ = conn.Close(context.WithoutCancel(ctx)) }()
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{DatabaseName}.Sanitize()); err != nil {
		c.Destroy()
		return nil, fmt.Errorf("create the demo database: %w", err)
	}
	return &Database{URL: c.URL(DatabaseName), BinDir: binDir, cluster: c}, nil
}

// Close stops the server (immediate shutdown) and removes its files. It is
// safe to call more than once.
func (d *Database) Close() {
	if d.cluster != nil {
		d.cluster.Destroy()
		d.cluster = nil
	}
}

// The demo's schema, kept apart from the application's tables. The guard
// column is the fence package's default, fence_token. Locks the schema's
// catalog entries only.
const createSchemaSQL = `
CREATE SCHEMA IF NOT EXISTS pgfence_demo;
CREATE TABLE IF NOT EXISTS pgfence_demo.accounts (
    id          int    PRIMARY KEY,
    balance     bigint NOT NULL,
    fence_token bigint NOT NULL DEFAULT 0
)`

// Resets the demo's account, so every run starts from the same row. Locks
// that row.
const resetAccountSQL = `
INSERT INTO pgfence_demo.accounts (id, balance, fence_token) VALUES ($1, $2, 0)
ON CONFLICT (id) DO UPDATE SET balance = excluded.balance, fence_token = 0`

// Drops everything the demo created, and nothing else.
const dropSchemaSQL = `DROP SCHEMA IF EXISTS pgfence_demo CASCADE`

// AccountsTable is the demo's table, schema-qualified.
var AccountsTable = pgx.Identifier{"pgfence_demo", "accounts"}

// Prepare applies pgfence's migrations to the schema schema (empty means
// pgfence.DefaultSchema) of the database at url, creates the demo's schema
// pgfence_demo with the table accounts(id, balance, fence_token), and sets
// account [AccountID] to [InitialBalance] with token 0. Running it again
// resets the account.
func Prepare(ctx context.Context, url, schema string) error {
	if err := migrations.Up(ctx, migrations.Target{URL: url}, &migrations.Config{Schema: schema}); err != nil {
		return err
	}
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return fmt.Errorf("connect: %w", err)
	}
	defer func() { _ = conn.Close(context.WithoutCancel(ctx)) }()
	if _, err := conn.Exec(ctx, createSchemaSQL); err != nil {
		return fmt.Errorf("create the demo schema: %w", err)
	}
	if _, err := conn.Exec(ctx, resetAccountSQL, AccountID, InitialBalance); err != nil {
		return fmt.Errorf("reset the demo account: %w", err)
	}
	return nil
}

// Drop removes the demo's schema pgfence_demo from the database at url.
// pgfence's own tables are left alone.
func Drop(ctx context.Context, url string) error {
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return fmt.Errorf("connect: %w", err)
	}
	defer func() { _ = conn.Close(context.WithoutCancel(ctx)) }()
	if _, err := conn.Exec(ctx, dropSchemaSQL); err != nil {
		return fmt.Errorf("drop the demo schema: %w", err)
	}
	return nil
}
