package pgfence

import (
	"context"
	"time"
)

// Strategy names, as events and [Op] report them: the packages leasetable,
// advisory, leader and fence.
const (
	StrategyLeaseTable = "leasetable"
	StrategyAdvisory   = "advisory"
	StrategyLeader     = "leader"
	StrategyFence      = "fence"
)

// Observer receives typed events from a Locker's Config and fenced writes.
// Events of a caller's call arrive on its goroutine before the call
// returns; those of a Locker's own goroutines go through a bounded queue
// (drops are counted in [Stats].EventsDropped), with the acquiring ctx's
// values. Observe may run concurrently and must not call the Locker.
type Observer interface {
	Observe(ctx context.Context, e Event)
}

// ObserverFunc adapts a function to an [Observer].
type ObserverFunc func(ctx context.Context, e Event)

// Observe calls f(ctx, e).
func (f ObserverFunc) Observe(ctx context.Context, e Event) { f(ctx, e) }

// OpObserver is an [Observer] that also brackets each operation, for
// tracing: the operation's statements run with the ctx StartOp returns, and
// EndOp gets that ctx and the operation's error.
type OpObserver interface {
	StartOp(ctx context.Context, op Op) context.Context
	EndOp(ctx context.Context, op Op, err error)
}

// OpKind says what an [Op] does.
type OpKind int

// The operations an [OpObserver] is told about: an acquire with its waits,
// a release with its retries, one renewal round trip, one fenced write.
const (
	OpAcquire OpKind = iota + 1
	OpRelease
	OpRenew
	OpFencedWrite
)

// String returns "acquire", "release", "renew" or "fenced_write".
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
	Kind     OpKind
	Strategy string
	// Name is the lock name; empty for a batch.
	Name string
	// Batch is the number of locks one statement covers.
	Batch int
	// Links are the other callers' contexts served by the same statement.
	Links []context.Context
	// Table and Statement ("update", "upsert", "delete", "claim")
	// describe an OpFencedWrite.
	Table     string
	Statement string
}

// Event is one of this package's event types; the set is closed.
type Event interface {
	Strategy() string
	event()
}

// Lock identifies the lock an event is about; Token is 0 when none was
// granted.
type Lock struct {
	Kind  string
	Name  string
	Token int64
}

// Strategy returns l.Kind.
func (l Lock) Strategy() string { return l.Kind }

// Acquired is sent when a lock is granted, with the call's wait and the
// number of times the database was asked.
type Acquired struct {
	Lock
	Wait     time.Duration
	Attempts int
}

// NotAcquired is sent when an acquire returns without a lock; Err is the
// call's error.
type NotAcquired struct {
	Lock
	Wait     time.Duration
	Attempts int
	Err      error
}

// Renewed is sent when the database confirmed a lock; Expiry is the new
// local deadline.
type Renewed struct {
	Lock
	Expiry time.Time
}

// RenewalFailed is sent when a renewal failed but the lock is still held;
// Attempt counts consecutive failures from 1.
type RenewalFailed struct {
	Lock
	Attempt int
	Err     error
}

// Lost is sent when a held lock was lost; Cause matches [ErrLeaseLost].
type Lost struct {
	Lock
	HeldFor time.Duration
	Cause   error
}

// Released is sent when the holder released a lock; Err is the release's.
type Released struct {
	Lock
	HeldFor time.Duration
	Err     error
}

// ListenLost is sent when a Locker's LISTEN connection failed; waiters
// poll until it is restored.
type ListenLost struct {
	Kind string
	Err  error
}

// Strategy returns e.Kind.
func (e ListenLost) Strategy() string { return e.Kind }

// ListenRestored is sent when it listens again after a ListenLost; Down is
// how long it did not.
type ListenRestored struct {
	Kind string
	Down time.Duration
}

// Strategy returns e.Kind.
func (e ListenRestored) Strategy() string { return e.Kind }

// ServerWarning is sent by a Locker's New when the server works but
// weakens a guarantee, for example an asynchronous standby that a failover
// could promote without the last tokens and writes. Reason is a short key
// ("async_standby"), Detail what was found.
type ServerWarning struct {
	Kind   string
	Reason string
	Detail string
}

// Strategy returns e.Kind.
func (e ServerWarning) Strategy() string { return e.Kind }

// StaleWrite is sent when a fenced write was rejected with [ErrFenced].
type StaleWrite struct {
	Table     string
	Presented int64
	Current   int64
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
func (ServerWarning) event()  {}
func (StaleWrite) event()     {}

// Stats is a snapshot of a Locker: Held and Waiting now, counters since it
// was made. Listening is true while the LISTEN connection listens.
type Stats struct {
	Held            int
	Waiting         int
	Acquired        uint64
	NotAcquired     uint64
	Released        uint64
	Lost            uint64
	RenewalFailures uint64
	Listening       bool
	EventsDropped   uint64
}

// NoTokenWrite is sent when a write was rejected with [ErrNoToken].
type NoTokenWrite struct {
	Table   string
	Current int64
}

// Strategy returns StrategyFence.
func (NoTokenWrite) Strategy() string { return StrategyFence }

func (NoTokenWrite) event() {}
