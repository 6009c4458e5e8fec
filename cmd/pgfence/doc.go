// Command pgfence runs jobs under PostgreSQL leases, shows why fencing
// tokens matter, and inspects, releases and migrates pgfence's locks.
//
// Install it with
//
//	go install github.com/pgfence/pgfence/cmd/pgfence@latest
//
// # Start here
//
//	go run ./cmd/pgfence demo
//
// plays, in a few seconds on a real PostgreSQL, the story fencing exists
// for. Two worker processes want to update account 42 under the lease
// pgfence-demo:account:42. worker-A acquires it (TTL 2s) and reads the
// balance; the demo stops worker-A with SIGSTOP (a real stopped process, as
// in a GC pause or a frozen VM) between its read and its write. The lease
// expires, worker-B acquires it with a larger token and writes balance+50,
// fenced. The demo resumes worker-A, which, still believing in its lease,
// writes balance+10 fenced with its old token: the write is rejected with
// pgfence.ErrFenced and the row keeps worker-B's value. The same late write
// without fencing, a plain UPDATE, is then shown overwriting worker-B's
// update. Every step is printed on a timeline with the lease's holder and
// token; the exit status is 0 when the story played out.
//
// With --database or DATABASE_URL the demo uses that database (it applies
// pgfence's migrations, creates the schema pgfence_demo and drops it at the
// end, and its lease name is prefixed with "pgfence-demo:" so it cannot
// collide with a real lock); without, it starts a throwaway PostgreSQL from
// the local server binaries, reachable only through a unix socket in a
// private directory, and removes it at the end, also on SIGINT.
//
// # Logs
//
// Every diagnostic on standard error, pgfence's own lines and those of the
// library it runs, is written in one format: --log-format text (the
// default: "pgfence COMMAND: message" lines) or --log-format json (slog's
// JSON, one object a line, with the command and the fields). The flag is
// global: it may stand before or after the command name.
//
// # Running a job under a lease
//
//	pgfence run [flags] NAME -- COMMAND [ARGS...]
//
// works like flock(1) across machines: it acquires the lease NAME in the
// <schema>.pgfence_leases table (waiting for it as long as it takes unless -n/--no-wait
// or -w/--wait DURATION), runs COMMAND in its own process group with
// PGFENCE_LEASE and PGFENCE_TOKEN in its environment, renews the lease every
// TTL/3 while it runs, forwards SIGINT, SIGTERM and SIGHUP to it, and
// releases the lease when it exits. Its exit status is the command's.
//
// When the lease is lost, the command's whole process group gets SIGTERM and,
// GRACE later, SIGKILL, and pgfence exits with 124. pgfence gives the lease
// up at SENT + TTL - MARGIN on its monotonic clock (SENT: when the last
// successful acquire or renewal was sent), while the database expires it TTL
// after that statement ran, so at least MARGIN (--safety-margin, default
// TTL/5) is left; GRACE is MARGIN/2, which ends the command before the
// database can give the lease to anyone else, leaving the other half for
// clock-rate differences and the kill itself. A loss found by a renewal
// that sees the lease taken (pgfence release --force) may come after
// another owner acquired it: the command's writes fenced with PGFENCE_TOKEN
// are what protects the data then. A force release is noticed within about
// a round trip: pgfence run LISTENs for release notifications and checks its
// lease when one names it.
//
// On Linux the command is started by a supervisor (pgfence itself,
// re-executed) that is a child subreaper: if pgfence dies, even by SIGKILL,
// the supervisor kills every process the command started, including those
// that ignore SIGTERM or left the process group with setsid(), within
// milliseconds, long before the lease could pass to another owner.
// Processes started on the command's behalf by another service (systemd-run,
// at) are outside its reach.
//
// A crontab entry that runs a nightly job on whichever host gets there first
// and skips it quietly elsewhere:
//
//	DATABASE_URL=postgres://jobs@db.internal/app
//	0 3 * * * pgfence run -n -q -E 0 nightly-report -- /opt/app/report.sh
//
// # Exit codes of run
//
//	the command's  its exit code, or 128+N when signal N ended it
//	1, or -E N     the lease is held by another owner (--no-wait, or --wait ran out)
//	2              usage error
//	124            the lease was lost; the command was terminated
//	125            pgfence run itself failed (database unreachable, schema missing, release failed)
//	126            the command could not be executed
//	127            the command was not found
//	128+N          interrupted by signal N while waiting for the lease
//
// # Other commands
//
//   - pgfence ls [--json]: lease holders (name, owner, token, held for,
//     expires in), semaphores with a permit held (in use, permits, and how
//     many processes, Lockers not calls, wait for one) and advisory locks
//     from pg_locks; with --forced, the audit trail of forced releases. The
//     table escapes control characters.
//   - pgfence release --force NAME [--reason TEXT]: an operator's override
//     that ends a lease and bumps its token, fencing its holder out, and is
//     recorded (who, from where, why); asks unless --yes. With --permit
//     SLOT, NAME is a semaphore and permit SLOT of it is released; NAME may
//     also be a permit's name quoted as ls shows it ("jobs\x1f3").
//   - pgfence prune [--older-than 24h] [--json]: deletes the rows of leases
//     that ended more than that long ago (database clock), in short batches,
//     so a table with a lease per entity stops growing; for cron.
//   - pgfence migrate up|down|version: pgfence's embedded migrations; the
//     first SIGINT or SIGTERM stops a run.
//   - pgfence grant ROLE [--operator]: lets an application role (or, with
//     --operator, an operator) use pgfence; run as the owner.
//   - pgfence version.
//
// The database comes from --database, else DATABASE_URL, else the standard
// libpq variables (PGHOST, PGDATABASE, ...). Every command takes --schema
// NAME (default pgfence), the schema pgfence is installed in. Every command has --help; the
// other commands exit with 0 on success, 1 on failure and 2 on a usage
// error.
package main
