// Package pgfence provides distributed locks and fenced writes that live
// entirely inside PostgreSQL, for Go services built on pgx v5.
//
// A lock alone does not make work safe. Every distributed lock is a lease
// with a failure window: a holder can pause (a GC pause, a frozen VM, a slow
// network) past its lease, resume, and still believe it holds the lock while
// a second holder works. pgfence therefore pairs every lock with a fencing
// token, and lets the protected rows themselves reject writes that carry an
// older token.
//
// # Packages
//
//   - [github.com/pgfence/pgfence/leasetable]: lease locks in the table
//     pgfence_leases, with an expiry judged on the database clock, a renewal
//     watchdog, and fast hand-over to waiters. Works through a
//     transaction-pooling PgBouncer.
//   - [github.com/pgfence/pgfence/advisory]: PostgreSQL advisory locks,
//     session- or transaction-scoped, with the same fencing tokens and loss
//     detection.
//   - [github.com/pgfence/pgfence/fence]: guarded UPDATE, upsert and DELETE
//     statements that only apply when the presented token is at least the
//     row's, optionally also checking atomically that the lease is still
//     held; and the pgfence_guard trigger for database-side enforcement.
//
// This package holds what they share: the [Locker] and [Lease] interfaces
// both strategies satisfy (switching strategy changes the constructor
// only), [AcquireOpts], the [DB] interface, the sentinel errors, and
// [DefaultSchema]. It imports nothing but pgx. The schema itself is
// installed by package [github.com/pgfence/pgfence/migrations] (or the
// pgfence command's migrate subcommand).
//
// # One vocabulary
//
// Both Lockers have the same verbs and the same behaviour: TryAcquire
// returns at once ([ErrNotAcquired] when someone else holds the lock);
// Acquire waits until it holds the lock, ctx ends (the error wraps ctx's
// cause) or [AcquireOpts].WaitTimeout elapses (the error matches both
// ErrNotAcquired and context.DeadlineExceeded); Do runs a function under the
// lock, cancels its context with cause [ErrLeaseLost] when the lock is lost,
// and returns the function's error joined with the loss and the release's
// error. A caller that already holds the lock it asks for (its ctx descends
// from the lease's Context, as in a nested Do) gets [ErrAlreadyHeld] at
// once instead of waiting for itself. Release is idempotent and safe on a
// nil handle. Constructors take a context and check, once, that the schema
// is installed as the code needs ([ErrNotInstalled] otherwise). Errors and
// log messages start with "pgfence: " and the package's name.
//
// # Fencing tokens
//
// Tokens are drawn from one PostgreSQL sequence, pgfence_leases_fence_seq in
// pgfence's schema, by both lock strategies, after the lock is granted. The sequence never
// cycles, so tokens only ever grow: a later holder of a lock always has a
// larger token than every earlier holder, and a token is never handed out
// twice. A random identifier such as a UUID could not be ordered this way.
//
// Tokens are drawn inside pgfence's SECURITY DEFINER functions, which make
// each token durable by the time the drawing transaction's commit returns:
// they raise synchronous_commit to on for that transaction (never lowering
// a stricter setting such as remote_apply) and, since PostgreSQL waits for
// the flush at commit only when the transaction wrote WAL, and nextval
// writes a record only once per 32 values (possibly in another
// transaction, not yet flushed), they write a WAL record of their own
// whenever the WAL that covers the token is not flushed yet, and always
// where synchronous standbys are named (migrations 000006 and 000008). A
// draw whose covering WAL is on disk already writes nothing and waits for
// nothing (the test is conservative: on a database with steady write
// traffic most draws find WAL not yet flushed and wait, as before). So a
// token that a caller has seen is never reissued after a server crash or a
// failover to a synchronous standby, even on a server that runs with
// synchronous_commit=off. The sequence must step by 1024 (by one before
// migration 000010) with no cache and no cycle; the migrations set it so,
// the token functions refuse to draw otherwise, and every Locker's New
// checks it. A single draw takes one value; a call that draws the tokens of
// several grants at once (an advisory Locker's combined statement) hands
// them out consecutively from one value per 1024, so they share one value
// and the WAL record that covers it, and every token drawn later, from the
// next value on, is larger.
//
// # Shared databases
//
// pgfence lives in a schema of its own ([DefaultSchema], "pgfence", unless
// chosen otherwise at migration time and in every Config), owned by the
// role that migrates. Applications get only what migrations.Grant gives
// them: USAGE on the schema, SELECT on the lease table, EXECUTE on the
// functions that acquire, renew, release and prune. Every write to the
// lease table and every token goes through those functions, so an
// application role cannot forge, rewind or reissue a token, take over a
// lease that has not expired or revive one that has, and cannot change the
// sequence. Every function pins its search_path (pg_catalog first, pg_temp
// last), and every statement the library and the CLI send names pgfence's
// schema and pg_catalog for the built-ins it calls, so objects another role
// plants on the application's search_path are never called. A second
// install in another schema of the same database, which would split the
// token space, is refused.
//
// # The safety model
//
// What a lease guarantees: while the database's clock is before expires_at,
// no other owner is granted the lock. The holder's library also gives up
// locally (Done is closed, Context is cancelled with cause [ErrLeaseLost])
// at a deadline computed from when the acquire request was sent, minus a
// safety margin, so an honest holder stops before the database could grant
// the lock to anyone else. A TTL buys progress when holders crash; it does
// not buy safety on its own: a paused holder cannot notice that it is paused.
//
// What fencing adds: a write guarded with the holder's token (see package
// fence) is applied only if the row's token is not newer. Once a later
// holder has written a row, every write from an earlier holder is rejected
// with [ErrFenced], however long that holder was paused and whatever it
// believes. A lease-checked write additionally requires, in the same
// statement, that the lease is still held with that token and not expired,
// locking the lease row so no takeover can commit in between.
//
// Expiry is judged on the database clock (now()), never on a client's
// clock, so clients with skewed clocks agree. Jumps of the database server's
// own clock shorten or lengthen leases; fencing still holds, because tokens
// are ordered by the sequence, not by time.
//
// # What is not guaranteed
//
//   - Writes outside the database. Fencing protects rows in the same
//     PostgreSQL database as the lock. A holder that writes to a file, a
//     queue or another service must pass the token along and have that
//     resource check it, or accept the failure window.
//   - Writes that are not guarded. A stale holder's plain UPDATE is not
//     rejected unless the table has a pgfence trigger: pgfence_guard sees
//     only writes that carry a token; pgfence_guard_strict rejects every
//     UPDATE and DELETE that does not present one at least the row's (see
//     package fence for exactly what each mode covers).
//   - Asynchronous replication failover. If a primary fails over to an
//     asynchronous standby, the last committed tokens and lease rows may be
//     lost: the promoted server can hand out a token again, or grant a lease
//     that was held. Use a synchronous standby (synchronous_standby_names
//     with synchronous_commit on or remote_apply) if locks must survive
//     failover.
//   - synchronous_commit=off on the server. pgfence forces synchronous
//     commit for the transactions that draw tokens, but lease renewals and
//     releases are ordinary commits; with synchronous_commit=off a crash can
//     roll them back, so a released lease can reappear as held until it
//     expires. That costs progress, not safety: tokens stay durable.
//   - Session advisory locks behind a transaction-pooling PgBouncer. The
//     session that holds such a lock is shared with other clients. Use the
//     lease table or transaction-scoped advisory locks there.
//
// Where a resource can guard itself, prefer that: a unique constraint, or
// an optimistic version column checked in the UPDATE, is simpler and safer
// than any lock. Use a lock when the work itself, not one row, must not run
// twice at once, and fence the rows it writes.
//
// # Migrations
//
// The schema lives in the migrations directory in golang-migrate format,
// recorded in pgfence's own migrations table, pgfence_schema_migrations,
// inside pgfence's schema, so it never collides with the application's
// schema_migrations. Apply it from Go with migrations.Up, with the pgfence
// command (pgfence migrate up), or with the migrate CLI on a connection
// whose search_path is pgfence's schema (see package migrations).
package pgfence
