// Package fence generates guarded SQL: writes that a protected table
// rejects when they carry a fencing token older than the one already on the
// row, so a lock holder that lost its lock (paused past its TTL, partitioned
// away) cannot overwrite the work of the holder that replaced it.
//
// # Fencing
//
// A lock alone is not safe: a holder can pause (GC, swap, a stopped VM)
// after checking that it holds the lock and write after the lock has passed
// to someone else. pgfence hands every acquisition a fencing token, drawn by
// pgfence_next_token() from one sequence shared by both lock strategies, so
// a later holder always has a larger token. A protected table has a guard
// column (by default [DefaultColumn], fence_token) recording the token of
// the holder that last wrote each row, and every write is made conditional
// on it:
//
//	stmt := fence.Update("accounts").Set("balance = balance + $1").Where("id = $2")
//	tag, err := stmt.Exec(ctx, pool, lock.Token(), amount, accountID)
//
// The generated statement sets fence_token to the token and writes only if
// the row's token is not newer. errors.Is(err, pgfence.ErrFenced) when a
// row carries a newer token (errors.As gives a [*StaleTokenError] with
// both tokens), errors.Is(err, pgx.ErrNoRows) when no row matches. Nothing
// is written in either case, and the caller's transaction, if any, stays
// usable.
//
// Fencing protects only the rows that carry the guard column and only the
// writes that go through a guarded statement (or the trigger, below). It
// does not undo side effects outside the database, and a stale holder can
// still read.
//
// # <= or <
//
// By default the guard is fence_token <= token: a holder may write the same
// row many times under one token, and any later holder's first write
// excludes it for good. [UpdateStmt.Strict] switches to fence_token < token,
// so each token writes a row at most once: use it when a write must not be
// repeated (an exactly-once transition), at the price that the same holder's
// second write is reported as fenced.
//
// # Reading, then writing
//
// Fencing orders writes, not reads. With the default <= guard, a stale
// holder whose write lands before the new holder's first write is accepted;
// if the new holder had read the row before that, its own write then
// overwrites the stale holder's change with a value computed from an old
// read: a lost update, even though every write was fenced. Two ways avoid it:
//
//   - Compute the new value in the guarded statement itself
//     (Set("balance = balance + $1")), so nothing is read outside it.
//   - Claim the row before reading it. Either first make a guarded Update
//     that changes nothing but the token, such as Set("id = id"), which
//     marks the row as yours for good, then read it; or, in
//     one transaction, lock it with SELECT ... FOR UPDATE, read it, and make
//     the guarded write before committing. Once the new holder has claimed
//     the row, every write of an older holder is rejected or waits, so what
//     it read stays current until it writes.
//
// The fault suite (internal/chaos) checks a fenced register with claiming
// reads for linearizability under pauses, crashes and partitions, and shows
// that without them the checker reports the lost update.
//
// # One round trip, and what several rows mean
//
// Each builder sends one statement that writes the matched rows whose token
// is not newer than the presented one, and returns the number written; only
// when it wrote nothing does the same statement then lock the matched rows
// (SELECT ... FOR UPDATE) and return their newest token, so stale and
// missing are told apart without a second query. Under READ COMMITTED a
// row that another transaction is writing is waited for, then re-read in
// its newest committed version: a concurrent newer write makes the
// statement report [*StaleTokenError] with that newer token (never success
// for a row it did not write), a concurrent delete makes it report
// pgx.ErrNoRows, and a concurrent older write or a rollback lets it write.
// Under REPEATABLE READ or SERIALIZABLE, PostgreSQL reports a serialization
// failure instead (SQLSTATE 40001), returned wrapped: retry the transaction.
//
// A successful write of one row therefore costs what the hand-written
// guarded UPDATE costs: it takes no row lock before writing and writes no
// WAL beyond the UPDATE's own (a lock-first statement writes a heap-lock
// record per row before it), and it holds only the UPDATE's row lock, which
// does not block foreign-key checks of rows referencing it (FOR KEY SHARE).
// After a rejected write, the matched rows stay locked FOR UPDATE until the
// transaction ends.
//
// When the Where matches several rows the write is all or nothing: if any
// matched row carries a newer token (or a NULL one), no row is written, and
// Current is the newest token among them. For that, when the statement's
// snapshot shows more than one matching row (it counts up to two), the
// statement first locks every matching row FOR UPDATE, reads the newest
// tokens, and writes only if none is stale, as it must: written first, a
// row that a newer holder wrote and committed while the statement ran would
// be skipped while the others were written. With at most one matching row
// in the snapshot the write cannot be partial (an UPDATE only writes rows
// its snapshot matches), so nothing is locked first. The Where is
// evaluated several times (to count, to lock, to write, to read after a
// rejection), so it should not call volatile functions. Rows are locked in
// the order the plan visits them; two statements locking overlapping sets
// in different orders can deadlock, as with any UPDATE.
//
// # Lease-checked writes
//
// With the lease table strategy the lease lives in the same database, so a
// write can also require, in the same statement, that the lease is still
// held by the presenting holder: [UpdateStmt.UnderLease] (and the same on
// [DeleteStmt] and [UpsertStmt]) adds
//
//	SELECT FROM pgfence_leases
//	WHERE name = $n AND fence = $token AND expires_at > clock_timestamp()
//	FOR SHARE
//
// and writes nothing unless it finds the row. The FOR SHARE lock lasts until
// the transaction ends: a takeover or release in flight (an UPDATE of the
// lease row) makes the write wait, then fail; one that starts later waits
// until the writer commits, so no takeover can commit between the check and
// the write. The write is then rejected with a [*LeaseLostError], which
// matches both pgfence.ErrLeaseLost and pgfence.ErrFenced. This is strictly
// stronger than token fencing alone: token fencing rejects a stale holder
// only after the new holder has written the row, the lease check as soon as
// the lease has passed on. The expiry check uses clock_timestamp(), the
// database's clock when the statement runs, not now() (the start of the
// transaction). Keep such transactions short: the lease's own renewal waits
// behind the FOR SHARE lock too.
//
// # The trigger
//
// pgfence's migrations install the trigger function pgfence_guard(column),
// which makes the table itself reject writes that move the guard column
// backwards, whatever SQL path they come from (an ad-hoc UPDATE, an ORM, a
// sqlc query). Attach it to each protected table:
//
//	CREATE TRIGGER accounts_fence
//	    BEFORE UPDATE OR DELETE ON accounts
//	    FOR EACH ROW EXECUTE FUNCTION pgfence_guard('fence_token');
//
// It rejects, with SQLSTATE PF001 ([SQLState]), an UPDATE that sets the
// column to a smaller value or to NULL, and a DELETE of a row whose token is
// newer than the transaction's pgfence.token setting, when that is set. An
// UPDATE that does not change the column and a DELETE without pgfence.token
// carry no token and pass. [DeleteStmt] sets pgfence.token with
// set_config('pgfence.token', token, true) in its own statement; it stays
// set for the rest of the transaction. Errors from the trigger are mapped to
// [*StaleTokenError] by the builders and by [Classify] and [Check], with
// both tokens parsed from the error's DETAIL and the *pgconn.PgError
// reachable with errors.As.
//
// The trigger costs about as much per changed row as any PL/pgSQL trigger
// (a few microseconds) for the default column fence_token, which it reads
// directly; another column is read through the row's jsonb form, which
// costs a little more. Where that matters (bulk updates), attach it behind
// WHEN conditions that call it only for the rows it rejects, which brings
// its cost close to nothing:
//
//	CREATE TRIGGER accounts_fence_update BEFORE UPDATE ON accounts FOR EACH ROW
//	    WHEN (NEW.fence_token IS NULL OR NEW.fence_token < OLD.fence_token)
//	    EXECUTE FUNCTION pgfence_guard('fence_token');
//	CREATE TRIGGER accounts_fence_delete BEFORE DELETE ON accounts FOR EACH ROW
//	    WHEN (current_setting('pgfence.token', true) <> '')
//	    EXECUTE FUNCTION pgfence_guard('fence_token');
//
// To protect an existing table, add the column and the trigger in a
// golang-migrate migration of your own, after pgfence's migrations have run
// (pgfence.Migrate):
//
//	-- 000010_fence_accounts.up.sql
//	ALTER TABLE accounts ADD COLUMN fence_token bigint NOT NULL DEFAULT 0;
//	CREATE TRIGGER accounts_fence
//	    BEFORE UPDATE OR DELETE ON accounts
//	    FOR EACH ROW EXECUTE FUNCTION pgfence_guard('fence_token');
//
//	-- 000010_fence_accounts.down.sql
//	DROP TRIGGER IF EXISTS accounts_fence ON accounts;
//	ALTER TABLE accounts DROP COLUMN IF EXISTS fence_token;
//
// Since PostgreSQL 11, adding a column with a constant default does not
// rewrite the table. Existing rows carry 0, older than every token.
//
// # Plain SQL and sqlc
//
// Hand-written and sqlc queries can be guarded without the builders. With
// the trigger attached, set the column to the token and leave the guard
// predicate out; [Check] then tells the outcomes apart in one round trip
// (PF001 becomes [*StaleTokenError], zero rows pgx.ErrNoRows):
//
//	-- name: AddBalance :execresult
//	UPDATE accounts SET balance = balance + @amount, fence_token = @token WHERE id = @id;
//
//	_, err := fence.Check(q.AddBalance(ctx, params))
//
// For deletes, set pgfence.token in the same statement:
//
//	DELETE FROM accounts
//	WHERE id = $1 AND set_config('pgfence.token', $2::bigint::text, true) IS NOT NULL;
//
// Without the trigger, add [Predicate]'s condition ("fence_token" <= $n) to
// the WHERE; a stale write and a missing row are then both zero rows
// affected. [Classify] maps PF001 in the error of any query (a sqlc :one or
// :exec) to [*StaleTokenError].
//
// # Tables and placeholders
//
// Table names are given as "table" or "schema.table"; a dot always
// separates the schema. For names that contain a dot or a double quote, use
// the *Ident constructors ([UpdateIdent], [DeleteIdent], [UpsertIdent]) with
// a pgx.Identifier. All identifiers are quoted with pgx.Identifier.Sanitize.
// Set, Where and Values fragments are the caller's SQL and are sent as
// written; they use $1..$n for the caller's arguments. The token takes
// $n+1 and the lease name, with UnderLease, $n+2. SQL and Exec check, before
// anything is sent, that the fragments use exactly $1..$n (placeholders
// inside string constants, quoted identifiers, comments and dollar quotes do
// not count), and reject empty or over-long names, a missing Set or Where,
// and a token that is not positive.
//
// # When not to use a lock at all
//
// Where the resource can guard itself, that is simpler than a lock and a
// fence: a unique constraint makes a duplicate insert fail whoever sends it,
// and an optimistic version column (UPDATE ... SET version = version + 1
// WHERE id = $1 AND version = $2) rejects a write based on a stale read
// without any lock. Use a lock with fencing when the work must be done by
// one worker at a time, and the fence so that the one worker that lost its
// lock cannot corrupt what the next one did.
package fence
