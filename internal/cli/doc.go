// Package cli implements the pgfence command: parsing, help, the database
// connection, and the subcommands. cmd/pgfence is a thin main around [Main].
//
// # Commands
//
//   - demo: the fencing story on a real database, with worker processes
//     (this binary re-executed as the hidden demo-worker command, driven
//     through package demo's protocol), a throwaway cluster when no
//     database is given, and cleanup on every exit.
//   - run: runs a command under a leasetable lease, supervised by package
//     supervise; the loss grace period is half the safety margin (see
//     runHelp for the arithmetic). Failures around the command exit with
//     [ExitRunFailure], through an exitError carrying the code to App.exit.
//   - ls: lease holders (leasetable's Locker.List) and advisory locks from
//     pg_locks; with --forced, the audit trail of forced releases
//     (Locker.ForcedReleases). Table cells escape control characters.
//   - release --force: an operator's override that ends a lease and bumps
//     its fencing token, so a holder that still believes in it is fenced
//     out: leasetable's Locker.ForceRelease, which records it.
//   - prune: leasetable's Locker.Prune on a small pool of its own, for
//     cron: deletes rows whose lease ended more than --older-than ago.
//   - migrate up|down|version: package migrations, into --schema.
//   - grant ROLE [--operator]: migrations.Grant.
//   - version: the build's version.
//
// # Conventions
//
// Every command has --help (usage, flags, examples, exit codes) written to
// standard output with exit status 0. Results go to standard output;
// diagnostics and prompts go to standard error. Flags have a long name
// (--yes) and, where common, a short one (-y); flags and arguments may be
// mixed, and "--" ends the flags. Exit codes are listed in one place,
// [ExitOK] and the constants after it, and printed by every --help.
//
// Every command takes --schema. The CLI sends no statement on
// pgfence_leases of its own: the package that owns the table does. The
// statements it does send (pg_locks for ls, the demo's own table) qualify
// built-ins with pg_catalog.
//
// # Database
//
// The database comes from --database, else DATABASE_URL, else the standard
// libpq environment variables (PGHOST, PGPORT, PGDATABASE, PGUSER, ...),
// which pgx reads. With none of them set, commands fail with a message that
// says so rather than guessing a server.
package cli
