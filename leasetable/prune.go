package leasetable

import (
	"context"
	"fmt"
	"time"

	"github.com/pgfence/pgfence"
)

// MinPruneAge is the smallest age [Locker.Prune] accepts, a guard beside
// its wait for the table's writers.
const MinPruneAge = time.Minute

// DefaultPruneAge is a sensible age for [Locker.Prune], the pgfence prune
// command's default: a row is kept a day after its lease ended.
const DefaultPruneAge = 24 * time.Hour

// pruneBatchSize is how many rows one Prune batch reads.
const pruneBatchSize = 5000

// pruneWaitMax caps the pause between two checks for the transactions a
// Prune batch waits for.
const pruneWaitMax = 250 * time.Millisecond

// pruneScanSQL reads, through the SECURITY DEFINER pgfence_prune_scan, up to
// $2 rows named after $1 (%[1]s is the schema). It returns the page's last
// name and size, the names and tokens of rows expired more than $3 ago and,
// when there are any, the virtual transaction ids holding a write lock on
// pgfence_leases (every token draw holds one). It takes no row locks.
const pruneScanSQL = `SELECT last_name, page_rows, names, tokens, vxids FROM %[1]s.pgfence_prune_scan($1, $2, $3)`

// pruneRunningSQL reports whether any of the transactions $1 (virtual ids)
// is still running. It takes no row locks.
const pruneRunningSQL = `SELECT EXISTS (SELECT FROM pg_catalog.pg_locks WHERE virtualtransaction OPERATOR(pg_catalog.=) ANY($1::pg_catalog.text[]))`

// pruneDeleteSQL deletes, through the SECURITY DEFINER pgfence_prune_delete,
// the rows $1 still carrying the tokens $2 and still expired more than $3
// ago, skipping rows another transaction has locked. It returns the count.
const pruneDeleteSQL = `SELECT %[1]s.pgfence_prune_delete($1, $2, $3)`

// Prune deletes the rows of leases that ended more than olderThan ago, on
// the database's clock, and returns how many it deleted. Rows are otherwise
// never deleted: call it now and then when names are made per entity.
// Held and recent leases, and rows another transaction has locked, are not
// touched. Before deleting a batch Prune waits for the transactions writing
// the table, so no acquirer re-creates a name with an older token. ctx
// bounds the whole call.
//
// It returns an error, deleting nothing, when olderThan is below
// [MinPruneAge]; when ctx ends or the Locker closes, the count so far with
// an error wrapping ctx's cause or [pgfence.ErrClosed]; and database errors
// wrapped, with the count so far.
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

// pruneErr wraps err with the count so far, or with ctx's cause once ctx
// has ended.
func pruneErr(ctx context.Context, deleted int64, err error) error {
	if ctx.Err() != nil {
		err = context.Cause(ctx)
	}
	return fmt.Errorf("pgfence: leasetable: prune: stopped after deleting %d rows: %w", deleted, err)
}
