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
// A read-modify-write claims the row first, and reads it in the same
// statement ([Claim], see "Reading, then writing"):
//
//	tx, err := pool.Begin(ctx)
//	...
//	var balance int64
//	err = fence.Claim("accounts").Where("id = $1").Returning("balance").
//		QueryRow(ctx, tx, lock.Token(), accountID).Scan(&balance)
//	...
//	_, err = fence.Update("accounts").Set("balance = $1").Where("id = $2").
//		Exec(ctx, tx, lock.Token(), newBalance(balance), accountID)
//	...
//	err = tx.Commit(ctx)
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
// read: a lost update, even though every write was fenced. This is what a
// paused holder does when it has written but not committed: the next holder
// reads the old value, its write waits for the row, the paused holder
// commits, and the next holder's write, with its newer token, replaces the
// committed change. Two ways avoid it:
//
//   - Compute the new value in the guarded statement itself
//     (Set("balance = balance + $1")), so nothing is read outside it.
//   - Claim the rows before reading them, with [Claim]: a guarded UPDATE
//     that sets only the guard column to the token, all or nothing, with
//     the same stale and missing outcomes as every guarded write. With
//     Returning it reads the rows in the same statement, after any write
//     of an older holder still in flight has committed or rolled back (the
//     claim waits for its row lock, then reads the newest version). From
//     then on every write of an older holder is rejected, so what the
//     claim read stays current. Claim, compute and write in one
//     transaction; the claim's row locks then also keep other writers of
//     the same token out until the commit.
//
// For hand-written and sqlc queries the claim is one UPDATE on a table with
// the pgfence_guard trigger ("Plain SQL and sqlc" below). Reading with
// SELECT ... FOR UPDATE and writing before committing, in one
// transaction, is also safe, but a stale holder's write is then rejected
// only after the new holder has written.
//
// The fault suite (internal/chaos) checks a fenced register with claiming
// reads for linearizability under pauses, crashes and partitions, and shows
// that without them the checker reports the lost update.
//
// # One round trip, and what several rows mean
//
// On success, Exec, Query and QueryRow send one statement: the guarded
// write alone, as one would write it by hand (the guard predicate, the
// setting of pgfence.token, and, with UnderLease, the lease check), held
// back by a one-time check when its snapshot shows more than one matching
// row. When it writes nothing, they send a second statement, the full one
// that [UpdateStmt.SQL] returns: it writes the matched rows whose token is
// not newer than the presented one and, only when it wrote nothing, locks
// the matched rows (SELECT ... FOR UPDATE) and returns their newest token,
// so stale and missing are told apart. The second statement is sent only
// for a rejected write, a missing row, a Where that matches several rows,
// or a lease that is not held; it is safe to send because the first wrote
// nothing. Under READ COMMITTED a row that another transaction is writing
// is waited for, then re-read in its newest committed version: a
// concurrent newer write makes the call report [*StaleTokenError] with that
// newer token (never success for a row it did not write), a concurrent
// delete makes it report pgx.ErrNoRows, and a concurrent older write or a
// rollback lets it write. Under REPEATABLE READ or SERIALIZABLE,
// PostgreSQL reports a serialization failure instead (SQLSTATE 40001),
// returned wrapped: retry the transaction.
//
// A successful write of one row therefore costs what the hand-written
// guarded UPDATE costs, one round trip: it takes no row lock before
// writing and writes no WAL beyond the UPDATE's own (a lock-first
// statement writes a heap-lock record per row before it), and it holds
// only the UPDATE's row lock, which does not block foreign-key checks of
// rows referencing it (FOR KEY SHARE). After a rejected write, the matched
// rows stay locked FOR UPDATE until the transaction ends. bench/ measures
// the builders against plain statements; its results are in
// bench/results.
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
// [DeleteStmt] and [UpsertStmt]) adds a call of
//
//	pgfence.pgfence_lease_held(name, token, secret)
//
// which is true only if the lease row has fence = token, the SHA-256 of
// the lease's secret (leasetable's Lease.Secret, which only the acquiring
// call received) and expires_at > clock_timestamp(), and then locks that row FOR SHARE, and writes nothing
// unless it is true. The FOR SHARE lock lasts until the transaction ends: a
// takeover or release in flight (an UPDATE of the lease row) makes the
// write wait, then fail; one that starts later waits until the writer
// commits, so no takeover can commit between the check and the write. The
// write is then rejected with a [*LeaseLostError], which matches both
// pgfence.ErrLeaseLost and pgfence.ErrFenced. This is strictly stronger
// than token fencing alone: token fencing rejects a stale holder only after
// the new holder has written the row, the lease check as soon as the lease
// has passed on. The expiry check uses clock_timestamp(), the database's
// clock when the statement runs, not now() (the start of the transaction).
// Keep such transactions short: the lease's own renewal waits behind the FOR
// SHARE lock too.
//
// pgfence_lease_held runs as pgfence's owner (SECURITY DEFINER): the writer
// needs EXECUTE on it and USAGE on pgfence's schema, which migrations.Grant
// gives the application role, and no privilege on pgfence_leases (taking
// FOR SHARE there directly would need UPDATE on it). The function is
// called in the schema pgfence is installed in, "pgfence" unless the
// builder is told otherwise with [UpdateStmt.LeaseSchema].
//
// # The triggers
//
// pgfence's migrations install trigger functions that make a table itself
// reject writes from stale holders, whatever SQL path they come from (an
// ad-hoc UPDATE, an ORM, a sqlc query). Each takes the guard column's name
// as its argument (default fence_token). They come in two modes.
//
// The default mode, pgfence_guard, rejects with SQLSTATE PF001 ([SQLState])
// an UPDATE that sets the column to a smaller value or to NULL, and a DELETE
// of a row whose token is newer than the transaction's pgfence.token
// setting, when that is set:
//
//	CREATE TRIGGER accounts_fence
//	    BEFORE UPDATE OR DELETE ON accounts
//	    FOR EACH ROW EXECUTE FUNCTION pgfence.pgfence_guard('fence_token');
//
// It does not guard: an UPDATE that leaves the column unchanged (including
// one that does not mention it, and INSERT ... ON CONFLICT DO UPDATE that
// does not set it), a DELETE without pgfence.token, a token that was never
// issued (any larger number passes), TRUNCATE, and INSERT. Those carry no
// token it could check, so it lets them through; that is what lets code
// that knows nothing of fencing keep working on the table.
//
// Strict mode, pgfence_guard_strict, requires every UPDATE and DELETE to
// present a token at least as new as the row's, and pgfence_guard_truncate
// rejects TRUNCATE (which fires no row trigger):
//
//	CREATE TRIGGER accounts_fence
//	    BEFORE UPDATE OR DELETE ON accounts
//	    FOR EACH ROW EXECUTE FUNCTION pgfence.pgfence_guard_strict('fence_token');
//	CREATE TRIGGER accounts_fence_truncate
//	    BEFORE TRUNCATE ON accounts
//	    FOR EACH STATEMENT EXECUTE FUNCTION pgfence.pgfence_guard_truncate();
//
// An UPDATE that sets the column to a larger value presents that value. One
// that leaves it unchanged (or does not mention it) presents the
// transaction's pgfence.token, which must be set; when that is newer than
// the row's token, the trigger writes it into the column, so the row always
// records the newest token that wrote it. A DELETE presents pgfence.token.
// A presented token must be at least the row's, and, when it is newer, not
// newer than the largest token the sequence may have handed out
// (pgfence_last_token(): from migration 000010 the top of the last sequence
// value's block of 1024, since pgfence_next_tokens hands out consecutive
// tokens from one value; every token drawn later is larger still); an UPDATE
// that moves the column backwards or to NULL is rejected whatever
// pgfence.token says. INSERT ... ON CONFLICT DO UPDATE is checked as the
// UPDATE of the existing row. A write that presents no token is PF004,
// mapped to [*NoTokenError]; every other rejection is PF001, mapped to
// [*StaleTokenError]. Since schema version 13, pgfence.token (set by
// [Present]) is how hand-written SQL presents a token in both modes.
// Attached any other way (AFTER, FOR EACH STATEMENT, on INSERT), the two
// functions refuse every write with SQLSTATE 39P01 instead of guarding
// nothing.
//
// Neither mode checks INSERT: a new row carries the token it is inserted
// with. So once a holder has deleted a row, a stale holder can insert it
// again (with its older token, which newer holders then overwrite): strict
// mode guards rows that exist, not their absence. Where re-creation
// matters, keep the row and mark it deleted with a guarded UPDATE.
//
// pgfence.token is an ordinary setting of the transaction:
// set_config('pgfence.token', token::text, true) sets it until the
// transaction ends, for every statement and table in it. The builders set it
// in each of their statements, so they work on strict tables (a holder can
// write the same row twice with one token) and behave as before on others.
// A pgfence.token that is neither empty nor a bigint makes either mode raise
// SQLSTATE PF003 ([SQLStateMalformedToken]), which [Classify], [Check] and
// the builders report as an error matching [ErrMalformedToken].
//
// Privileges: attaching a trigger needs EXECUTE on its function (CREATE
// TRIGGER checks it); firing needs none, so writers need nothing on pgfence
// for pgfence_guard and pgfence_guard_truncate. pgfence_guard_strict calls
// pgfence.pgfence_last_token() when a presented token is newer than the
// row's, so a writer of a strict table needs USAGE on pgfence's schema and
// EXECUTE on pgfence_last_token (migrations.Grant gives both); without them
// such a write fails with SQLSTATE 42501, it is never let through. The
// trigger functions run as the writer, with their search_path pinned to
// pg_catalog, pgfence's schema and pg_temp.
//
// Errors from the triggers are mapped to [*StaleTokenError] by the builders
// and by [Classify] and [Check], with both tokens parsed from the error's
// DETAIL and the *pgconn.PgError reachable with errors.As.
//
// The default mode costs about as much per changed row as any PL/pgSQL
// trigger for the default column fence_token, which it reads directly;
// another column is read through the row's jsonb form, which costs a
// little more. Strict mode also reads pgfence.token, and calls
// pgfence_last_token for a newer token. Where the default mode's cost
// matters (bulk updates), attach it behind WHEN conditions that call it only
// for the rows it rejects:
//
//	CREATE TRIGGER accounts_fence_update BEFORE UPDATE ON accounts FOR EACH ROW
//	    WHEN (NEW.fence_token IS NULL OR NEW.fence_token < OLD.fence_token)
//	    EXECUTE FUNCTION pgfence.pgfence_guard('fence_token');
//	CREATE TRIGGER accounts_fence_delete BEFORE DELETE ON accounts FOR EACH ROW
//	    WHEN (current_setting('pgfence.token', true) <> '')
//	    EXECUTE FUNCTION pgfence.pgfence_guard('fence_token');
//
// To protect an existing table, add the column and the trigger in a
// golang-migrate migration of your own, after pgfence's migrations have run:
//
//	-- 000010_fence_accounts.up.sql
//	ALTER TABLE accounts ADD COLUMN fence_token bigint NOT NULL DEFAULT 0;
//	CREATE TRIGGER accounts_fence
//	    BEFORE UPDATE OR DELETE ON accounts
//	    FOR EACH ROW EXECUTE FUNCTION pgfence.pgfence_guard('fence_token');
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
// Hand-written and sqlc queries are guarded by the trigger, in either mode,
// the same way: present the token once in the transaction, with [Present]
// (SQL: SELECT pgfence.pgfence_present(token)), then write, setting the
// guard column to the token in every UPDATE; [Check] (or [Classify] for
// :one and :many) tells the outcomes apart in one round trip:
//
//	-- name: Present :exec
//	SELECT pgfence.pgfence_present(@token);
//	-- name: ClaimAccount :one
//	UPDATE accounts SET fence_token = @token WHERE id = @id RETURNING balance;
//	-- name: AddBalance :execresult
//	UPDATE accounts SET balance = balance + @amount, fence_token = @token WHERE id = @id;
//
//	err = q.Present(ctx, token)
//	balance, err := q.ClaimAccount(ctx, params)
//	err = fence.Classify(err)
//	_, err = fence.Check(q.AddBalance(ctx, params))
//
// Outcomes: PF001 a [*StaleTokenError] (pgfence.ErrFenced), PF004 a
// [*NoTokenError] (pgfence.ErrNoToken: strict mode saw no token, a bug, not
// a lost lock), zero rows pgx.ErrNoRows. A set (:many) is all or nothing:
// one stale row fails the statement. The module examples/sqlc is a tested
// service built this way. sqlc's analyzer does not accept the builders'
// full statements (SQL); use this route with sqlc. Without a trigger, add
// [Predicate]'s condition to the WHERE; stale and missing are then both
// zero rows.
//
// # Installing the guard
//
// SELECT pgfence.pgfence_protect('accounts', 'fence_token', true) attaches
// strict mode (false: the default mode) as triggers pgfence_guard and
// pgfence_guard_truncate, and refuses (SQLSTATE PF005) a placement where
// they cannot protect:
//
//   - Inheritance: triggers of a parent do not fire for its children's rows,
//     so it protects every descendant too; run it again after adding one. A
//     partitioned table's row trigger reaches its partitions by itself; the
//     TRUNCATE trigger is created on each existing partition.
//   - Triggers fire in name order: another BEFORE UPDATE row trigger that
//     fires first and may write the column (its function names it,
//     rewrites NEW generically, or is not SQL or PL/pgSQL) is refused; one
//     firing after is warned of.
//   - A row moved to another partition by an UPDATE is a DELETE and an
//     INSERT underneath; the DELETE presents the token the UPDATE presented.
//
// The table's owner (only) backfills or corrects a strict table with
// SELECT pgfence.pgfence_maintenance('accounts') in the transaction: until
// it ends the owner's writes to the table and its descendants, TRUNCATE
// included, are not checked. Another role is refused (42501). Prefer it to
// ALTER TABLE ... DISABLE TRIGGER, which takes an ACCESS EXCLUSIVE lock and
// unguards the table for every role until enabled again.
//
// # How a rejection leaves the transaction
//
// A write that the builders' own predicate rejects is not an error of the
// database: the statement succeeded and wrote nothing, so the caller's
// transaction goes on (it may roll back, or do something else). A
// rejection raised by a pgfence_guard trigger (SQLSTATE PF001, from a
// hand-written query, or from a builder's write on a table whose trigger
// refuses something the builder's predicate let through) is an error of
// the statement: PostgreSQL aborts the caller's transaction, every later
// statement in it fails with SQLSTATE 25P02 until it is rolled back, and
// nothing it wrote is kept. To keep the transaction after such a
// rejection, run the statement in a savepoint (pgx.Tx's Begin) and roll
// back to it. Outside a transaction either rejection affects only the
// statement. [*StaleTokenError].Err tells them apart: nil for the
// builder's predicate, the *pgconn.PgError for a trigger.
//
// # database/sql
//
// [Stdlib] adapts a *sql.DB, *sql.Conn or *sql.Tx opened with pgx's
// database/sql driver (github.com/jackc/pgx/v5/stdlib) to [pgfence.DB], so
// the builders run on it unchanged; [CheckResult] is [Check] for an
// sql.Result. The lock strategies take a *pgxpool.Pool: a service that
// uses database/sql opens one pool and hands database/sql the same
// connections with stdlib.OpenDBFromPool(pool), so the Lockers and the
// service's queries share one pool (advisory's transaction-level locks
// also take a *sql.Tx: TryAcquireSQLTx, AcquireSQLTx).
//
// # Observing fenced writes
//
// A statement with an Observer attached ([UpdateStmt.Observer], and the
// same on every builder) reports each write rejected with a
// [*StaleTokenError] as a [pgfence.StaleWrite] event, on the caller's
// goroutine and ctx, before the call returns. When the Observer also
// implements [pgfence.OpObserver], each Exec, Query and QueryRow is
// bracketed by StartOp and EndOp with a [pgfence.Op] of Kind
// pgfence.OpFencedWrite, Strategy pgfence.StrategyFence, the Table as
// written in SQL, Statement "update", "delete", "upsert" or "claim", and,
// with UnderLease, the lease as Name; its statements run on the ctx
// StartOp returns, so a span started there is the parent of pgx's query
// spans. For Query, EndOp is called when the rows are closed. The module
// github.com/pgfence/pgfence/otelpgfence builds OpenTelemetry metrics and
// spans from these. Without an Observer a call costs one nil check more.
// [Check] and [Classify] have no Observer: they report nothing.
//
// # Search path
//
// The statements the builders send resolve nothing of their own through
// the caller's search_path: every built-in function, aggregate, operator
// and type they use is named with pg_catalog (pg_catalog.set_config,
// OPERATOR(pg_catalog.<=), $n::pg_catalog.int8, ...), and pgfence's
// functions with pgfence's schema, so a role that can create objects in a
// schema on the caller's path cannot plant an overload that runs instead.
// The caller's fragments, and the equality of an upsert's OnConflict
// columns with their values (the columns' own types), are resolved through
// the caller's search_path like any SQL the caller writes: keep schemas
// that others can write out of it, or after pg_catalog.
//
// # Fragments are trusted SQL
//
// Set, Where and Values fragments are the caller's constant SQL, written by
// the programmer, and are sent as written: never build them from user
// input, which belongs in the arguments ($1..$n). They use $1..$n for the
// caller's arguments; the token takes $n+1 and, with UnderLease, the
// lease name $n+2 and its secret $n+3. SQL and Exec check, before anything is sent, that the
// fragments use exactly $1..$n (placeholders inside string constants,
// quoted identifiers and dollar quotes do not count), and reject a fragment
// that could reach beyond its own clause: one with an unterminated string
// constant, quoted identifier or dollar quote, a comment (-- or /*), a
// parenthesis or bracket it does not close or that closes one it did not
// open (Where("id = $2) OR (id = $2") is refused), a semicolon, or a
// backslash right before a quote in a standard string constant (which a
// server with standard_conforming_strings off, not the default since
// PostgreSQL 9.1, would read as an escaped quote). Each Where fragment is
// put in parentheses and each Values expression too, so an accepted
// fragment cannot change what the guard predicate applies to. These checks
// catch mistakes; they are not a defence against hostile SQL.
//
// # Tables and placeholders
//
// Table names are given as "table" or "schema.table"; a dot always
// separates the schema. For names that contain a dot or a double quote, use
// the *Ident constructors ([UpdateIdent], [DeleteIdent], [UpsertIdent],
// [ClaimIdent]) with
// a pgx.Identifier. All identifiers are quoted with pgx.Identifier.Sanitize.
// Exec also rejects empty or over-long names, a missing Set or Where, and a
// token that is not positive.
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
