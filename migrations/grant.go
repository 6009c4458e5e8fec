package migrations

import (
	"context"
	"errors"
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
	// CheckOnly gives only what a service that checks fencing tokens with
	// the fence registry needs: USAGE on the schema and EXECUTE on
	// pgfence_fence_check and pgfence_schema_version, nothing else (no
	// lease, no table, no token). It cannot be combined with Operator.
	CheckOnly bool
}

// appFunctions are the functions an application role executes, every write
// included. The trigger functions are among them because EXECUTE is checked
// when a trigger is created, and the strict trigger calls
// pgfence_last_token as the writing role.
var appFunctions = []string{
	"pgfence_next_token()",
	"pgfence_schema_version()",
	"pgfence_acquire(pg_catalog.text[], pg_catalog.text, pg_catalog.int8[])",
	"pgfence_release(pg_catalog.text[], pg_catalog.int8[], pg_catalog.text[], pg_catalog.int8[])",
	"pgfence_renew(pg_catalog.text[], pg_catalog.int8[], pg_catalog.text[], pg_catalog.int8[])",
	"pgfence_lease_held(pg_catalog.text, pg_catalog.int8, pg_catalog.text)",
	"pgfence_prune_scan(pg_catalog.text, pg_catalog.int4, pg_catalog.interval)",
	"pgfence_prune_delete(pg_catalog.text[], pg_catalog.int8[], pg_catalog.interval)",
	"pgfence_leader_proclaim(pg_catalog.text, pg_catalog.int8, pg_catalog.text, pg_catalog.text)",
	"pgfence_next_tokens(pg_catalog.bool[])",
	"pgfence_guard()",
	"pgfence_guard_strict()",
	"pgfence_guard_truncate()",
	"pgfence_last_token()",
	"pgfence_present(pg_catalog.int8)",
	"pgfence_protect(pg_catalog.regclass, pg_catalog.name, pg_catalog.bool)",
	"pgfence_maintenance(pg_catalog.regclass)",
	checkFunction,
	"pgfence_slot_begin(pg_catalog.text, pg_catalog.text, pg_catalog.int8, pg_catalog.text)",
	"pgfence_slot_finish(pg_catalog.text, pg_catalog.text, pg_catalog.int8, pg_catalog.text, pg_catalog.text, pg_catalog.text)",
	"pgfence_slots_prune(pg_catalog.interval)",
	"pgfence_acquire_permit(pg_catalog.text, pg_catalog.int4, pg_catalog.text, pg_catalog.int8)",
	"pgfence_acquire_permit(pg_catalog.text, pg_catalog.int4, pg_catalog.text, pg_catalog.int8, pg_catalog.bool)",
	"pgfence_acquire_set(pg_catalog.text[], pg_catalog.text, pg_catalog.int8[])",
	"pgfence_claim_permit(pg_catalog.text, pg_catalog.int4, pg_catalog.text, pg_catalog.int8, pg_catalog.text, pg_catalog.bytea, pg_catalog.int8, pg_catalog.int8, pg_catalog.text)",
	"pgfence_unclaim_permit(pg_catalog.text, pg_catalog.text, pg_catalog.bool)",
}

// checkFunction is the fence registry's check; with pgfence_schema_version
// all that GrantOpts.CheckOnly gives.
const checkFunction = "pgfence_fence_check(pg_catalog.text, pg_catalog.int8)"

// checkOnlyFunctions are the functions GrantOpts.CheckOnly gives.
var checkOnlyFunctions = []string{checkFunction, "pgfence_schema_version()"}

// appTables are the tables an application role reads: the leases, the
// elections' leaders, the key of notification payloads, the version
// ([Version], and [Up] at start-up), the schedule's slots and the
// semaphores' permit counts.
var appTables = []string{"pgfence_leases", "pgfence_leaders", "pgfence_notify_key", Table, "pgfence_slots", "pgfence_semaphores"}

// operatorFunction is what GrantOpts.Operator adds.
const operatorFunction = "pgfence_force_release(pg_catalog.text, pg_catalog.text)"

// privilege is one privilege Grant gives.
type privilege struct {
	kind   string // "schema", "table" or "function"
	object string // quoted and qualified, as GRANT and has_<kind>_privilege read it
	priv   string // USAGE, SELECT or EXECUTE
}

func (p privilege) String() string { return p.priv + " on " + p.kind + " " + p.object }

// grants returns GrantSQL's statements and the privileges they give.
func grants(schema, role string, opts *GrantOpts) ([]string, []privilege) {
	if schema == "" {
		schema = defaultSchema
	}
	s := pgx.Identifier{schema}.Sanitize()
	to := " TO " + pgx.Identifier{role}.Sanitize()
	privs := []privilege{{"schema", s, "USAGE"}}
	var tables, fns []string
	if opts != nil && opts.CheckOnly {
		for _, f := range checkOnlyFunctions {
			fns = append(fns, s+"."+f)
			privs = append(privs, privilege{"function", fns[len(fns)-1], "EXECUTE"})
		}
		return []string{"GRANT USAGE ON SCHEMA " + s + to, "GRANT EXECUTE ON FUNCTION " + strings.Join(fns, ", ") + to}, privs
	}
	for _, t := range appTables {
		tables = append(tables, pgx.Identifier{schema, t}.Sanitize())
		privs = append(privs, privilege{"table", tables[len(tables)-1], "SELECT"})
	}
	for _, f := range appFunctions {
		fns = append(fns, s+"."+f)
		privs = append(privs, privilege{"function", fns[len(fns)-1], "EXECUTE"})
	}
	stmts := []string{
		"GRANT USAGE ON SCHEMA " + s + to,
		"GRANT SELECT ON TABLE " + strings.Join(tables, ", ") + to,
		"GRANT EXECUTE ON FUNCTION " + strings.Join(fns, ", ") + to,
	}
	if opts != nil && opts.Operator {
		fn, audit := s+"."+operatorFunction, pgx.Identifier{schema, "pgfence_forced_releases"}.Sanitize()
		stmts = append(stmts, "GRANT EXECUTE ON FUNCTION "+fn+to, "GRANT SELECT ON TABLE "+audit+to)
		privs = append(privs, privilege{"function", fn, "EXECUTE"}, privilege{"table", audit, "SELECT"})
	}
	return stmts, privs
}

// GrantSQL returns the statements [Grant] runs to let role use the pgfence
// install in schema (empty means "pgfence"), every identifier quoted and
// every type schema-qualified: USAGE on the schema, SELECT on the tables the
// application reads, EXECUTE on the functions it calls (the package
// documentation lists them), and with Operator EXECUTE on
// pgfence_force_release and SELECT on pgfence_forced_releases; with
// CheckOnly, only USAGE on the schema and EXECUTE on pgfence_fence_check and
// pgfence_schema_version. GrantSQL does not validate its arguments; [Grant]
// does.
func GrantSQL(schema, role string, opts *GrantOpts) []string {
	stmts, _ := grants(schema, role, opts)
	return stmts
}

// Grant runs [GrantSQL]'s statements in one transaction, as the install's
// owner, and checks before committing that role holds every privilege they
// name (PostgreSQL only warns when the granting role may not grant), else
// fails naming each one missing and the owner. The schema must be at
// [Latest]. Grant refuses "public", which means every role; granting twice
// is harmless. ctx bounds everything, connecting included.
func Grant(ctx context.Context, t Target, role string, cfg *Config, opts *GrantOpts) error {
	return grant(ctx, t, role, cfg, opts, nil)
}

func grant(ctx context.Context, t Target, role string, cfg *Config, opts *GrantOpts, h *testHooks) error {
	if err := checkIdentifier("role", role); err != nil {
		return fmt.Errorf("pgfence: migrations: grant: %w", err)
	}
	if role == "public" {
		return fmt.Errorf("pgfence: migrations: grant: refusing to grant to %q, which means every role: name the application's role", role)
	}
	if opts != nil && opts.CheckOnly && opts.Operator {
		return errors.New("pgfence: migrations: grant: CheckOnly and Operator cannot be combined: CheckOnly gives a checking service nothing else")
	}
	return run(ctx, t, cfg, "grant", func(r *runner) error {
		v, dirty, err := r.readOnlyVersion()
		if err != nil {
			return err
		}
		if latest := Latest(); v != latest || dirty {
			return fmt.Errorf("schema %q is at version %d (dirty %t), not %d: run Up first", r.schema, v, dirty, latest)
		}
		tx, err := r.conn.Begin(r.ctx)
		if err != nil {
			return err
		}
		defer r.rollback(tx)
		stmts, privs := grants(r.schema, role, opts)
		for _, stmt := range stmts {
			if _, err := tx.Exec(r.ctx, stmt); err != nil {
				return fmt.Errorf("%s: %w", stmt, err)
			}
		}
		if h == nil || !h.skipGrantCheck {
			lacking, err := missingPrivileges(r.ctx, tx, role, privs)
			if err != nil {
				return fmt.Errorf("check the grants: %w", err)
			}
			if len(lacking) > 0 {
				owner, _ := r.installOwner()
				fix := fmt.Sprintf("run Grant as the install's owner, %q", owner)
				if owner == r.role {
					fix = "the schema or an object in it belongs to another role: see Up's ownership checks"
				}
				return fmt.Errorf("role %q still lacks %s after the grants: PostgreSQL grants nothing, and only warns, "+
					"when the granting role (%q) may not grant; %s", role, strings.Join(lacking, ", "), r.role, fix)
			}
		}
		return tx.Commit(r.ctx)
	})
}

// MissingGrants returns the privileges [Grant] gives (with opts) that role
// does not hold on the install in schema (empty means "pgfence"), as
// has_*_privilege sees them (PUBLIC and the roles role is a member of
// included), each as "EXECUTE on function ..."; empty when it holds all.
// It runs one query on q, bounded by ctx.
func MissingGrants(ctx context.Context, q interface {
	Query(context.Context, string, ...any) (pgx.Rows, error)
}, schema, role string, opts *GrantOpts) ([]string, error) {
	_, privs := grants(schema, role, opts)
	return missingPrivileges(ctx, q, role, privs)
}

// missingPrivilegesSQL returns the positions (from 1) of the privileges in
// $2, $3, $4 (kind, object, privilege) that role $1 does not hold.
const missingPrivilegesSQL = `
SELECT p.i FROM ROWS FROM (pg_catalog.unnest($2::pg_catalog.text[]), pg_catalog.unnest($3::pg_catalog.text[]),
    pg_catalog.unnest($4::pg_catalog.text[])) WITH ORDINALITY AS p(kind, object, priv, i)
WHERE NOT CASE p.kind
    WHEN 'schema' THEN pg_catalog.has_schema_privilege($1::pg_catalog.name, (pg_catalog.parse_ident(p.object))[1], p.priv)
    WHEN 'table' THEN pg_catalog.has_table_privilege($1::pg_catalog.name, p.object, p.priv)
    ELSE pg_catalog.has_function_privilege($1::pg_catalog.name, p.object, p.priv) END
ORDER BY p.i`

// missingPrivileges returns the privileges of privs that role lacks, as
// has_*_privilege sees them (PUBLIC and the roles role is a member of
// included).
func missingPrivileges(ctx context.Context, q interface {
	Query(context.Context, string, ...any) (pgx.Rows, error)
}, role string, privs []privilege) ([]string, error) {
	kinds, objects, names := make([]string, len(privs)), make([]string, len(privs)), make([]string, len(privs))
	for i, p := range privs {
		kinds[i], objects[i], names[i] = p.kind, p.object, p.priv
	}
	rows, err := q.Query(ctx, missingPrivilegesSQL, role, kinds, objects, names)
	if err != nil {
		return nil, err
	}
	at, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		return nil, err
	}
	lacking := make([]string, len(at))
	for i, n := range at {
		lacking[i] = privs[n-1].String()
	}
	return lacking, nil
}
