package leasetable

import (
	"context"
	"fmt"
	"time"

	"github.com/pgfence/pgfence"
)

// MinPruneAge is the smallest age [Locker.Prune] accepts.
//
// Prune's safety does not rest on the age alone: before deleting a row it
// waits for every transaction that was writing the lease table when it
// found the row (see Prune). The minimum is a second, independent guard.
// An acquirer could only re-create a pruned name with an older token if its
// acquire statement, which drew its token before the row's token was drawn,
// were still running when the row was deleted, after the row had expired and
// the age had passed: that statement and the one that drew the row's token
// would together have run for longer than the age. Acquire statements take
// milliseconds, and one that waits longer than half a minute (behind a row
// lock, on a stalled disk) is rare, so a minute protects on its own in all
// but such cases (a forward step of the database's clock shortens it by the
// size of the step). The minimum also keeps Prune away from names in active
// use: a lease released a moment ago is likely to be taken again soon,
// which updates its row in place more cheaply than inserting a new one.
const MinPruneAge = time.Minute

// DefaultPruneAge is a sensible age for [Locker.Prune], and the default of
// the pgfence prune command: a row is kept for a day after its lease was
// last released or expired, so operators can still see its last holder
// (pgfence ls --all), and each run deletes only rows nobody has used for
// that long.
const DefaultPruneAge = 24 * time.Hour

// pruneBatchSize is how many rows of the table one Prune batch reads, and
// so the most one statement deletes: a few thousand, so every statement is
// short and holds its row locks briefly, however large the table is.
const pruneBatchSize = 5000

// pruneWaitMax caps the pause between two checks for the transactions a
// Prune batch waits for.
const pruneWaitMax = 250 * time.Millisecond

// pruneScanSQL reads one page of the table in name order (%[1]s is the
// schema) through pgfence_prune_scan, a SECURITY DEFINER function: at most
// $2 rows with names after $1 (through the primary key). It returns the
// page's last name and its number of rows; the names and tokens of the
// page's rows that expired more than $3 before the database's now(); and,
// only when there are such rows, the virtual transaction ids of the other
// transactions that hold a write lock (RowExclusiveLock) on pgfence_leases
// at this moment. Every statement that puts a token into the table (an
// acquire, a force-release) holds that lock from before it draws the token
// until it commits. It takes no row locks; reading pg_locks briefly takes
// the lock manager's internal locks.
const pruneScanSQL = `SELECT last_name, page_rows, names, tokens, vxids FROM %[1]s.pgfence_prune_scan($1, $2, $3)`

// pruneRunningSQL reports whether any of the transactions $1 (virtual
// transaction ids, as pg_locks shows them) is still running: a running
// transaction holds at least the lock on its own virtual transaction id.
// It takes no row locks.
const pruneRunningSQL = `SELECT EXISTS (SELECT FROM pg_catalog.pg_locks WHERE virtualtransaction OPERATOR(pg_catalog.=) ANY($1::pg_catalog.text[]))`

// pruneDeleteSQL deletes (through pgfence_prune_delete, a SECURITY
// DEFINER function; %[1]s is the schema) the rows named $1 whose token is
// still the one in $2 (parallel arrays) and which still expired more than $3
// before the database's now(). It locks them FOR UPDATE first and skips
// every row another transaction has locked (a lease-checked write's FOR
// SHARE, a takeover in flight): such a row is left for a later Prune, and
// Prune never waits behind a row lock. It returns how many it deleted.
const pruneDeleteSQL = `SELECT %[1]s.pgfence_prune_delete($1, $2, $3)`

// Prune deletes the rows of leases that expired (or were released) more
// than olderThan ago, judged on the database's clock only (expires_at <
// now() - olderThan; the client's clock plays no part), and returns how many
// it deleted. leasetable never deletes a row otherwise: release and expiry
// leave it in place, so the table holds one row per name ever used. That is
// small for a fixed set of names; when names are made per entity
// ("account:42" for every account), call Prune now and then, for example
// hourly with [DefaultPruneAge]. Any Locker prunes the whole table, whoever
// the rows' owners were.
//
// A lease that is held, or that was released or expired less than olderThan
// ago, is never touched, nor is a row another transaction has locked (it is
// left for a later call). Deleting a row does not weaken fencing: its last
// holder lost the lease at least olderThan ago; should it still try, its
// renewal and release find no row ([pgfence.ErrNotHeld]) and package fence's
// lease-checked writes are rejected. The next acquirer of the name inserts a
// new row with a new token, larger than every earlier token of the name.
//
// That last guarantee needs care, because an acquirer draws its token before
// it learns whether the name has a row (see "Fencing tokens" in the package
// documentation). So Prune works through the table in batches of a few
// thousand rows, in name order, each step a short statement of its own: it
// reads a batch and notes the transactions that are writing pgfence_leases
// at that moment (from pg_locks), waits until all of them have ended, and
// only then deletes the rows of the batch that still carry the same token
// and are still old enough. An acquirer that drew its token before a deleted
// row's token was drawn was writing the table when Prune read the batch, so
// it has finished before the row is deleted. The wait is usually a few
// milliseconds; it lasts as long as the slowest of those transactions, for
// example a renewal queued behind a long transaction's lease-checked write.
// The statements use no session state, so Prune works through a
// transaction-pooling PgBouncer. Run concurrently, Prune calls do not
// conflict: each row is deleted once.
//
// ctx bounds the whole call. When it ends, or the Locker is closed, Prune
// stops (what was deleted stays deleted) and returns the number of rows
// deleted so far with an error wrapping ctx's cause, or
// [pgfence.ErrClosed]. It returns an error and deletes nothing when
// olderThan is below [MinPruneAge], and [pgfence.ErrClosed] after Close.
// Database errors are wrapped, also with the count so far.
func (k *Locker) Prune(ctx context.Context, olderThan time.Duration) (int64, error) {
	if olderThan < MinPruneAge {
		return 0, fmt.Errorf("pgfence: leasetable: prune: olderThan is %v; it must be at least MinPruneAge (%v)", olderThan, MinPruneAge)
	}
	if err := k.checkOpen(); err != nil {
		return 0, err
	}
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	stop := context.AfterFunc(k.closeCtx, func() { cancel(pgfence.ErrClosed) })
	defer stop()

	var deleted int64
	after := ""
	for {
		if ctx.Err() != nil {
			return deleted, pruneErr(ctx, deleted, ctx.Err())
		}
		var (
			last    *string
			scanned int64
			names   []string
			tokens  []int64
			writers []string
		)
		err := k.pool.QueryRow(ctx, k.sql.pruneScan, after, pruneBatchSize, olderThan).Scan(&last, &scanned, &names, &tokens, &writers)
		if err != nil {
			return deleted, pruneErr(ctx, deleted, err)
		}
		var n int64
		if len(names) > 0 {
			if err := k.waitForWriters(ctx, writers); err != nil {
				return deleted, pruneErr(ctx, deleted, err)
			}
			if err := k.pool.QueryRow(ctx, k.sql.pruneDelete, names, tokens, olderThan).Scan(&n); err != nil {
				return deleted, pruneErr(ctx, deleted, err)
			}
			deleted += n
		}
		k.cfg.Logger.DebugContext(ctx, "pgfence: leasetable: pruned a batch", "scanned", scanned, "deleted", n, "total", deleted)
		if scanned < pruneBatchSize || last == nil {
			return deleted, nil
		}
		after = *last
	}
}

// waitForWriters waits until none of the transactions vxids is running,
// checking again after pauses that double up to pruneWaitMax.
func (k *Locker) waitForWriters(ctx context.Context, vxids []string) error {
	if len(vxids) == 0 {
		return nil
	}
	pause := 2 * time.Millisecond
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for logged := false; ; {
		var running bool
		if err := k.pool.QueryRow(ctx, pruneRunningSQL, vxids).Scan(&running); err != nil {
			return err
		}
		if !running {
			return nil
		}
		if !logged {
			k.cfg.Logger.DebugContext(ctx, "pgfence: leasetable: prune waiting for transactions writing the lease table", "transactions", len(vxids))
			logged = true
		}
		timer.Reset(pause)
		select {
		case <-timer.C:
		case <-ctx.Done():
			return ctx.Err()
		}
		pause = min(2*pause, pruneWaitMax)
	}
}

// pruneErr wraps err, an error of the Prune whose context is ctx, with
// the number of rows deleted so far; when ctx has ended, with its cause
// instead (pgfence.ErrClosed when the Locker was closed).
func pruneErr(ctx context.Context, deleted int64, err error) error {
	if ctx.Err() != nil {
		err = context.Cause(ctx)
	}
	return fmt.Errorf("pgfence: leasetable: prune: stopped after deleting %d rows: %w", deleted, err)
}
