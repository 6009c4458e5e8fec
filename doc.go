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
// This package holds what they share: the [DB] interface, the sentinel
// errors, and [Migrate], which applies the schema the packages need.
//
// # Fencing tokens
//
// Tokens are drawn from one PostgreSQL sequence, pgfence_leases_fence_seq,
// by both lock strategies, after the lock is granted. The sequence never
// cycles, so tokens only ever grow: a later holder of a lock always has a
// larger token than every earlier holder, and a token is never handed out
// twice. A random identifier such as a UUID could not be ordered this way.
//
// Tokens are drawn with pgfence_next_token(), which makes the drawing
// transaction commit durably (it forces synchronous_commit on for that
// transaction), so a token that a caller has seen is never reissued after a
// server crash, even on a server that runs with synchronous_commit=off.
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
//     rejected unless the table has the pgfence_guard trigger, and even the
//     trigger only sees writes that carry a token.
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
// recorded in pgfence's own migrations table, pgfence_schema_migrations, so
// it never collides with the application's schema_migrations. Apply it from
// Go with [Migrate], or with the migrate CLI:
//
//	migrate -path migrations \
//	    -database 'pgx5://user@host:5432/db?sslmode=disable&x-migrations-table=pgfence_schema_migrations' up
package pgfence
