package advisory

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgfence/pgfence"
	"github.com/pgfence/pgfence/internal/hold"
)

// tryLockXactSQL takes the transaction-level exclusive advisory lock on $1
// if no other transaction holds it and, only when granted, draws a fencing
// token in the same statement (NULL when not granted).
const tryLockXactSQL = `SELECT CASE WHEN pg_catalog.pg_try_advisory_xact_lock($1) THEN %[1]s.pgfence_next_token() END`

// tryLockXactSharedSQL is tryLockXactSQL for the shared lock on $1.
const tryLockXactSharedSQL = `SELECT CASE WHEN pg_catalog.pg_try_advisory_xact_lock_shared($1) THEN %[1]s.pgfence_next_token() END`

// lockXactSQL waits for the transaction-level exclusive advisory lock on $1,
// then draws a fencing token; the materialized CTE makes the lock come first.
const lockXactSQL = `WITH k AS MATERIALIZED (SELECT pg_catalog.pg_advisory_xact_lock($1)) SELECT %[1]s.pgfence_next_token() FROM k`

// lockXactSharedSQL is lockXactSQL for the shared lock on $1.
const lockXactSharedSQL = `WITH k AS MATERIALIZED (SELECT pg_catalog.pg_advisory_xact_lock_shared($1)) SELECT %[1]s.pgfence_next_token() FROM k`

// setLockTimeoutSQL sets lock_timeout ($1, in milliseconds) for the rest of
// the transaction (or until the savepoint is rolled back) and returns the
// value it replaces.
const setLockTimeoutSQL = `SELECT pg_catalog.current_setting('lock_timeout'), pg_catalog.set_config('lock_timeout', $1, true)`

// restoreLockTimeoutSQL puts back the lock_timeout returned by
// setLockTimeoutSQL, for the rest of the transaction.
const restoreLockTimeoutSQL = `SELECT pg_catalog.set_config('lock_timeout', $1, true)`

// lockNotAvailable is the SQLSTATE of a lock wait ended by lock_timeout.
const lockNotAvailable = "55P03"

// TryAcquireTx takes the transaction-level advisory lock on key in tx if it
// is free, and returns at once with its fencing token. The lock is released
// when tx ends; it works behind transaction-pooling proxies. Locks of one
// transaction are re-entrant. The token is durable only once tx commits:
// fence with it only writes made in tx. ctx is used as pgx uses it: if it
// ends during the statement, pgx closes tx's connection.
//
// When another transaction or session holds the lock, it returns an error
// matching pgfence.ErrNotAcquired and tx is unchanged.
func (k *Locker) TryAcquireTx(ctx context.Context, tx pgx.Tx, key Key, opts *AcquireOpts) (token int64, err error) {
	if tx == nil {
		return 0, errors.New("pgfence: advisory: nil transaction")
	}
	return k.tryAcquireXact(ctx, pgxXact{tx}, key, opts)
}

// xact is what the transaction-level locks need of a transaction: pgx's
// (pgxXact) or database/sql's (sqlXact, in tx_stdlib.go).
type xact interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	// Savepoint starts a savepoint and returns the functions that
	// release it and that roll back to it (and release it).
	Savepoint(ctx context.Context) (release, rollback func(context.Context) error, err error)
}

// pgxXact is a pgx.Tx as an xact; its savepoints are pgx's nested
// transactions.
type pgxXact struct{ tx pgx.Tx }

func (x pgxXact) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	return x.tx.QueryRow(ctx, sql, args...)
}

func (x pgxXact) Savepoint(ctx context.Context) (release, rollback func(context.Context) error, err error) {
	sp, err := x.tx.Begin(ctx)
	if err != nil {
		return nil, nil, err
	}
	return sp.Commit, sp.Rollback, nil
}

func (k *Locker) tryAcquireXact(ctx context.Context, tx xact, key Key, opts *AcquireOpts) (token int64, err error) {
	if err := checkTx(key, opts); err != nil {
		return 0, err
	}
	q := k.sql.tryLockXact
	if opts != nil && opts.Shared {
		q = k.sql.tryLockXactShared
	}
	var tok *int64
	if err := tx.QueryRow(ctx, q, key.id).Scan(&tok); err != nil {
		return 0, fmt.Errorf("pgfence: advisory: lock %v in transaction: %w", key, err)
	}
	if tok == nil {
		return 0, fmt.Errorf("pgfence: advisory: lock %v in transaction: %w", key, pgfence.ErrNotAcquired)
	}
	return *tok, nil
}

// AcquireTx waits in tx for the transaction-level advisory lock on key and
// returns its fencing token; otherwise it is [Locker.TryAcquireTx]. The
// server queues waiters and detects deadlocks (SQLSTATE 40P01, which aborts
// tx). Without opts.WaitTimeout it waits until ctx ends, which ends tx.
//
// With opts.WaitTimeout, it waits in a savepoint with lock_timeout set; when
// that runs out it returns an error matching pgfence.ErrNotAcquired and
// context.DeadlineExceeded, with tx still usable.
func (k *Locker) AcquireTx(ctx context.Context, tx pgx.Tx, key Key, opts *AcquireOpts) (token int64, err error) {
	if tx == nil {
		return 0, errors.New("pgfence: advisory: nil transaction")
	}
	return k.acquireXact(ctx, pgxXact{tx}, key, opts)
}

func (k *Locker) acquireXact(ctx context.Context, tx xact, key Key, opts *AcquireOpts) (token int64, err error) {
	if err := checkTx(key, opts); err != nil {
		return 0, err
	}
	var o AcquireOpts
	if opts != nil {
		o = *opts
	}
	q := k.sql.lockXact
	if o.Shared {
		q = k.sql.lockXactShared
	}
	if o.WaitTimeout == 0 {
		if err := tx.QueryRow(ctx, q, key.id).Scan(&token); err != nil {
			return 0, fmt.Errorf("pgfence: advisory: lock %v in transaction: %w", key, err)
		}
		return token, nil
	}

	release, rollback, err := tx.Savepoint(ctx)
	if err != nil {
		return 0, fmt.Errorf("pgfence: advisory: lock %v in transaction: savepoint: %w", key, err)
	}
	ms := max(1, (o.WaitTimeout.Microseconds()+999)/1000)
	var old, set string
	err = tx.QueryRow(ctx, setLockTimeoutSQL, strconv.FormatInt(ms, 10)).Scan(&old, &set)
	if err == nil {
		err = tx.QueryRow(ctx, q, key.id).Scan(&token)
	}
	if err == nil {
		err = tx.QueryRow(ctx, restoreLockTimeoutSQL, old).Scan(&set)
	}
	if err == nil {
		err = release(ctx)
	}
	if err != nil {
		_ = rollback(ctx)
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == lockNotAvailable {
			return 0, fmt.Errorf("pgfence: advisory: lock %v in transaction: %w", key, hold.TimedOut(o.WaitTimeout))
		}
		return 0, fmt.Errorf("pgfence: advisory: lock %v in transaction: %w", key, err)
	}
	return token, nil
}

func checkTx(key Key, opts *AcquireOpts) error {
	if err := checkOpts(opts); err != nil {
		return err
	}
	if opts != nil && opts.MaxHold != 0 {
		return errors.New("pgfence: advisory: AcquireOpts.MaxHold is set; a transaction lock lasts as long as its transaction")
	}
	return key.validate()
}
