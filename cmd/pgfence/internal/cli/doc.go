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
//     See "# pgfence run holds the whole job" below.
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
// # pgfence run holds the whole job
//
// On Linux, run starts the command through a supervisor: this binary
// re-executed as the hidden run-supervisor command (supervise.Serve). The
// supervisor makes itself a child subreaper (PR_SET_CHILD_SUBREAPER), so
// every process the command starts stays in its tree, even after setsid()
// or setpgid(); it starts the command in a process group of its own and
// reads a control pipe from run. Signals for the command and the request
// to end it on loss come down that pipe; its end of file means run died,
// by SIGKILL as well, and the supervisor then sends SIGKILL to every
// descendant (found through /proc) until none is left, and reaps them.
// This takes milliseconds, far less than the safety margin, so nothing of
// the job runs by the time the lease could expire and pass to another
// owner. When the command exits, what it left behind gets SIGTERM, then
// SIGKILL after the grace period, before the lease is released.
//
// Loss is noticed within about a round trip of its notification: run
// LISTENs on leasetable.NotifyChannel on a connection of its own
// (watchForLoss) and renews the lease when a notification names it; a
// force release makes that renewal fail, the lease's Done channel closes,
// and the command is ended. Without LISTEN (the notification is missed),
// the next scheduled renewal finds it, TTL/3 later at most. The release
// after the command (releaseTimeout) and closing the connections
// (cleanupTimeout) are bounded, so a statement blocked in the database
// does not hold pgfence's exit up.
//
// Not covered: processes that leave the supervisor's tree by asking
// another process to start them (systemd-run, at, a container runtime, a
// daemon reached over a socket); the supervisor itself killed with SIGKILL
// while pgfence lives (the command gets its parent-death SIGKILL, its
// descendants do not, and pgfence reports the supervisor's death with
// [ExitRunFailure]); a pid reused between the supervisor's /proc scan and
// its kill (the window is microseconds, and only a process of the same
// user could be hit). Elsewhere than Linux, and with the
// PGFENCE_TEST_NO_SUPERVISOR=1 test hook, run starts the command itself:
// only the command gets SIGKILL when pgfence dies (its parent-death
// signal, Linux only). cgroups (v2 cgroup.kill) would also cover
// processes that leave the tree, but need a delegated cgroup, which a cron
// job or a shell rarely has; they are not used.
//
// # Diagnostics: one log format, and events
//
// Everything pgfence writes to standard error goes through one slog.Logger
// per command (App.logger), in the format --log-format chooses: text
// ("pgfence COMMAND: message" lines, the library's attributes in
// parentheses) or json (slog's JSON handler: time, level, msg, command and
// fields). The Lockers the commands make log to it, and the CLI's own lines
// use it too (App.say: in text the message says everything, in json the
// details are fields as well). --log-format is global: splitLogFormat takes
// it out of the arguments, before "--", wherever it is. Results on standard
// output and the help are not log lines and keep their format.
//
// run's report of a lost lease comes from the lease's pgfence.Lost event
// (runEvents, its Locker's Observer): how long the lease was held and why
// it ended (pgfence.ErrLeaseTakenOver, ErrLeaseExpired), rather than from
// parsing anything.
//
// # Database
//
// The database comes from --database, else DATABASE_URL, else the standard
// libpq environment variables (PGHOST, PGPORT, PGDATABASE, PGUSER, ...),
// which pgx reads. With none of them set, commands fail with a message that
// says so rather than guessing a server.
package cli
