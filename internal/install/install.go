// Package install checks, for the Lockers' constructors, that pgfence's
// schema is installed in the database as the code needs it.
package install

import (
	"context"
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"

	"github.com/pgfence/pgfence"
)

// Version is the oldest schema version (pgfence_schema_version()) this code
// works with.
const Version = 9

// TokenStep is what the token sequence steps by: one value covers a block of
// TokenStep consecutive tokens (pgfence_next_tokens).
const TokenStep = 1024

// Install is what Check found beyond what it requires.
type Install struct {
	// TokenBatch reports that pgfence_next_tokens(boolean[]) may be used:
	// always true, since every supported schema has it.
	TokenBatch bool
	// Version is the install's schema version, pgfence_schema_version():
	// Version or later.
	Version int
}

// maxIdentLen is PostgreSQL's identifier limit (NAMEDATALEN-1 bytes).
const maxIdentLen = 63

// Schema returns the schema name cfgSchema means (DefaultSchema when empty)
// and its quoted form for SQL, or an error naming field when it is not a
// valid identifier.
func Schema(field, cfgSchema string) (name, quoted string, err error) {
	name = cfgSchema
	if name == "" {
		name = pgfence.DefaultSchema
	}
	switch {
	case len(name) > maxIdentLen:
		return "", "", fmt.Errorf("%s is %d bytes long; PostgreSQL identifiers have at most %d", field, len(name), maxIdentLen)
	case !utf8.ValidString(name):
		return "", "", fmt.Errorf("%s is not valid UTF-8", field)
	case strings.IndexByte(name, 0) >= 0:
		return "", "", fmt.Errorf("%s contains a NUL byte", field)
	}
	return name, pgx.Identifier{name}.Sanitize(), nil
}

// catalogSQL reads, from the catalogs only (it takes no lock and needs no
// privilege on pgfence's objects), whether schema $1 exists, whether it has
// pgfence's lease table and version function, the token sequence's
// settings, and the other schemas that hold a pgfence lease table.
const catalogSQL = `
SELECT n.oid IS NOT NULL,
       pg_catalog.to_regclass(pg_catalog.quote_ident($1) OPERATOR(pg_catalog.||) '.pgfence_leases') IS NOT NULL,
       pg_catalog.to_regprocedure(pg_catalog.quote_ident($1) OPERATOR(pg_catalog.||) '.pgfence_schema_version()') IS NOT NULL,
       s.seqincrement, s.seqcache, s.seqcycle,
       ARRAY(
           SELECT o.nspname::pg_catalog.text FROM pg_catalog.pg_class c
           JOIN pg_catalog.pg_namespace o ON o.oid OPERATOR(pg_catalog.=) c.relnamespace
           WHERE c.relname OPERATOR(pg_catalog.=) 'pgfence_leases' AND c.relkind OPERATOR(pg_catalog.=) 'r'
             AND o.nspname OPERATOR(pg_catalog.<>) $1
           ORDER BY 1)
FROM (SELECT) AS one
LEFT JOIN pg_catalog.pg_namespace n ON n.nspname OPERATOR(pg_catalog.=) $1
LEFT JOIN pg_catalog.pg_sequence s
    ON s.seqrelid OPERATOR(pg_catalog.=) pg_catalog.to_regclass(pg_catalog.quote_ident($1) OPERATOR(pg_catalog.||) '.pgfence_leases_fence_seq')`

// Check verifies, in at most two round trips bounded by ctx, that schema
// (quoted: its SQL form) holds pgfence at Version or later and that its
// token sequence steps by TokenStep, without a cache and without cycling,
// and returns what it found. A problem is reported with an error matching
// pgfence.ErrNotInstalled that says how to fix it; a database error is
// returned wrapped.
func Check(ctx context.Context, db pgfence.DB, schema, quoted string) (Install, error) {
	var (
		hasSchema, hasTable, hasVersion bool
		increment, cache                *int64
		cycle                           *bool
		elsewhere                       []string
	)
	err := db.QueryRow(ctx, catalogSQL, schema).Scan(&hasSchema, &hasTable, &hasVersion, &increment, &cache, &cycle, &elsewhere)
	if err != nil {
		return Install{}, fmt.Errorf("check pgfence's schema %q: %w", schema, WrapPermission(err, "", schema))
	}
	fix := fmt.Sprintf("apply pgfence's migrations (pgfence migrate up --schema %s, or migrations.Up from Go)", schema)
	if !hasTable {
		where := ""
		if len(elsewhere) > 0 {
			where = fmt.Sprintf("; pgfence is installed in schema %s: set Config.Schema (--schema) to it", strings.Join(elsewhere, ", "))
			fix = ""
		}
		what := "has no pgfence_leases table"
		if !hasSchema {
			what = "does not exist"
		}
		return Install{}, notInstalled("schema %q %s%s%s", schema, what, where, prefixed("; ", fix))
	}
	if !hasVersion {
		return Install{}, notInstalled("schema %q holds a pgfence_leases table but no pgfence_schema_version(): it is not a pgfence install; %s", schema, fix)
	}
	var version int
	if err := db.QueryRow(ctx, "SELECT "+quoted+".pgfence_schema_version()").Scan(&version); err != nil {
		return Install{}, fmt.Errorf("check pgfence's schema %q: %w", schema, WrapPermission(err, "", schema))
	}
	if version < Version {
		return Install{}, notInstalled("schema %q holds pgfence schema version %d; this code needs %d: %s", schema, version, Version, fix)
	}
	const step = TokenStep
	if increment == nil || *increment != step || *cache != 1 || *cycle {
		settings := "is missing"
		if increment != nil {
			settings = fmt.Sprintf("has INCREMENT %d CACHE %d %s", *increment, *cache, map[bool]string{true: "CYCLE", false: "NO CYCLE"}[*cycle])
		}
		return Install{}, notInstalled("token sequence %s.pgfence_leases_fence_seq %s; tokens are only ordered with INCREMENT %d CACHE 1 NO CYCLE: "+
			"ALTER SEQUENCE %s.pgfence_leases_fence_seq INCREMENT %d CACHE 1 NO CYCLE (as its owner)", quoted, settings, step, quoted, step)
	}
	return Install{TokenBatch: true, Version: version}, nil
}

func prefixed(p, s string) string {
	if s == "" {
		return ""
	}
	return p + s
}

func notInstalled(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{pgfence.ErrNotInstalled}, args...)...)
}
