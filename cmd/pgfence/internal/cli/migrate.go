package cli

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/jackc/pgx/v5"

	"github.com/pgfence/pgfence/migrations"
)

const migrateHelp = `
Usage:
  pgfence migrate [flags] up|down|version

Applies, reverts or shows pgfence's embedded schema migrations in the schema
--schema (default pgfence). Progress is recorded in pgfence's own table,
<schema>.` + migrations.Table + `, never in the application's
schema_migrations; these are the same migrations as migrations.Up and the
files in migrations/. Run it as the role that is to own pgfence's objects,
then give the application's role what it needs with 'pgfence grant'.

  up       create the schema if needed and apply every pending migration.
           Refused, before anything changes, when another schema of the
           database already holds a pgfence install, when the schema or an
           object in it belongs to a role other than the one running it
           (that role could replace pgfence's functions), or when the install
           belongs to another role (its name is given). When nothing is
           pending it only reads, so an application's role given
           'pgfence grant' may run it at start-up.
  down     revert every migration: drops pgfence_leases with every lease in
           it, the fencing-token sequence, the forced-release audit table and
           pgfence's functions; the schema itself stays. Tokens start again
           from 1 afterwards, so rows that guarded writes have stamped with
           older tokens reject new holders. Asks for confirmation unless
           --yes.
  version  print the applied and the latest version (writes nothing; any
           role given 'pgfence grant' may run it); exits 1 when a failed
           migration left the schema dirty

golang-migrate's own migrate CLI, run on the files in migrations/, makes none
of the ownership checks of 'up': run 'pgfence migrate up' as the owner, or
create the schema as the owner first (CREATE SCHEMA without IF NOT EXISTS,
which fails when another role made it) and only then run migrate.

SIGINT or SIGTERM stops the run: the migration in progress is rolled back,
the ones committed before stay applied (exit status 1).

Examples:
  pgfence migrate up
  DATABASE_URL=postgres://owner@db/app pgfence migrate version --schema pgfence
  pgfence migrate down --yes --database postgres://owner@db/app
`

func (a *App) migrate(ctx context.Context, args []string) error {
	var database, schema string
	var yes bool
	f := newFlags("migrate")
	f.String(&database, "d", "database", "URL", databaseFlagUsage)
	schemaFlag(f, &schema)
	f.Bool(&yes, "y", "yes", "do not ask for confirmation (migrate down)")
	pos, _, err := a.parseOrHelp(f, migrateHelp, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return usageErrorf("expected one of up, down, version")
	}
	action := pos[0]
	if action != "up" && action != "down" && action != "version" {
		return usageErrorf("unknown migrate action %q: expected up, down or version", action)
	}
	if err := checkSchema(schema); err != nil {
		return err
	}
	target, err := migrationTarget(database)
	if err != nil {
		return err
	}
	cfg := &migrations.Config{Schema: schema}
	err = a.migrateAction(ctx, action, target, cfg, yes)
	if err != nil && ctx.Err() != nil {
		// ctx ends on the first SIGINT or SIGTERM (see Main).
		return fmt.Errorf("interrupted: %w; migrations committed before stay applied: see 'pgfence migrate version --schema %s'",
			err, schema)
	}
	return err
}

// migrationTarget returns the database to migrate, with connectTimeout
// unless the connection string sets connect_timeout.
func migrationTarget(database string) (migrations.Target, error) {
	dsn, err := connString(database)
	if err != nil {
		return migrations.Target{}, err
	}
	cfg, err := connConfig(dsn, "")
	if err != nil {
		return migrations.Target{}, err
	}
	return migrations.Target{ConnConfig: cfg}, nil
}

func (a *App) migrateAction(ctx context.Context, action string, t migrations.Target, cfg *migrations.Config, yes bool) error {
	latest := migrations.Latest()
	switch action {
	case "up":
		// The version before is only for the message: when it cannot be
		// read, Up says why (as an up failure, not a version failure).
		before, _, verr := migrations.Version(ctx, t, cfg)
		if err := migrations.Up(ctx, t, cfg); err != nil {
			return err
		}
		switch {
		case verr != nil:
			fmt.Fprintf(a.Stdout, "pgfence schema %q migrated to version %d\n", cfg.Schema, latest)
		case before == latest:
			fmt.Fprintf(a.Stdout, "pgfence schema %q is up to date at version %d\n", cfg.Schema, latest)
		default:
			fmt.Fprintf(a.Stdout, "pgfence schema %q migrated from version %d to %d\n", cfg.Schema, before, latest)
		}
	case "down":
		before, _, err := migrations.Version(ctx, t, cfg)
		if err != nil {
			return err
		}
		if before == 0 {
			fmt.Fprintf(a.Stdout, "pgfence is not installed in schema %q; nothing to revert\n", cfg.Schema)
			return nil
		}
		if err := a.confirm(fmt.Sprintf("Revert pgfence in schema %q (version %d)? This drops pgfence_leases with every lease, "+
			"and fencing tokens restart from 1.", cfg.Schema, before), yes); err != nil {
			return err
		}
		if err := migrations.Down(ctx, t, cfg); err != nil {
			return err
		}
		fmt.Fprintf(a.Stdout, "pgfence schema %q reverted from version %d: its tables, functions and version table are dropped; "+
			"the schema itself remains (DROP SCHEMA %s to remove it)\n", cfg.Schema, before, pgx.Identifier{cfg.Schema}.Sanitize())
	case "version":
		v, dirty, err := migrations.Version(ctx, t, cfg)
		if err != nil {
			return err
		}
		fmt.Fprintf(a.Stdout, "version %d (latest %d)\n", v, latest)
		if dirty {
			return fmt.Errorf("migration %d failed and left the schema dirty: repair it by hand, "+
				"then set %s.%s.dirty to false", v, pgx.Identifier{cfg.Schema}.Sanitize(), migrations.Table)
		}
		if v < latest {
			a.say(ctx, slog.LevelWarn, fmt.Sprintf("migrations are pending: run 'pgfence migrate up --schema %s'", cfg.Schema),
				slog.Int("version", int(v)), slog.Int("latest", int(latest)))
		}
	}
	return nil
}
