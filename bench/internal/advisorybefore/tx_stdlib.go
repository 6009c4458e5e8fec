package advisory

import (
	"context"
	"database/sql"
	"errors"

	"github.com/jackc/pgx/v5"
)

// TryAcquireSQLTx is [Locker.TryAcquireTx] for a database/sql transaction
// opened on pgx's driver (github.com/jackc/pgx/v5/stdlib): it takes the
// transaction-level advisory lock on key in tx if it is free and returns
// its fencing token, or an error matching pgfence.ErrNotAcquired. The lock
// is released when tx commits or rolls back. Everything said of
// TryAcquireTx holds, except that ctx is used as database/sql uses it: if
// it ends during the statement, the driver cancels the statement and
// database/sql rolls tx back.
func (k *Locker) TryAcquireSQLTx(ctx context.Context, tx *sql.Tx, key Key, opts *AcquireOpts) (token int64, err error) {
	if tx == nil {
		return 0, errors.New("pgfence: advisory: nil transaction")
	}
	return k.tryAcquireXact(ctx, sqlXact{tx}, key, opts)
}

// AcquireSQLTx is [Locker.AcquireTx] for a database/sql transaction opened
// on pgx's driver: it waits in tx for the transaction-level advisory lock
// on key and returns its fencing token. With opts.WaitTimeout set it waits
// inside a savepoint with lock_timeout set, and when that runs out returns
// an error matching pgfence.ErrNotAcquired and context.DeadlineExceeded
// with tx still usable. ctx is used as database/sql uses it (see
// [Locker.TryAcquireSQLTx]).
func (k *Locker) AcquireSQLTx(ctx context.Context, tx *sql.Tx, key Key, opts *AcquireOpts) (token int64, err error) {
	if tx == nil {
		return 0, errors.New("pgfence: advisory: nil transaction")
	}
	return k.acquireXact(ctx, sqlXact{tx}, key, opts)
}

// sqlXact is a *sql.Tx as an xact. *sql.Row's Scan is pgx.Row's.
type sqlXact struct{ tx *sql.Tx }

func (x sqlXact) QueryRow(ctx context.Context, query string, args ...any) pgx.Row {
	return x.tx.QueryRowContext(ctx, query, args...)
}

// The savepoint AcquireSQLTx waits in. Savepoint names are scoped to the
// transaction, and it is released before AcquireSQLTx returns.
const (
	savepointSQL         = `SAVEPOINT pgfence_advisory_wait`
	releaseSavepointSQL  = `RELEASE SAVEPOINT pgfence_advisory_wait`
	rollbackSavepointSQL = `ROLLBACK TO SAVEPOINT pgfence_advisory_wait`
)

func (x sqlXact) Savepoint(ctx context.Context) (release, rollback func(context.Context) error, err error) {
	if _, err := x.tx.ExecContext(ctx, savepointSQL); err != nil {
		return nil, nil, err
	}
	release = func(ctx context.Context) error {
		_, err := x.tx.ExecContext(ctx, releaseSavepointSQL)
		return err
	}
	rollback = func(ctx context.Context) error {
		if _, err := x.tx.ExecContext(ctx, rollbackSavepointSQL); err != nil {
			return err
		}
		return release(ctx)
	}
	return release, rollback, nil
}
