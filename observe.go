package pgfence

import (
	"context"
	"time"
)

// Strategy names, as events and [Op] report them.
const (
	// StrategyLeaseTable is the lease table (package leasetable).
	StrategyLeaseTable = "leasetable"
	// StrategyAdvisory is session advisory locks (package advisory).
	StrategyAdvisory = "advisory"
	// StrategyLeader is leader election on the lease table (package leader).
	StrategyLeader = "leader"
	// StrategyFence is fenced writes (package fence); only [StaleWrite]
	// events carry it.
	StrategyFence = "fence"
)

// Observer receives typed events from a Locker (set it in the Observer
// field of leasetable.Config or advisory.Config) and from fenced writes.
// The same events, with the same fields, come from both strategies; each
// event's doc says when it is sent. Use it for metrics, audit logs and
// alerts. The module github.com/pgfence/pgfence/otelpgfence builds
// OpenTelemetry metrics and spans from it.
//
// Delivery. Events of a caller's call (Acquired, NotAcquired, Released,
// StaleWrite) are delivered synchronously on the caller's goroutine, with
// the caller's ctx, before the call returns. Events of a Locker's own
// goroutines (Renewed, RenewalFailed, Lost, ListenLost, ListenRestored)
// are queued to one delivery goroutine per Locker, so that a slow Observer
// never delays a renewal: when its queue is full, an event is dropped and
// counted in [Stats].EventsDropped. Their ctx carries the values of the
// ctx that acquired the lease, and no cancellation.
//
// Observe must not call the Locker that sent the event. It may be called
// from several goroutines at once.
type Observer interface {
	// Observe is called once per event. e is one of the event types of
	// this package: [Acquired], [NotAcquired], [Renewed], [RenewalFailed],
	// [Lost], [Released], [ListenLost], [ListenRestored], [StaleWrite].
	Observe(ctx context.Context, e Event)
}

// ObserverFunc adapts a function to an [Observer].
type ObserverFunc func(ctx context.Context, e Event)

// Observe calls f(ctx, e).
func (f ObserverFunc) Observe(ctx context.Context, e Event) { f(ctx, e) }

// OpObserver is an optional extension of [Observer], for tracing: when the
// configured Observer also implements it, each operation pgfence runs is
// bracketed by StartOp and EndOp, and the ctx StartOp returns is the one
// the operation's statements run with (so a span started there is the
// parent of pgx's query spans). StartOp and EndOp are called on the
// goroutine that runs the operation: the caller's for acquire, release and
// fenced writes, the Locker's for renewals.
type OpObserver interface {
	// StartOp is called before the operation sends its first statement.
	StartOp(ctx context.Context, op Op) context.Context
	// EndOp is called when it ended, with the ctx StartOp returned and
	// the operation's error (nil on success).
	EndOp(ctx context.Context, op Op, err error)
}

// OpKind says what an [Op] does.
type OpKind int

// The operations an [OpObserver] is told about.
const (
	// OpAcquire is a TryAcquire, Acquire or the acquire of a Do: all its
	// attempts, waits included.
	OpAcquire OpKind = iota + 1
	// OpRelease is a release, retries included.
	OpRelease
	// OpRenew is one renewal round trip; the lease table renews many
	// leases in one statement (Op.Batch).
	OpRenew
	// OpFencedWrite is one guarded statement of package fence.
	OpFencedWrite
)

// String returns the operation's name as spans use it: "acquire",
// "release", "renew", "fenced_write".
func (k OpKind) String() string {
	switch k {
	case OpAcquire:
		return "acquire"
	case OpRelease:
		return "release"
	case OpRenew:
		return "renew"
	case OpFencedWrite:
		return "fenced_write"
	}
	return "unknown"
}

// Op describes an operation to an [OpObserver].
type Op struct {
	// Kind is what the operation does.
	Kind OpKind
	// Strategy is one of the Strategy constants.
	Strategy string
	// Name is the lock name; empty for a batch of several.
	Name string
	// Batch is the number of locks the operation covers (1 unless the
	// statement serves several callers or leases at once).
	Batch int
	// Links are the contexts of the other callers served by the same
	// statement (the ctx passed to StartOp is the one that opened the
	// batch). A tracer links their spans. Nil for a single caller.
	Links []context.Context
	// Table is the guarded table of an OpFencedWrite, quoted as the
	// statement names it (fence's StaleTokenError.Table).
	Table string
	// Statement is the kind of an OpFencedWrite: "update", "upsert",
	// "delete" or "claim".
	Statement string
}

// Event is one of the event types of this package; switch on its type.
// The set is closed: it is implemented only by the types below.
type Event interface {
	// Strategy returns the strategy that sent the event (one of the
	// Strategy constants).
	Strategy() string
	event()
}

// Lock identifies the lock an event is about.
type Lock struct {
	// Kind is the strategy (one of the Strategy constants).
	Kind string
	// Name is the lock name.
	Name string
	// Token is the fencing token of the grant; 0 when none was granted.
	Token int64
}

// Strategy returns l.Kind.
func (l Lock) Strategy() string { return l.Kind }

// Acquired is sent when a lock is granted, before TryAcquire, Acquire or
// Do return it.
type Acquired struct {
	Lock
	// Wait is how long the call took, from its start to the grant.
	Wait time.Duration
	// Attempts is the number of times the database was asked (1 when
	// the lock was free at once).
	Attempts int
}

// NotAcquired is sent when TryAcquire, Acquire or Do return without a
// lock, for any reason but bad input.
type NotAcquired struct {
	Lock
	// Wait is how long the call took.
	Wait time.Duration
	// Attempts is the number of times the database was asked.
	Attempts int
	// Err is the error the call returned: it matches [ErrNotAcquired]
	// (held by another, or WaitTimeout), [ErrUnavailable], [ErrClosed], or
	// wraps the ctx's cause.
	Err error
}

// Renewed is sent when a lease was confirmed by the database: its TTL
// extended (lease table) or its session found alive (advisory).
type Renewed struct {
	Lock
	// Expiry is the new local deadline ([Lease].Expiry); zero when the
	// lock has none.
	Expiry time.Time
}

// RenewalFailed is sent when a renewal attempt failed but the lock is
// still held: it will be tried again before its Expiry.
type RenewalFailed struct {
	Lock
	// Attempt counts the consecutive failed attempts, from 1.
	Attempt int
	// Err is the attempt's error.
	Err error
}

// Lost is sent when a held lock was lost.
type Lost struct {
	Lock
	// HeldFor is how long it was held, from the grant.
	HeldFor time.Duration
	// Cause matches [ErrLeaseLost]; it says why (expired before renewal,
	// taken over, force-released, session died, Locker closed).
	Cause error
}

// Released is sent when a held lock was released by its holder.
type Released struct {
	Lock
	// HeldFor is how long it was held, from the grant to the release.
	HeldFor time.Duration
	// Err is the release's error: nil, or the error of a release that
	// failed (the lock then ends at its expiry; a transient failure is
	// retried in the background).
	Err error
}

// ListenLost is sent when a Locker's LISTEN connection failed: waiters
// fall back to polling until it is restored.
type ListenLost struct {
	// Kind is the strategy (one of the Strategy constants).
	Kind string
	// Err is why.
	Err error
}

// Strategy returns e.Kind.
func (e ListenLost) Strategy() string { return e.Kind }

// ListenRestored is sent when a Locker's LISTEN connection is listening
// again (after a ListenLost; not at the first start).
type ListenRestored struct {
	// Kind is the strategy (one of the Strategy constants).
	Kind string
	// Down is how long it was not listening.
	Down time.Duration
}

// Strategy returns e.Kind.
func (e ListenRestored) Strategy() string { return e.Kind }

// StaleWrite is sent when a fenced write was rejected because the row
// carries a newer token ([ErrFenced]).
type StaleWrite struct {
	// Table is the guarded table, quoted as the statement names it.
	Table string
	// Presented is the token the write presented.
	Presented int64
	// Current is the row's token.
	Current int64
}

// Strategy returns StrategyFence.
func (StaleWrite) Strategy() string { return StrategyFence }

func (Acquired) event()       {}
func (NotAcquired) event()    {}
func (Renewed) event()        {}
func (RenewalFailed) event()  {}
func (Lost) event()           {}
func (Released) event()       {}
func (ListenLost) event()     {}
func (ListenRestored) event() {}
func (StaleWrite) event()     {}

// Stats is a snapshot of a Locker's state and counters, from its Stats
// method. Counters start at zero when the Locker is made and only grow.
type Stats struct {
	// Held is the number of locks held now.
	Held int
	// Waiting is the number of calls waiting in Acquire or Do now.
	Waiting int
	// Acquired counts grants.
	Acquired uint64
	// NotAcquired counts calls that returned without a lock.
	NotAcquired uint64
	// Released counts locks released by their holder.
	Released uint64
	// Lost counts locks lost.
	Lost uint64
	// RenewalFailures counts failed renewal attempts (of locks still
	// held at the time).
	RenewalFailures uint64
	// Listening reports whether the LISTEN connection is listening now
	// (false with DisableListen). A lease table Locker's connection listens
	// only while one of its calls waits, and a second after.
	Listening bool
	// EventsDropped counts background events not delivered because the
	// Observer was too slow.
	EventsDropped uint64
}

// NoTokenWrite is sent when a fenced write was rejected because it
// presented no token ([ErrNoToken]): a bug in the writing code, not a stale
// holder, so it is not a [StaleWrite]. Observers receive it like StaleWrite.
type NoTokenWrite struct {
	// Table is the guarded table, quoted as the statement names it.
	Table string
	// Current is the row's token.
	Current int64
}

// Strategy returns StrategyFence.
func (NoTokenWrite) Strategy() string { return StrategyFence }

func (NoTokenWrite) event() {}
