package migrations

import (
	"context"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
)

// GrantOpts changes what [Grant] gives a role. A nil *GrantOpts is the same
// as the zero GrantOpts.
type GrantOpts struct {
	// Operator also lets the role force-release any lease
	// (pgfence_force_release) and read the audit log of forced releases
	// (pgfence_forced_releases). Give it to the people or tools that run
	// `pgfence release --force`, not to the application.
	Operator bool
}

// leadersSince is the migration that adds pgfence_leaders (package leader),
// which the application role may read.
const leadersSince = 5

// grantedFunction is a function the application role may execute, from the
// migration that installs it on.
type grantedFunction struct {
	since     uint
	signature string // name(argument types), types qualified
}

// appFunctions are the functions an application role executes. Every other
// write to pgfence_leases (and pgfence_leaders) goes through them; the role
// gets no privilege on the tables but SELECT, and none on the sequence.
var appFunctions = []grantedFunction{
	{3, "pgfence_next_token()"},
	{3, "pgfence_schema_version()"},
	{3, "pgfence_acquire(pg_catalog.text[], pg_catalog.text, pg_catalog.int8[])"},
	{3, "pgfence_release(pg_catalog.text[], pg_catalog.int8[], pg_catalog.int8[], pg_catalog.text)"},
	{3, "pgfence_renew(pg_catalog.text[], pg_catalog.int8[], pg_catalog.int8[])"},
	{3, "pgfence_lease_held(pg_catalog.text, pg_catalog.int8)"},
	{3, "pgfence_prune_scan(pg_catalog.text, pg_catalog.int4, pg_catalog.interval)"},
	{3, "pgfence_prune_delete(pg_catalog.text[], pg_catalog.int8[], pg_catalog.interval)"},
	{5, "pgfence_leader_proclaim(pg_catalog.text, pg_catalog.int8, pg_catalog.text, pg_catalog.text)"},
	{9, "pgfence_next_tokens(pg_catalog.bool[])"},
	// Trigger functions: EXECUTE is checked when a trigger is created with
	// them, and pgfence_last_token is called by the strict trigger as the
	// writing role.
	{2, "pgfence_guard()"},
	{4, "pgfence_guard_strict()"},
	{4, "pgfence_guard_truncate()"},
	{4, "pgfence_last_token()"},
}

// operatorFunction is what GrantOpts.Operator adds.
const operatorFunction = "pgfence_force_release(pg_catalog.text, pg_catalog.text)"

// GrantSQL returns the statements [Grant] runs to let role use the pgfence
// install in schema (empty means "pgfence"), with every identifier quoted and
// every type schema-qualified, for the functions of the latest migration
// ([Latest]):
//
//   - USAGE on the schema;
//   - SELECT on pgfence_leases (listing leases) and pgfence_leaders
//     (reading who leads an election);
//   - EXECUTE on pgfence_next_token, pgfence_next_tokens,
//     pgfence_schema_version, pgfence_acquire, pgfence_release,
//     pgfence_renew, pgfence_lease_held, pgfence_prune_scan,
//     pgfence_prune_delete, pgfence_leader_proclaim and the trigger
//     functions;
//   - with Operator: EXECUTE on pgfence_force_release and SELECT on
//     pgfence_forced_releases.
//
// Nothing on the sequence, and no INSERT, UPDATE, DELETE or TRUNCATE on the
// table: the functions make every write. GrantSQL does not validate its
// arguments; [Grant] does.
func GrantSQL(schema, role string, opts *GrantOpts) []string {
	if schema == "" {
		schema = defaultSchema
	}
	s := pgx.Identifier{schema}.Sanitize()
	to := " TO " + pgx.Identifier{role}.Sanitize()
	latest := Latest()
	var fns []string
	for _, f := range appFunctions {
		if f.since <= latest {
			fns = append(fns, s+"."+f.signature)
		}
	}
	tables := []string{pgx.Identifier{schema, "pgfence_leases"}.Sanitize()}
	if latest >= leadersSince {
		tables = append(tables, pgx.Identifier{schema, "pgfence_leaders"}.Sanitize())
	}
	stmts := []string{
		"GRANT USAGE ON SCHEMA " + s + to,
		"GRANT SELECT ON TABLE " + strings.Join(tables, ", ") + to,
		"GRANT EXECUTE ON FUNCTION " + strings.Join(fns, ", ") + to,
	}
	if opts != nil && opts.Operator {
		stmts = append(stmts,
			"GRANT EXECUTE ON FUNCTION "+s+"."+operatorFunction+to,
			"GRANT SELECT ON TABLE "+pgx.Identifier{schema, "pgfence_forced_releases"}.Sanitize()+to,
		)
	}
	return stmts
}

// Grant runs [GrantSQL]'s statements in one transaction, as the role that
// owns the install (the one that ran [Up]). The schema must be at the latest
// version ([Latest]). It refuses the name "public", which PostgreSQL reads as
// every role, and a role that does not exist fails with PostgreSQL's error.
// Granting twice is harmless. ctx bounds everything, connecting included.
func Grant(ctx context.Context, t Target, role string, cfg *Config, opts *GrantOpts) error {
	if err := checkIdentifier("role", role); err != nil {
		return fmt.Errorf("pgfence: migrations: grant: %w", err)
	}
	if role == "public" {
		return fmt.Errorf("pgfence: migrations: grant: refusing to grant to %q, which means every role: name the application's role", role)
	}
	return run(ctx, t, cfg, "grant", func(r *runner) error {
		tx, err := r.conn.Begin(r.ctx)
		if err != nil {
			return err
		}
		defer r.rollback(tx)
		v, dirty, err := readVersion(r.ctx, tx, r.schema)
		if err != nil {
			return err
		}
		if latest := Latest(); v != latest || dirty {
			return fmt.Errorf("schema %q is at version %d (dirty %t), not %d: run Up first", r.schema, v, dirty, latest)
		}
		for _, stmt := range GrantSQL(r.schema, role, opts) {
			if _, err := tx.Exec(r.ctx, stmt); err != nil {
				return fmt.Errorf("%s: %w", stmt, err)
			}
		}
		return tx.Commit(r.ctx)
	})
}
