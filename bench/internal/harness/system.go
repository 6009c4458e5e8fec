// Package harness defines what the benchmark measures and how: the small
// System interface every lock implementation is adapted to (peers, raw-SQL
// ceilings and pgfence itself), the Writer interface for
// fenced-write scenarios, and the time-bounded loops that drive them.
//
// # Adding a system
//
// Write an adapter that implements [System] (and [Waiter] when it can wait
// for a lock, [Preparer], [Resetter] and [Storage] when its state lives in
// PostgreSQL tables), and register a [Spec] for it in the runner. Every
// scenario then measures it side by side with the others.
package harness

import (
	"context"
	"errors"
	"time"
)

// ErrBusy is returned by TryAcquire when the lock is held by another owner.
// Adapters translate their library's "not acquired" error to it.
var ErrBusy = errors.New("bench: lock is held by another owner")

// Release releases a lock that was acquired. It is called exactly once.
type Release func(ctx context.Context) error

// System is a lock implementation under test, opened for a given number of
// concurrent clients. All methods are safe for concurrent use.
type System interface {
	// TryAcquire takes the named lock if it is free and returns at once;
	// it returns ErrBusy when the lock is held.
	TryAcquire(ctx context.Context, name string) (Release, error)
	// Close releases every resource the system opened (connections,
	// sessions). It does not stop servers.
	Close() error
}

// Waiter is implemented by systems that can wait for a lock.
type Waiter interface {
	// Acquire waits until it holds the named lock or ctx ends.
	Acquire(ctx context.Context, name string) (Release, error)
}

// Preparer is implemented by systems that need lock names to exist before
// they are used (for example raw UPDATE ceilings that need their row).
type Preparer interface {
	Prepare(ctx context.Context, names []string) error
}

// Resetter is implemented by systems whose state persists between
// scenarios; Reset removes it so each scenario starts from empty tables.
type Resetter interface {
	Reset(ctx context.Context) error
}

// Storage is implemented by systems that keep their locks in PostgreSQL
// tables, for the scale scenario.
type Storage interface {
	// Tables names the tables that hold the locks, first the main one, as
	// SQL names (schema-qualified when not on the search path).
	Tables() []string
	// FillLive makes the table hold at least n live (held, unexpired)
	// locks on names that the benchmark never acquires.
	FillLive(ctx context.Context, n int) error
}

// Kind says what role a system plays in the comparison.
type Kind string

// The kinds of systems.
const (
	Ceiling Kind = "ceiling" // raw statements: what any design with this many round trips can reach
	Peer    Kind = "peer"    // another lock library
	Pgfence Kind = "pgfence" // this project
)

// Env tells systems where the servers are.
type Env struct {
	// DatabaseURL is a migrated, disposable PostgreSQL database, as the
	// role that owns pgfence's install (and the benchmark's own tables).
	DatabaseURL string
	// AppDatabaseURL is the same database as the application role
	// pgfence's lockers connect as, which holds only the privileges of
	// migrations.Grant; empty means DatabaseURL (the owner).
	AppDatabaseURL string
	RedisAddr      string   // host:port of a Redis server
	EtcdEndpoints  []string // etcd client URLs
	// WriteDelay, when positive, is slept before every write to
	// PostgreSQL on the connections of the pools systems open (and so on
	// the sessions of pgfence's Lockers, which copy their pool's
	// connection settings): a statement waits for it once, as for a
	// network round trip, while the client and the server stay on this
	// machine. Go's timers round short sleeps up (to about 1 ms on some
	// machines), so the delay to report is the one measured.
	WriteDelay time.Duration
}

// AppURL returns the URL pgfence's lockers connect with: AppDatabaseURL,
// or DatabaseURL when no application role is set.
func (e *Env) AppURL() string {
	if e.AppDatabaseURL != "" {
		return e.AppDatabaseURL
	}
	return e.DatabaseURL
}

// Spec describes a system and how to open it.
type Spec struct {
	Name string
	Kind Kind
	// Note describes the parameters that matter for reading the figures
	// (round trips per cycle, lease and retry settings).
	Note string
	// OptIn systems run only when named in -systems (probes that answer
	// one question, such as the security-cost probes).
	OptIn bool
	// Open connects for clients concurrent clients (plus waiters, for the
	// hand-over scenario).
	Open func(ctx context.Context, env *Env, clients int) (System, error)
}

// Writer performs one protected write per call, for the fenced-write
// scenario. Each worker writes its own row.
type Writer interface {
	Write(ctx context.Context, worker int) error
	Close() error
}

// WriterSpec describes a write path and how to open it.
type WriterSpec struct {
	Name string
	Kind Kind
	Note string
	Open func(ctx context.Context, env *Env, clients int) (Writer, error)
}

// Explainer is implemented by writers that can show the server's plan of
// their write: EXPLAIN (ANALYZE, BUFFERS, WAL) of one write by worker, run
// in a transaction that is rolled back.
type Explainer interface {
	Explain(ctx context.Context, worker int) (string, error)
}
