// Package ledger is a service written with sqlc that protects per-account
// rows with pgfence: one lease, leasetable's "ledger", serialises the
// workers, and every write presents the lease's fencing token, so a worker
// that paused past its lease cannot overwrite the work of the one that
// replaced it.
//
// schema.sql attaches the guard to accounts with pgfence_protect in strict
// mode, and each transaction follows the fencing recipe: Present (the query
// calling pgfence_present) once, then every UPDATE sets the guard column to
// the token. The guard rejects a stale token with SQLSTATE PF001 and a
// write that presents none with PF004; [fence.Classify] and [fence.Check]
// turn these into a *fence.StaleTokenError (pgfence.ErrFenced) and a
// *fence.NoTokenError (pgfence.ErrNoToken), and tell both from a missing
// account in one round trip.
//
// Deposit is a read-modify-write, so it claims the account before reading
// it: ClaimAccount sets the token on the row and returns the balance in one
// statement. A write by an older holder that is still in flight is waited
// for, and its result read; one that comes later is rejected. Reading
// without claiming first (ReadBalance) loses deposits when a paused holder
// commits between the read and the write: the tests show both.
//
// Regenerate ledgerdb with `go tool sqlc generate` in this directory
// (sqlc is a tool of this module); .ci/sqlc-check fails when the committed
// code is not what sqlc generates.
package ledger

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence/examples/sqlc/ledgerdb"
	"github.com/pgfence/pgfence/fence"
)

// Deposit adds amount to account id, as the holder of the fencing token,
// in one transaction: it presents the token, claims the account and reads
// its balance, writes the new balance and records the deposit. pause, when
// not nil, is called after the write and before the commit (the tests
// pause a worker there).
//
// It returns an error matching pgfence.ErrFenced when a newer holder has
// claimed or written the account (nothing is written), and pgx.ErrNoRows
// when there is no such account.
func Deposit(ctx context.Context, pool *pgxpool.Pool, token int64, id int32, amount int64, pause func()) error {
	return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		q := ledgerdb.New(tx)
		if err := q.Present(ctx, token); err != nil {
			return fmt.Errorf("ledger: present token %d: %w", token, err)
		}
		return claimAndWrite(ctx, q, token, id, amount, pause)
	})
}

// claimAndWrite claims account id, reads its balance and writes it, in a
// transaction that presented token.
func claimAndWrite(ctx context.Context, q *ledgerdb.Queries, token int64, id int32, amount int64, pause func()) error {
	balance, err := q.ClaimAccount(ctx, ledgerdb.ClaimAccountParams{Token: token, ID: id})
	if err != nil {
		return fmt.Errorf("ledger: claim account %d: %w", id, fence.Classify(err))
	}
	return write(ctx, q, token, id, balance, amount, pause)
}

// write sets the new balance, checked, records the deposit, and pauses.
func write(ctx context.Context, q *ledgerdb.Queries, token int64, id int32, balance, amount int64, pause func()) error {
	_, err := fence.Check(q.SetBalance(ctx, ledgerdb.SetBalanceParams{Balance: balance + amount, Token: token, ID: id}))
	if err != nil {
		return fmt.Errorf("ledger: write account %d: %w", id, err)
	}
	if err := q.AddDeposit(ctx, ledgerdb.AddDepositParams{AccountID: id, Amount: amount, Token: token}); err != nil {
		return fmt.Errorf("ledger: record deposit: %w", err)
	}
	if pause != nil {
		pause()
	}
	return nil
}

// Audit returns, per account, the balance minus the sum of its recorded
// deposits: all zero when no deposit was lost.
func Audit(ctx context.Context, db ledgerdb.DBTX) (map[int32]int64, error) {
	rows, err := ledgerdb.New(db).AuditAccounts(ctx)
	if err != nil {
		return nil, err
	}
	out := make(map[int32]int64, len(rows))
	for _, r := range rows {
		out[r.ID] = r.Balance - r.Deposited
	}
	return out, nil
}
