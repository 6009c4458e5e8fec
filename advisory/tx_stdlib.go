package advisory

import (
	"context"
	"database/sql"
	"errors"

	"github.com/jackc/pgx/v5"
)

// TryAcquireSQLTx is [Locker.TryAcquireTx] for a database/sql transaction
// on pgx's stdlib driver; ctx is used as database/sql uses it (an ended ctx
// cancels the statement and rolls tx back).
func (k *Locker) TryAcquireSQLTx(ctx context.Context, tx *sql.Tx, key Key, opts *AcquireOpts) (token int64, err error) {
	if tx == nil {
		return 0, errors.New("pgfence: advisory: nil transaction")
	}
	return k.tryAcquireXact(ctx, sqlXact{tx}, key, opts)
}

// AcquireSQLTx is [Locker.AcquireTx] for a database/sql transaction on
// pgx's stdlib driver; ctx is used as for [Locker.TryAcquireSQLTx].
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
