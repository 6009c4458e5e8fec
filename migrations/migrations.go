package migrations

import (
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"slices"
	"strings"

	"github.com/golang-migrate/migrate/v4/source"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence"
)

// FS holds the migration files, in golang-migrate's format
// (NNNNNN_name.up.sql and NNNNNN_name.down.sql), for the migrate CLI or
// golang-migrate's iofs source driver.
//
//go:embed *.sql
var FS embed.FS

// Table is the table, in the install's schema, in which pgfence's migrations
// record their version: not golang-migrate's default, so it never collides
// with the application's own. Pass it to the migrate CLI as
// x-migrations-table.
const Table = "pgfence_schema_migrations"

// defaultSchema is the schema used when [Config] names none.
const defaultSchema = pgfence.DefaultSchema

// Target says which database to migrate. Exactly one field must be set.
type Target struct {
	// URL is a connection string in any form pgx accepts (URL or
	// keyword/value), with its TLS and PG* environment settings.
	URL string
	// ConnConfig is a parsed connection configuration. It is copied, never
	// changed.
	ConnConfig *pgx.ConnConfig
	// Pool is a pool to take one connection from for the run. The
	// connection is given back with its session settings as they were, or
	// closed when the run fails; the pool itself is never closed or
	// reconfigured.
	Pool *pgxpool.Pool
}

// Config chooses where pgfence is installed. A nil *Config is the same as
// the zero Config.
type Config struct {
	// Schema is the schema pgfence's objects live in. Empty means
	// "pgfence" (pgfence.DefaultSchema). It is used as an identifier,
	// quoted: "PgFence" and "pgfence" are different schemas. It must be at
	// most 63 bytes and contain no NUL.
	Schema string
}

// schema returns the configured schema or the default, validated.
func (c *Config) schema() (string, error) {
	s := defaultSchema
	if c != nil && c.Schema != "" {
		s = c.Schema
	}
	if err := checkIdentifier("schema", s); err != nil {
		return "", err
	}
	return s, nil
}

// checkIdentifier rejects a name PostgreSQL would not keep as given: it
// truncates identifiers to 63 bytes, and a NUL cannot be sent at all.
func checkIdentifier(what, name string) error {
	switch {
	case name == "":
		return fmt.Errorf("the %s name is empty", what)
	case len(name) > 63:
		return fmt.Errorf("the %s name %q is longer than 63 bytes, which PostgreSQL would truncate", what, name)
	case strings.IndexByte(name, 0) >= 0:
		return fmt.Errorf("the %s name %q contains a NUL byte", what, name)
	}
	return nil
}

// migration is one version of the embedded migrations.
type migration struct {
	version    uint
	identifier string
	up, down   string
}

// load reads the embedded migrations, in version order, with golang-migrate's
// file name rules.
func load() ([]migration, error) {
	entries, err := fs.ReadDir(FS, ".")
	if err != nil {
		return nil, err
	}
	byVersion := map[uint]*migration{}
	for _, e := range entries {
		if e.IsDir() {
			continue
		}
		m, err := source.Parse(e.Name())
		if err != nil {
			continue // not a migration file
		}
		body, err := FS.ReadFile(e.Name())
		if err != nil {
			return nil, err
		}
		mg := byVersion[m.Version]
		if mg == nil {
			mg = &migration{version: m.Version, identifier: m.Identifier}
			byVersion[m.Version] = mg
		}
		switch m.Direction {
		case source.Up:
			mg.up = string(body)
		case source.Down:
			mg.down = string(body)
		}
	}
	out := make([]migration, 0, len(byVersion))
	for _, m := range byVersion {
		if m.up == "" || m.down == "" {
			return nil, fmt.Errorf("migration %d (%s) lacks its up or down file", m.version, m.identifier)
		}
		out = append(out, *m)
	}
	slices.SortFunc(out, func(a, b migration) int { return int(a.version) - int(b.version) })
	if len(out) == 0 {
		return nil, errors.New("no migration files are embedded")
	}
	return out, nil
}

// Latest returns the version of the newest embedded migration: the version
// [Up] migrates to.
func Latest() uint {
	ms, err := load()
	if err != nil {
		// The files are embedded: the package's tests catch this.
		return 0
	}
	return ms[len(ms)-1].version
}
