// Package demo holds the parts of `pgfence demo` that do not depend on the
// lock and fencing packages: a throwaway database, the demo's schema, a
// timeline printer, and the protocol between the demo and its workers.
//
// # The story
//
// Workers contend for the lease on account 42. One is paused past its
// lease: it is a real process, a re-executed pgfence binary running the
// hidden worker subcommand, stopped with SIGSTOP, so its renewals stop as a
// frozen VM's or a long GC pause's would. Another worker takes the lease
// over and writes. The paused worker is resumed with SIGCONT and, still
// believing in its lease, writes: the fenced write is rejected
// (pgfence.ErrFenced) and the row keeps the new holder's value, while the
// same write without fencing is shown overwriting it.
//
// # Workers
//
// The demo drives each worker through [Worker]: one JSON [Command] per line
// on the worker's standard input, one JSON [Event] per line in answer on
// its standard output. The worker side is [Serve] with a [Handler] that
// performs the commands; pgfence's handler (in package cli, as it uses
// the lock and fence packages) runs in the hidden "pgfence demo-worker"
// command. The demo pauses and resumes a worker with
// [Worker.Pause] and [Worker.Resume].
//
// # Database
//
// Without a database URL, [StartDatabase] starts a throwaway PostgreSQL
// cluster from the local server binaries (initdb and postgres) with package
// pgserver, in a private temporary directory, listening only on a unix
// socket there; [Database.Close] stops it and removes the directory. The
// server also dies with the demo if the demo is killed, and its directory
// is removed by a later run (which signals no process). [Prepare]
// applies pgfence's migrations and creates the demo's own schema,
// pgfence_demo, which [Drop] removes, so the demo can also run on an
// existing database without touching the application's tables.
package demo
