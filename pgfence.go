package pgfence

import (
	"context"
	"errors"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// DefaultSchema is the schema pgfence is installed in, and that every
// Locker, fence statement and CLI command uses, unless configured otherwise
// (the Schema field of each Config, the --schema flag of the pgfence
// command). It must be the schema the migrations were applied to.
const DefaultSchema = "pgfence"

// DB is the subset of pgx's query interface that pgfence needs to run a
// statement. It is satisfied by *pgxpool.Pool, *pgxpool.Conn, *pgx.Conn and
// pgx.Tx, so a guarded write can run on a pool, on one connection, or inside
// the caller's transaction.
type DB interface {
	Exec(ctx context.Context, sql string, arguments ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// ErrNotAcquired is returned by TryAcquire when the lock is held by someone
// else, and by Acquire and Do when their WaitTimeout ran out (then together
// with [context.DeadlineExceeded]). It is not a failure of the database:
// trying again later may succeed.
var ErrNotAcquired = errors.New("pgfence: lock is held by another owner")

// ErrAlreadyHeld is returned at once by TryAcquire, Acquire and Do when the
// caller already holds the lock it asks for: its ctx descends from the
// Context of a held Lease of the same Locker and name (as a nested Do's
// does). Waiting could only end when ctx does. Errors matching it also match
// [ErrNotAcquired].
var ErrAlreadyHeld error = alreadyHeldError{}

// alreadyHeldError is ErrAlreadyHeld's type: it matches ErrNotAcquired too.
type alreadyHeldError struct{}

func (alreadyHeldError) Error() string { return "pgfence: lock is already held by the caller" }

func (alreadyHeldError) Is(target error) bool { return target == ErrNotAcquired }

// ErrLeaseLost is the cause of a lock handle's context, and the value of its
// Err method, once a lock it held has been lost: the lease expired before it
// could be renewed, another owner took it over, an operator released it, or
// the database session that held it died. Work protected by the lock must
// stop; writes it still makes are rejected by fencing.
var ErrLeaseLost = errors.New("pgfence: lock was lost")

// The causes of a loss, for code and metrics that tell them apart (the
// Cause of a [Lost] event, [Lease].Err, the cause of a Lease's Context).
// Each also matches [ErrLeaseLost]. A loss because the Locker was closed
// matches [ErrClosed] instead.
var (
	// ErrLeaseExpired: no renewal succeeded before the lock's local
	// deadline (the database was unreachable or too slow, or the holder
	// was paused), so the holder gave the lock up.
	ErrLeaseExpired error = lossError("pgfence: lock was lost: not renewed before its local deadline")
	// ErrLeaseTakenOver: the database no longer holds the lock for this
	// grant: it expired there, another owner took it, or an operator
	// force-released it.
	ErrLeaseTakenOver error = lossError("pgfence: lock was lost: no longer held in the database")
	// ErrSessionEnded: the database session that held the lock ended
	// (session advisory locks), and every lock of the session with it.
	ErrSessionEnded error = lossError("pgfence: lock was lost: its database session ended")
	// ErrMaxHold: the lock reached its [AcquireOpts].MaxHold bound, so the
	// holder gave it up (it stopped renewing and released it) and its
	// context ended. Code that handles a loss handles it as one.
	ErrMaxHold error = lossError("pgfence: lock was lost: held for its MaxHold bound")
)

// lossError is the type of the causes of a loss: each matches
// ErrLeaseLost.
type lossError string

func (e lossError) Error() string { return string(e) }

func (e lossError) Is(target error) bool { return target == ErrLeaseLost }

// ErrNotHeld is returned when releasing or renewing a lock that the caller
// does not hold (any more): it was lost, or it was never acquired by this
// owner. Nothing is changed in the database.
var ErrNotHeld = errors.New("pgfence: lock is not held by this owner")

// ErrFenced is matched by errors from guarded writes that were rejected
// because the row carries a newer fencing token than the one presented: a
// later holder of the lock has written it, so the presenting holder's lock
// was lost. The row is left unchanged.
var ErrFenced = errors.New("pgfence: write rejected: row carries a newer fencing token")

// ErrClosed is returned by a Locker's methods after its Close method was
// called.
var ErrClosed = errors.New("pgfence: locker is closed")

// ErrNotInstalled is matched by the error of a Locker's New when pgfence's
// schema is missing from the database, is older than the code needs, or its
// token sequence is not configured as pgfence requires (increment 1024 from
// migration 000010, 1 before; cache 1; no cycle). The message says what is
// wrong and how to fix it.
var ErrNotInstalled = errors.New("pgfence: schema is not installed as this version needs")

// Lease is a held lock, as both strategies return it: the right, while it
// lasts, to do the work its name protects, and a fencing token to present
// to guarded writes (package fence). Its methods are safe for concurrent
// use. Type-assert it to the strategy's own type (*leasetable.Lease,
// *advisory.Lease) for what only that strategy has.
type Lease interface {
	// Name returns the name the lock was acquired by.
	Name() string
	// Token returns the fencing token drawn when the lock was granted.
	// Every later grant of the same name has a larger one.
	Token() int64
	// Done returns a channel closed when the lock ends: lost or released.
	Done() <-chan struct{}
	// Err returns nil while the lock is held; an error matching
	// ErrLeaseLost once it was lost, or ErrNotHeld once it was released.
	Err() error
	// Context returns a context cancelled, with Err as its cause, when the
	// lock ends. Derive the protected work's contexts from it.
	Context() context.Context
	// Expiry returns the local deadline at which the holder considers the
	// lock lost unless it is renewed first, on the local clock; the zero
	// time when the lock has no such deadline (it lasts as long as its
	// database session).
	Expiry() time.Time
	// Renew confirms the lock with the database now, extending it where it
	// has a TTL. On failure the lock is lost (the error matches
	// ErrLeaseLost or ErrNotHeld) or, for a transient database error, still
	// held and renewed again in the background until its Expiry.
	Renew(ctx context.Context) error
	// Release gives the lock up. It is idempotent and safe on a nil Lease
	// of either strategy.
	Release(ctx context.Context) error
}

// AcquireOpts are per-call choices for acquiring a lock. A nil *AcquireOpts
// means every default. A field that a strategy cannot honour is rejected
// with an error when set, never ignored.
type AcquireOpts struct {
	// WaitTimeout bounds how long Acquire and Do wait for the lock, in
	// addition to their context. When it elapses they return an error
	// matching both [ErrNotAcquired] and [context.DeadlineExceeded]. Zero
	// means no bound beyond the context. TryAcquire ignores it.
	WaitTimeout time.Duration

	// TTL overrides the Locker's lease TTL for this lock (lease table only;
	// advisory locks have no TTL and reject it).
	TTL time.Duration

	// AtLeast keeps the lease held for at least this long after it was
	// acquired, even when released earlier (lease table only).
	AtLeast time.Duration

	// Shared takes the lock in shared mode: any number of shared holders or
	// one exclusive holder (advisory locks only; the lease table rejects
	// it).
	Shared bool

	// MaxHold bounds how long the lock is held after it was acquired: once
	// it has passed, the lock stops being renewed and is released, and the
	// handle's context ends with cause [ErrMaxHold] (which matches
	// [ErrLeaseLost]). Zero means no bound; a negative value is an error.
	MaxHold time.Duration
}

// Locker is what both strategies' Lockers (*leasetable.Locker,
// *advisory.Locker) satisfy, so code written against it switches strategy
// by changing the constructor. Each method's contract is the same in both;
// see either package for the details.
type Locker interface {
	// TryAcquire takes the lock name if it is free and returns at once;
	// otherwise an error matching ErrNotAcquired.
	TryAcquire(ctx context.Context, name string, opts *AcquireOpts) (Lease, error)
	// Acquire waits until it holds the lock name, ctx ends (an error
	// wrapping ctx's cause), or opts.WaitTimeout elapses.
	Acquire(ctx context.Context, name string, opts *AcquireOpts) (Lease, error)
	// Do acquires the lock like Acquire, calls fn with it, and releases it.
	// fn's ctx is cancelled, with cause ErrLeaseLost, if the lock is lost.
	// Do returns fn's error joined with the loss (matching ErrLeaseLost)
	// whenever the lock was lost before fn returned, and with the
	// release's error.
	Do(ctx context.Context, name string, opts *AcquireOpts, fn func(ctx context.Context, l Lease) error) error
	// Stats returns a snapshot of the Locker's state and counters.
	Stats() Stats
	// Close releases every lock the Locker holds (they end as lost, with
	// ErrClosed), wakes waiters with ErrClosed and stops its goroutines.
	Close()
}

// ErrUnavailable is matched by the error of a call that could not reach a
// writable database and gave up: connection refused or reset, the server
// shutting down or starting, a read-only standby (a demoted primary during
// failover), a serialization failure. pgfence retries these with capped,
// jittered backoff while the call's ctx and WaitTimeout allow; the error
// it returns then wraps both ErrUnavailable and the last cause (a
// *pgconn.PgError stays reachable with errors.As). Trying again later may
// succeed.
var ErrUnavailable = errors.New("pgfence: database unavailable")

// ErrNoToken is matched by the error of a write to a table guarded in strict
// mode that presented no fencing token (SQLSTATE PF004): the transaction
// never called fence.Present (pgfence_present in SQL). It is a bug in the
// writing code, not a lost lock, so it does not match [ErrFenced]. Nothing
// was written.
var ErrNoToken = errors.New("pgfence: write rejected: it presented no fencing token")
