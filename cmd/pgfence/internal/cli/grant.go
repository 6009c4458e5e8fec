package cli

import (
	"context"
	"errors"
	"fmt"

	"github.com/pgfence/pgfence/internal/install"
	"github.com/pgfence/pgfence/migrations"
)

const grantHelp = `
Usage:
  pgfence grant [flags] ROLE

Gives ROLE what an application needs to use pgfence in the schema --schema
(default pgfence), in one transaction: USAGE on the schema, SELECT on
pgfence_leases, pgfence_leaders, pgfence_notify_key and
` + migrations.Table + ` (so that 'pgfence migrate version', and
'migrate up' at start-up, work as ROLE), and EXECUTE on pgfence's functions
(acquire, renew, release, prune, next token, the guard triggers...). Nothing
on the token sequence and no INSERT, UPDATE, DELETE or TRUNCATE on the
table: pgfence's SECURITY DEFINER functions make every write. With
--operator, also EXECUTE on pgfence_force_release and SELECT on
pgfence_forced_releases, for the people and tools that run 'pgfence release
--force' and 'pgfence ls --forced'. With --check-only, instead, only USAGE
on the schema and EXECUTE on pgfence_fence_check and pgfence_schema_version:
for a service that checks fencing tokens with the fence registry and does
nothing else (docs/fencing-anything.md).

Run it as the role that ran 'pgfence migrate up' (the owner), after that;
granting twice is harmless. Before committing, it checks that ROLE holds
every privilege named (PostgreSQL only warns when the granting role may not
grant one) and fails otherwise, naming each one missing. ROLE must exist;
"public" is refused. --print shows the statements instead of running them
(no database needed).

Examples:
  pgfence grant app
  pgfence grant oncall --operator --database postgres://owner@db/app
  pgfence grant app --print --schema locks
  pgfence grant payments-svc --check-only
`

func (a *App) grant(ctx context.Context, args []string) error {
	var database, schema string
	var operator, checkOnly, print bool
	f := newFlags("grant")
	f.Bool(&operator, "", "operator", "also allow release --force and reading the forced-release audit trail")
	f.Bool(&checkOnly, "", "check-only", "only what a service that checks tokens with the fence registry needs")
	f.Bool(&print, "", "print", "print the statements instead of running them")
	f.String(&database, "d", "database", "URL", databaseFlagUsage)
	schemaFlag(f, &schema)
	pos, _, err := a.parseOrHelp(f, grantHelp, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 || pos[0] == "" {
		return usageErrorf("expected one role name")
	}
	role := pos[0]
	if role == "public" {
		return usageErrorf(`refusing role "public": PostgreSQL reads it as every role`)
	}
	if err := checkSchema(schema); err != nil {
		return err
	}
	if operator && checkOnly {
		return usageErrorf("--operator and --check-only exclude each other")
	}
	opts := &migrations.GrantOpts{Operator: operator, CheckOnly: checkOnly}
	if print {
		for _, stmt := range migrations.GrantSQL(schema, role, opts) {
			fmt.Fprintf(a.Stdout, "%s;\n", stmt)
		}
		return nil
	}
	target, err := migrationTarget(database)
	if err != nil {
		return err
	}
	if err := migrations.Grant(ctx, target, role, &migrations.Config{Schema: schema}, opts); err != nil {
		if ctx.Err() != nil {
			// ctx ends on the first SIGINT or SIGTERM (see Main).
			return fmt.Errorf("interrupted: %w; nothing was granted", err)
		}
		var denied *install.PermissionError
		if errors.As(err, &denied) {
			return err // it names the grant already
		}
		return explainSchemaError(err, schema)
	}
	what := "use of"
	if operator {
		what = "use and operation of"
	}
	fmt.Fprintf(a.Stdout, "granted %q %s pgfence in schema %q\n", role, what, schema)
	return nil
}
