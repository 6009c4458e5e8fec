package otelpgfence_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/goleak"

	"github.com/pgfence/pgfence/migrations"
)

// testServer and testDatabase are where the tests' pools connect: a fresh
// database, created by TestMain on the server of DATABASE_URL, migrated,
// and dropped at the end. This module cannot import pgfence's internal
// test harness, so the server comes from DATABASE_URL (.ci/otel-check
// starts a throwaway one when it is not set).
var testServer, testDatabase string

// newPool returns a pool on the test database, closed at cleanup.
func newPool(t testing.TB, maxConns int32) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(testServer)
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.Database = testDatabase
	cfg.MaxConns = maxConns
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

func TestMain(m *testing.M) {
	os.Exit(runMain(m))
}

func runMain(m *testing.M) int {
	server := os.Getenv("DATABASE_URL")
	if server == "" {
		fmt.Fprintln(os.Stderr, "otelpgfence tests need a PostgreSQL server: set DATABASE_URL (a role that may create databases), or run .ci/otel-check, which starts one")
		return 1
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	name, drop, err := createDatabase(ctx, server)
	if err != nil {
		fmt.Fprintln(os.Stderr, "otelpgfence tests:", err)
		return 1
	}
	testServer, testDatabase = server, name
	code := m.Run()
	if err := drop(); err != nil {
		fmt.Fprintln(os.Stderr, "otelpgfence tests: drop the test database:", err)
		code = 1
	}
	if code == 0 {
		if err := goleak.Find(goleak.IgnoreTopFunction("github.com/jackc/pgx/v5/pgxpool.(*Pool).backgroundHealthCheck")); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	return code
}

// createDatabase creates a database of a random name on server's cluster,
// applies pgfence's migrations to it, and returns its name and a function
// that drops it.
func createDatabase(ctx context.Context, server string) (name string, drop func() error, err error) {
	cfg, err := pgx.ParseConfig(server)
	if err != nil {
		return "", nil, err
	}
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	name = "otelpgfence_test_" + hex.EncodeToString(b)
	admin, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return "", nil, fmt.Errorf("connect to DATABASE_URL: %w", err)
	}
	defer admin.Close(context.WithoutCancel(ctx))
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
		return "", nil, err
	}
	drop = func() error {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		c, err := pgx.ConnectConfig(ctx, cfg)
		if err != nil {
			return err
		}
		defer c.Close(ctx)
		_, err = c.Exec(ctx, "DROP DATABASE "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)")
		return err
	}
	dbCfg := cfg.Copy()
	dbCfg.Database = name
	if err := migrations.Up(ctx, migrations.Target{ConnConfig: dbCfg}, nil); err != nil {
		_ = drop()
		return "", nil, fmt.Errorf("migrate %s: %w", name, err)
	}
	return name, drop, nil
}

// examplePool is newPool for Example functions: a pool on the test
// database and the function that closes it. Failures panic.
func examplePool() (*pgxpool.Pool, func()) {
	cfg, err := pgxpool.ParseConfig(testServer)
	must(err)
	cfg.ConnConfig.Database = testDatabase
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	must(err)
	return pool, pool.Close
}

// must panics on err, to keep the examples short.
func must(err error) {
	if err != nil {
		panic(err)
	}
}
