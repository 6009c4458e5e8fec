package chaos

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence"
	"github.com/pgfence/pgfence/advisory"
	"github.com/pgfence/pgfence/fence"
)

// Watched is implemented by a [Holder] that learns when its lock is lost:
// Done is closed then (a leasetable lease, an advisory session lock). The
// workload records, on each Read and Write, whether Done was already closed
// when the operation was invoked ([Op.Lost]); it does not skip the
// operation, so that the fence, not the holder's caution, is what the
// history tests.
type Watched interface {
	Done() <-chan struct{}
}

// Scoped is implemented by a [Holder] whose lock lives in a database
// transaction (an advisory transaction lock): the register's operations of
// the critical section must run in that transaction (through
// [ScopedRegister.On]), and they take effect only if Release commits it.
type Scoped interface {
	DB() pgfence.DB
}

// ScopedRegister is a [Register] that can run its operations on a given
// database handle, such as the transaction of a [Scoped] holder.
type ScopedRegister interface {
	Register
	On(db pgfence.DB) Register
}

// PgfenceLocker is a [Locker] backed by one of pgfence's lockers (a
// *leasetable.Locker or an *advisory.Locker, both pgfence.Locker): Acquire
// is the Locker's Acquire, and the [Holder] is the pgfence.Lease it returns,
// whose Token, Release and Done ([Watched]) the workload uses as they are.
type PgfenceLocker struct {
	// L is the locker.
	L pgfence.Locker
	// Opts are the options of each acquisition; nil means the defaults.
	Opts *pgfence.AcquireOpts
}

// Every pgfence.Lease is a Holder the workload can watch.
var (
	_ Holder  = pgfence.Lease(nil)
	_ Watched = pgfence.Lease(nil)
)

// Acquire implements [Locker].
func (l *PgfenceLocker) Acquire(ctx context.Context, name string) (Holder, error) {
	lease, err := l.L.Acquire(ctx, name, l.Opts)
	if err != nil {
		return nil, err
	}
	return lease, nil
}

// AdvisoryTxLocker is a [Locker] of advisory transaction locks: Acquire
// begins a transaction on Pool and waits in it with L's AcquireTx on
// advisory.Name(name); the holder is [Scoped] (the register's operations
// run in that transaction) and Release commits it, which releases the lock.
type AdvisoryTxLocker struct {
	// L is the advisory locker whose AcquireTx takes the locks; it opens no
	// session for them.
	L *advisory.Locker
	// Pool is where the transactions run.
	Pool *pgxpool.Pool
}

// Acquire implements [Locker].
func (l *AdvisoryTxLocker) Acquire(ctx context.Context, name string) (Holder, error) {
	tx, err := l.Pool.Begin(ctx)
	if err != nil {
		return nil, &notSentError{err}
	}
	tok, err := l.L.AcquireTx(ctx, tx, advisory.Name(name), nil)
	if err != nil {
		_ = tx.Rollback(context.WithoutCancel(ctx))
		return nil, err
	}
	return &txHolder{tx: tx, token: tok}, nil
}

type txHolder struct {
	tx    pgx.Tx
	token int64
}

func (h *txHolder) Token() int64   { return h.token }
func (h *txHolder) DB() pgfence.DB { return h.tx }

// Release commits the transaction.
func (h *txHolder) Release(ctx context.Context) error { return commitErr(h.tx.Commit(ctx)) }

// commitErr classifies the error of a COMMIT: a commit that reports the
// transaction rolled back (it had failed) is a failure; any other error
// leaves the outcome unknown. pgx can report a commit whose connection broke
// with an error that says it is safe to retry (pgconn's "conn closed") even
// though the server committed: the suite saw such a write land, so no
// commit error other than a rollback is taken as "not done".
func commitErr(err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, pgx.ErrTxCommitRollback):
		return &notSentError{err}
	default:
		return &unknownError{err}
	}
}

// unknownError is an error after which the operation's outcome is unknown,
// whatever the wrapped error says.
type unknownError struct{ err error }

func (e *unknownError) Error() string { return "chaos: outcome unknown: " + e.err.Error() }
func (e *unknownError) Unwrap() error { return e.err }

// SQL of FenceRegister. %[1]s is the sanitized table name.
const (
	// fenceRegisterRead reads the row the claim has just row-locked, in the
	// claim's transaction.
	fenceRegisterRead = `SELECT val, fence_token FROM %[1]s WHERE id = 1`
)

// FenceRegister is a [Register] whose writes go through package fence's
// generated guarded UPDATE (fence.Update(table).Set("val = $1")
// .Where("id = 1")), optionally lease-checked with UnderLease. A stale
// write fails with an error matching pgfence.ErrFenced; a lease-checked
// write whose lease is no longer held fails with one matching
// pgfence.ErrLeaseLost (recorded as a plain failure: nothing was written,
// but the row need not carry a newer token yet).
//
// Its Read claims the row: in one transaction it runs the guarded UPDATE
// with Set("val = val") (moving the row's token to the holder's, or failing
// as fenced) and then reads the row, which the claim holds locked until the
// commit. See the package documentation on why the claim is needed.
type FenceRegister struct {
	db      pgfence.DB
	table   string
	write   *fence.UpdateStmt
	claim   *fence.UpdateStmt
	noClaim bool
	lease   string         // the lease its writes are checked against, if any
	secret  pgfence.Secret // that lease's secret, set by ForHolder
}

// ForHolder implements [HolderRegister]: a lease-checked register presents
// h's secret (h must be a lease-table lease); others are returned as they
// are.
func (r *FenceRegister) ForHolder(h Holder) Register {
	if r.lease == "" {
		return r
	}
	c := *r
	if s, ok := h.(interface{ Secret() pgfence.Secret }); ok {
		c.secret = s.Secret()
	}
	c.write, c.claim = r.write.UnderLease(r.lease, c.secret), r.claim.UnderLease(r.lease, c.secret)
	return &c
}

// WithoutClaim returns a copy of r whose reads do not claim the row (a
// plain SELECT), writes still fenced: the negative control showing that a
// fenced write alone does not protect a read-modify-write (see the package
// documentation).
func (r *FenceRegister) WithoutClaim() *FenceRegister {
	c := *r
	c.noClaim = true
	return &c
}

// NewFenceRegister creates table (if missing) with its one row, as
// [NewSQLRegister] does, and returns a register writing it through package
// fence. A non-empty lease makes every claim and write lease-checked
// (UnderLease(lease, secret)) once [FenceRegister.ForHolder] has given it
// the holder's secret, as the workload does: use the workload's lock name
// with a [PgfenceLocker] of a leasetable Locker.
func NewFenceRegister(ctx context.Context, db pgfence.DB, table, lease string) (*FenceRegister, error) {
	if _, err := NewSQLRegister(ctx, db, table, true); err != nil {
		return nil, err
	}
	r := &FenceRegister{
		db:    db,
		table: pgx.Identifier{table}.Sanitize(),
		write: fence.UpdateIdent(pgx.Identifier{table}).Set("val = $1").Where("id = 1"),
		claim: fence.UpdateIdent(pgx.Identifier{table}).Set("val = val").Where("id = 1"),
	}
	if lease != "" {
		// Until ForHolder gives it a secret, a lease-checked write is
		// refused (a zero Secret proves nothing).
		r.lease = lease
		r.write, r.claim = r.write.UnderLease(lease, pgfence.Secret{}), r.claim.UnderLease(lease, pgfence.Secret{})
	}
	return r, nil
}

// Claims implements [Register]: reads claim the row unless WithoutClaim.
func (r *FenceRegister) Claims() bool { return !r.noClaim }

// On implements [ScopedRegister].
func (r *FenceRegister) On(db pgfence.DB) Register {
	c := *r
	c.db = db
	return &c
}

// Read implements [Register]. On a pool it runs in a transaction of its
// own: a failure before the commit leaves nothing behind, and only the
// commit's outcome can be unknown. On a transaction (a [Scoped] holder's) it
// runs in it.
func (r *FenceRegister) Read(ctx context.Context, token int64) (int64, int64, error) {
	if r.noClaim {
		var val, tok int64
		err := r.db.QueryRow(ctx, fmt.Sprintf(fenceRegisterRead, r.table)).Scan(&val, &tok)
		return val, tok, err
	}
	tx, isTx := r.db.(pgx.Tx)
	if !isTx {
		b, ok := r.db.(interface {
			Begin(context.Context) (pgx.Tx, error)
		})
		if !ok {
			return 0, 0, errors.New("chaos: FenceRegister needs a pool, a connection or a transaction")
		}
		var err error
		if tx, err = b.Begin(ctx); err != nil {
			return 0, 0, &notSentError{err}
		}
		defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	}
	var val, tok int64
	err := r.claimAndRead(ctx, tx, token, &val, &tok)
	if err == nil && !isTx {
		return val, tok, commitErr(tx.Commit(ctx))
	}
	if err != nil && !isTx && !errors.Is(err, pgfence.ErrFenced) {
		// The transaction never committed: nothing took effect.
		err = &notSentError{err}
	}
	return val, tok, err
}

func (r *FenceRegister) claimAndRead(ctx context.Context, db pgfence.DB, token int64, val, tok *int64) error {
	if _, err := r.claim.Exec(ctx, db, token); err != nil {
		return err
	}
	return db.QueryRow(ctx, fmt.Sprintf(fenceRegisterRead, r.table)).Scan(val, tok)
}

// Write implements [Register].
func (r *FenceRegister) Write(ctx context.Context, token, value int64) error {
	_, err := r.write.Exec(ctx, r.db, token, value)
	return err
}

// Final reads the register's value and token, after a workload.
func (r *FenceRegister) Final(ctx context.Context) (RegisterState, error) {
	var s RegisterState
	err := r.db.QueryRow(ctx, fmt.Sprintf(fenceRegisterRead, r.table)).Scan(&s.Value, &s.Token)
	return s, err
}
