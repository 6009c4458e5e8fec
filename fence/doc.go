// Package fence generates guarded SQL: writes that a protected table
// rejects when they carry a fencing token older than the one already on the
// row, so a lock holder that lost its lock cannot overwrite the work of the
// holder that replaced it.
//
// A protected table has a guard column (by default [DefaultColumn],
// fence_token) holding the token of the holder that last wrote each row:
//
//	stmt := fence.Update("accounts").Set("balance = balance + $1").Where("id = $2")
//	tag, err := stmt.Exec(ctx, pool, lease.Token(), amount, accountID)
//
// The statement sets fence_token to the token and writes only if the row's
// token is not newer. The error matches pgfence.ErrFenced when a row
// carries a newer token (errors.As gives a [*StaleTokenError] with both
// tokens) and pgx.ErrNoRows when no row matches. Nothing is written in
// either case, and the caller's transaction stays usable.
//
// # The builders
//
// [Update], [Upsert], [Delete] and [Claim] (and their *Ident forms for
// identifiers with dots or quotes) build statements run with Exec, Query
// or QueryRow on any [pgfence.DB]. By default the guard is fence_token <=
// token, so a holder may write a row many times; [UpdateStmt.Strict] uses
// <, so each token writes a row at most once. A successful write costs one
// statement; a second is sent only when nothing was written, to tell stale
// from missing. When the Where matches several rows the write is all or
// nothing. [UpdateStmt.SQL] returns the full statement.
//
// Set, Where and Values fragments are the caller's constant SQL, never user
// input; fragments that could reach beyond their clause are rejected (a
// check against mistakes, not hostile SQL). Built-ins are named with
// pg_catalog, so the caller's search_path cannot redirect the guard.
//
// # Reading, then writing
//
// Fencing orders writes, not reads. A read-modify-write must compute the
// new value in the guarded statement (Set("balance = balance + $1")) or
// claim the rows before reading them ([Claim]), in one transaction with the
// write: from the claim on, every older holder's write is rejected.
//
// # Lease-checked writes
//
// [UpdateStmt.UnderLease] (and the same on [DeleteStmt] and [UpsertStmt])
// also requires, in the same statement, that the lease-table lease is held
// with this token and secret and not expired on the database clock. It
// locks the lease row FOR SHARE until the transaction ends, so no takeover
// commits between the check and the write; a lost lease is a
// [*LeaseLostError]. Keep such transactions short: a holder paused inside
// one blocks takeover until it ends.
//
// # The triggers
//
// pgfence's migrations install trigger functions that make a table reject
// stale writes whatever SQL sends them. The table's owner attaches them:
//
//	ALTER TABLE accounts ADD COLUMN fence_token bigint NOT NULL DEFAULT 0;
//	SELECT pgfence.pgfence_protect('accounts', 'fence_token', true);
//
// Strict mode (true) requires every UPDATE and DELETE to present a token at
// least the row's and issued by the sequence, and rejects TRUNCATE. The
// default mode (false) rejects only writes that move the token backwards,
// and a DELETE presenting an older token. Neither checks INSERT.
//
// Hand-written and sqlc SQL presents the token once per transaction with
// [Present] (SELECT pgfence.pgfence_present(token) in SQL), then writes;
// [Check] and [Classify] map the outcomes: PF001 a [*StaleTokenError]
// (pgfence.ErrFenced), PF004 a [*NoTokenError] (pgfence.ErrNoToken: strict
// mode saw no token), zero rows pgx.ErrNoRows. PF003 is a malformed token
// ([ErrMalformedToken]). [Predicate] is the guard condition for a WHERE on a
// table without a trigger.
//
// The owner backfills a strict table after SELECT
// pgfence.pgfence_maintenance('accounts') in its transaction.
//
// # Resources outside the database
//
// [CheckResource] extends fencing to what a holder writes elsewhere (another
// service, an object store, a second database): the service checks the
// holder's token against the fence registry (pgfence_fence_check in SQL) in
// the transaction of its own writes. A token older than the highest seen for
// the resource is a [*StaleTokenError]; an accepted one holds the resource
// until the transaction ends. Package fence/fencehttp does this for HTTP;
// docs/fencing-anything.md has the recipes.
//
// # How a rejection leaves the transaction
//
// A rejection by a builder's own predicate leaves the transaction usable; one
// raised by a trigger aborts it (SQLSTATE 25P02 afterwards), as any
// statement error does. Under REPEATABLE READ or SERIALIZABLE a concurrent
// write is a serialization failure (40001): retry the transaction.
//
// # What is not guaranteed
//
//   - Writes that neither go through a builder nor meet a trigger.
//   - Side effects outside the database that no registry check admits; a
//     stale holder can still read.
//   - A row re-inserted after a delete: it carries the inserting token.
//     Keep the row and mark it deleted where re-creation matters.
//   - A write a stale holder makes before the new holder's first write is
//     accepted with <=; claim the rows to close that window.
//
// docs/fencing.md in the repository covers the statements, the triggers,
// their privileges and costs, and sqlc in full.
package fence
