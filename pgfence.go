package pgfence

import (
	"context"
	"errors"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// DefaultSchema is the schema pgfence is installed in unless a Config's
// Schema field says otherwise.
const DefaultSchema = "pgfence"

// DB is the part of pgx's query interface pgfence uses, satisfied by
// *pgxpool.Pool, *pgxpool.Conn, *pgx.Conn and pgx.Tx.
type DB interface {
	Exec(ctx context.Context, sql string, arguments ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// ErrNotAcquired is returned when the lock is held by another owner, and
// with [context.DeadlineExceeded] when WaitTimeout ran out.
var ErrNotAcquired = errors.New("pgfence: lock is held by another owner")

// ErrAlreadyHeld is returned at once when ctx descends from a held Lease of
// the same Locker and name (a nested Do). It also matches [ErrNotAcquired].
var ErrAlreadyHeld error = alreadyHeldError{}

type alreadyHeldError struct{}

func (alreadyHeldError) Error() string { return "pgfence: lock is already held by the caller" }

func (alreadyHeldError) Is(target error) bool { return target == ErrNotAcquired }

// ErrLeaseLost is matched by a Lease's Err, and its Context's cause, once
// the lock was lost. Protected work must stop.
var ErrLeaseLost = errors.New("pgfence: lock was lost")

// The causes of a loss; each matches [ErrLeaseLost].
var (
	// ErrLeaseExpired: not renewed before the local deadline.
	ErrLeaseExpired error = lossError("pgfence: lock was lost: not renewed before its local deadline")
	// ErrLeaseTakenOver: no longer held in the database (expired there,
	// taken, or force-released).
	ErrLeaseTakenOver error = lossError("pgfence: lock was lost: no longer held in the database")
	// ErrSessionEnded: the session holding an advisory lock ended.
	ErrSessionEnded error = lossError("pgfence: lock was lost: its database session ended")
	// ErrMaxHold: held for [AcquireOpts].MaxHold, then released.
	ErrMaxHold error = lossError("pgfence: lock was lost: held for its MaxHold bound")
)

type lossError string

func (e lossError) Error() string { return string(e) }

func (e lossError) Is(target error) bool { return target == ErrLeaseLost }

// ErrNotHeld is returned when renewing or releasing a lock the caller no
// longer holds. Nothing is changed.
var ErrNotHeld = errors.New("pgfence: lock is not held by this owner")

// ErrFenced is matched by a guarded write rejected because the row carries
// a newer fencing token. The row is unchanged.
var ErrFenced = errors.New("pgfence: write rejected: row carries a newer fencing token")

// ErrClosed is returned by a Locker's methods after Close.
var ErrClosed = errors.New("pgfence: locker is closed")

// ErrNotInstalled is matched by New's error when pgfence's schema is
// missing, older than the code, or its sequence is misconfigured; the
// message says how to fix it.
var ErrNotInstalled = errors.New("pgfence: schema is not installed as this version needs")

// ErrUnsafeServer is matched by New's error when the server is one on
// which pgfence's tokens or exclusion are known not to hold: a standby (or
// a reader endpoint), YugabyteDB or CockroachDB. The message says what was
// found; docs/doctor.md says why.
var ErrUnsafeServer = errors.New("pgfence: server cannot give pgfence's guarantees")

// Lease is a held lock with its fencing token. Its methods are safe for
// concurrent use.
type Lease interface {
	Name() string
	// Token is larger for every later grant of the name.
	Token() int64
	// Done is closed when the lock is lost or released.
	Done() <-chan struct{}
	// Err is nil while held, then matches ErrLeaseLost or ErrNotHeld.
	Err() error
	// Context is cancelled, with Err as its cause, when the lock ends.
	Context() context.Context
	// Expiry is the local deadline; zero for a session advisory lock.
	Expiry() time.Time
	// Renew confirms the lock now; a transient error leaves it held.
	Renew(ctx context.Context) error
	// Release is idempotent and safe on a nil Lease.
	Release(ctx context.Context) error
}

// AcquireOpts are per-call options; nil means the defaults. A field the
// strategy cannot honour is an error, never ignored.
type AcquireOpts struct {
	// WaitTimeout bounds Acquire's and Do's wait; zero: only ctx does.
	WaitTimeout time.Duration
	// TTL overrides the Locker's TTL (lease table only).
	TTL time.Duration
	// AtLeast keeps the lease taken this long, even if released earlier
	// (lease table only).
	AtLeast time.Duration
	// Shared takes a shared lock (advisory only).
	Shared bool
	// MaxHold releases the lock once held this long, with cause
	// [ErrMaxHold]; zero: no bound.
	MaxHold time.Duration
}

// Locker is satisfied by *leasetable.Locker and *advisory.Locker.
type Locker interface {
	// TryAcquire takes the lock if free, else returns ErrNotAcquired.
	TryAcquire(ctx context.Context, name string, opts *AcquireOpts) (Lease, error)
	// Acquire waits until it holds the lock, ctx ends or WaitTimeout passes.
	Acquire(ctx context.Context, name string, opts *AcquireOpts) (Lease, error)
	// Do runs fn under the lock; fn's ctx ends with cause ErrLeaseLost on
	// loss, and Do returns fn's error joined with the loss and release's.
	Do(ctx context.Context, name string, opts *AcquireOpts, fn func(ctx context.Context, l Lease) error) error
	Stats() Stats
	// Close releases every lock (lost with ErrClosed) and wakes waiters.
	Close()
}

// ErrUnavailable is matched when no writable database was reached before
// ctx or WaitTimeout ended; the last cause stays reachable.
var ErrUnavailable = errors.New("pgfence: database unavailable")

// ErrNoToken is matched by a write to a strict-guarded table that presented
// no token (a bug, not a lost lock; it does not match [ErrFenced]).
var ErrNoToken = errors.New("pgfence: write rejected: it presented no fencing token")
