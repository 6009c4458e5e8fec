// Package migrator applies, reverts and reports pgfence's embedded migrations
// with golang-migrate, always in pgfence's own migrations table. It backs
// pgfence.Migrate and the pgfence command's migrate subcommand.
package migrator

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/golang-migrate/migrate/v4"
	migratepgx "github.com/golang-migrate/migrate/v4/database/pgx/v5"
	"github.com/golang-migrate/migrate/v4/source/iofs"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/pgfence/pgfence/migrations"
)

// Up applies every pending migration. It returns nil when none is pending.
// ctx bounds the run: when it ends, Up stops after the migration in progress
// and returns an error wrapping ctx.Err().
func Up(ctx context.Context, databaseURL string) error {
	return run(ctx, databaseURL, "migrate", func(m *migrate.Migrate) error { return m.Up() })
}

// Down reverts every applied migration, removing all that Up created. It
// returns nil when none is applied.
func Down(ctx context.Context, databaseURL string) error {
	return run(ctx, databaseURL, "migrate down", func(m *migrate.Migrate) error { return m.Down() })
}

// Version reports the version of the last applied migration (0 when none is
// applied) and whether a failed migration left the schema dirty.
func Version(ctx context.Context, databaseURL string) (version uint, dirty bool, err error) {
	err = run(ctx, databaseURL, "migrate version", func(m *migrate.Migrate) error {
		var verr error
		version, dirty, verr = m.Version()
		if errors.Is(verr, migrate.ErrNilVersion) {
			return nil
		}
		return verr
	})
	return version, dirty, err
}

// Latest is the version of the newest embedded migration.
func Latest() (uint, error) {
	src, err := iofs.New(migrations.FS, ".")
	if err != nil {
		return 0, fmt.Errorf("pgfence: open embedded migrations: %w", err)
	}
	defer src.Close()
	v, err := src.First()
	if err != nil {
		return 0, fmt.Errorf("pgfence: read embedded migrations: %w", err)
	}
	for {
		next, err := src.Next(v)
		if err != nil {
			return v, nil
		}
		v = next
	}
}

func run(ctx context.Context, databaseURL, what string, f func(*migrate.Migrate) error) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("pgfence: %s: %w", what, err)
	}
	m, err := open(databaseURL)
	if err != nil {
		return fmt.Errorf("pgfence: %s: %w", what, err)
	}
	defer func() {
		// Close errors only report failures to close the source and the
		// connection; nothing is left half-applied by them.
		_, _ = m.Close()
	}()

	done := make(chan struct{})
	defer close(done)
	go func() {
		select {
		case <-ctx.Done():
			select {
			case m.GracefulStop <- true:
			default:
			}
		case <-done:
		}
	}()

	err = f(m)
	if errors.Is(err, migrate.ErrNoChange) {
		err = nil
	}
	if err == nil && ctx.Err() != nil {
		// GracefulStop makes golang-migrate return nil with work left.
		err = ctx.Err()
	}
	if err != nil {
		return fmt.Errorf("pgfence: %s: %w", what, err)
	}
	return nil
}

// open starts golang-migrate on databaseURL with the embedded migrations and
// pgfence's own migrations table. The URL is parsed by pgx, so every form pgx
// accepts works, with its TLS and PG* environment settings.
func open(databaseURL string) (*migrate.Migrate, error) {
	if strings.TrimSpace(databaseURL) == "" {
		return nil, errors.New("empty database URL")
	}
	cfg, err := pgx.ParseConfig(databaseURL)
	if err != nil {
		return nil, fmt.Errorf("parse database URL: %w", err)
	}
	src, err := iofs.New(migrations.FS, ".")
	if err != nil {
		return nil, fmt.Errorf("open embedded migrations: %w", err)
	}
	sqlDB := stdlib.OpenDB(*cfg)
	db, err := migratepgx.WithInstance(sqlDB, &migratepgx.Config{MigrationsTable: migrations.Table})
	if err != nil {
		_ = src.Close()
		_ = sqlDB.Close()
		return nil, fmt.Errorf("connect: %w", err)
	}
	m, err := migrate.NewWithInstance("iofs", src, "pgx5", db)
	if err != nil {
		_ = src.Close()
		_ = db.Close()
		return nil, err
	}
	return m, nil
}
