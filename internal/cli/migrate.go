package cli

import (
	"context"
	"fmt"

	"github.com/pgfence/pgfence/internal/migrator"
	"github.com/pgfence/pgfence/migrations"
)

const migrateHelp = `
Usage:
  pgfence migrate [flags] up|down|version

Applies, reverts or shows pgfence's embedded schema migrations. Progress is
recorded in pgfence's own table, ` + migrations.Table + `, never in the
application's schema_migrations; these are the same migrations as
pgfence.Migrate and the files in migrations/.

  up       apply every pending migration (a no-op when none is pending)
  down     revert every migration: drops pgfence_leases with every lease in
           it, the fencing-token sequence and pgfence's functions. Tokens
           start again from 1 afterwards, so rows that guarded writes have
           stamped with older tokens reject new holders. Asks for
           confirmation unless --yes.
  version  print the applied and the latest version; exits 1 when a failed
           migration left the schema dirty

Examples:
  pgfence migrate up
  DATABASE_URL=postgres://app@db/app pgfence migrate version
  pgfence migrate down --yes --database postgres://app@db/app
`

func (a *App) migrate(ctx context.Context, args []string) error {
	var database string
	var yes bool
	f := newFlags("migrate")
	f.String(&database, "d", "database", "URL", databaseFlagUsage)
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
	dsn, err := connString(database)
	if err != nil {
		return err
	}
	latest, err := migrator.Latest()
	if err != nil {
		return err
	}
	switch action {
	case "up":
		before, _, err := migrator.Version(ctx, dsn)
		if err != nil {
			return err
		}
		if err := migrator.Up(ctx, dsn); err != nil {
			return err
		}
		if before == latest {
			fmt.Fprintf(a.Stdout, "pgfence schema is up to date at version %d\n", latest)
		} else {
			fmt.Fprintf(a.Stdout, "pgfence schema migrated from version %d to %d\n", before, latest)
		}
	case "down":
		before, _, err := migrator.Version(ctx, dsn)
		if err != nil {
			return err
		}
		if before == 0 {
			fmt.Fprintln(a.Stdout, "pgfence schema is not installed; nothing to revert")
			return nil
		}
		if err := a.confirm(fmt.Sprintf("Revert pgfence's schema (version %d)? This drops pgfence_leases with every lease, "+
			"and fencing tokens restart from 1.", before), yes); err != nil {
			return err
		}
		if err := migrator.Down(ctx, dsn); err != nil {
			return err
		}
		fmt.Fprintf(a.Stdout, "pgfence schema reverted from version %d; every pgfence object is removed\n", before)
	case "version":
		v, dirty, err := migrator.Version(ctx, dsn)
		if err != nil {
			return err
		}
		fmt.Fprintf(a.Stdout, "version %d (latest %d)\n", v, latest)
		if dirty {
			return fmt.Errorf("migration %d failed and left the schema dirty: repair it by hand, "+
				"then set %s.dirty to false", v, migrations.Table)
		}
		if v < latest {
			fmt.Fprintln(a.Stderr, "pgfence migrate: migrations are pending: run 'pgfence migrate up'")
		}
	}
	return nil
}
