package advisory

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence"
	"github.com/pgfence/pgfence/internal/engine"
	"github.com/pgfence/pgfence/internal/events"
	"github.com/pgfence/pgfence/internal/install"
	"github.com/pgfence/pgfence/internal/notifier"
	"github.com/pgfence/pgfence/internal/retry"
	"github.com/pgfence/pgfence/internal/waitline"
)

// Locker takes session-level advisory locks on a few database sessions it
// owns. Create one with [New] and call [Locker.Close] when done. Its
// methods are safe for concurrent use.
type Locker struct {
	cfg          Config
	sql          statements
	log          *slog.Logger
	connConfig   *pgx.ConnConfig // lock sessions
	listenConfig *pgx.ConnConfig // the LISTEN connection
	closeCtx     context.Context // cancelled by Close
	closeStop    context.CancelFunc
	wg           sync.WaitGroup  // watchdogs, dials and the LISTEN loop
	ev           *events.Emitter // nil without Config.Observer
	backoff      retry.Backoff
	hooks        *testHooks // nil outside tests

	// Counters of Stats.
	waiting                               atomic.Int64
	acquired, notAcquired, released, lost atomic.Uint64

	mu            sync.Mutex
	closed        bool
	sessions      []*session // live or opening, oldest first
	nextSessionID int
	keys          map[int64]*keyState

	// Lines of waiting calls by key, and their wake-up registrations.
	lines    *waitline.Lines[int64]
	lineRegs map[*waitline.Line]*waitReg

	// Wake-ups across sessions (wake.go).
	interests       map[int64]*interest
	listener        *notifier.Notifier // nil while no LISTEN connection is wanted
	listenIdleSince time.Time          // since when the LISTEN loop saw no interest
	listening       bool               // a LISTEN connection is listening now
	listenLostAt    time.Time          // when it stopped listening; zero unless lost
}

// New returns a Locker whose sessions are dialed with pool's connection
// settings (with cfg's application_name and TCP settings, tracer included).
// The sessions are the Locker's own connections, outside the pool: pool
// hooks do not run for them, and the pool is never closed by the Locker.
//
// A nil cfg means the defaults. New checks once, through the pool and
// bounded by ctx, that pgfence's schema is installed at the version this
// code needs; when not, the error matches [pgfence.ErrNotInstalled] and says
// how to fix it. It refuses a standby, YugabyteDB or CockroachDB with an
// error matching [pgfence.ErrUnsafeServer], and reports asynchronous
// standbys by a Warn and a [pgfence.ServerWarning]. It opens no lock session.
func New(ctx context.Context, pool *pgxpool.Pool, cfg *Config) (*Locker, error) {
	if pool == nil {
		return nil, errors.New("pgfence: advisory: New: nil pool")
	}
	c, err := cfg.resolve()
	if err != nil {
		return nil, err
	}
	schema, quoted, err := install.Schema("pgfence: advisory: Config.Schema", c.Schema)
	if err != nil {
		return nil, err
	}
	c.Schema = schema
	warnings, err := engine.Gate(ctx, pool)
	if err != nil {
		return nil, fmt.Errorf("pgfence: advisory: %w", err)
	}
	if _, err := install.Check(ctx, pool, schema, quoted); err != nil {
		return nil, fmt.Errorf("pgfence: advisory: %w", err)
	}
	cc := pool.Config().ConnConfig.Copy()
	if cc.RuntimeParams == nil {
		cc.RuntimeParams = map[string]string{}
	}
	cc.RuntimeParams["application_name"] = c.ApplicationName
	lc := cc.Copy()
	lc.RuntimeParams["application_name"] = c.ApplicationName + "-listen"
	closeCtx, closeStop := context.WithCancel(context.Background())
	k := &Locker{
		cfg:          c,
		sql:          newStatements(quoted),
		log:          c.Logger,
		connConfig:   cc,
		listenConfig: lc,
		closeCtx:     closeCtx,
		closeStop:    closeStop,
		ev:           events.New(c.Observer),
		backoff:      retry.Default,
		keys:         make(map[int64]*keyState),
		lines:        waitline.New[int64](false),
		lineRegs:     make(map[*waitline.Line]*waitReg),
		interests:    make(map[int64]*interest),
	}
	for _, w := range warnings {
		k.log.WarnContext(ctx, "pgfence: advisory: "+w.Detail, "reason", w.Reason)
		k.ev.Async(ctx, pgfence.ServerWarning{Kind: pgfence.StrategyAdvisory, Reason: w.Reason, Detail: w.Detail})
	}
	return k, nil
}

// Schema returns the schema whose sequence the Locker draws tokens from.
func (k *Locker) Schema() string { return k.cfg.Schema }

// statements is the Locker's SQL that names pgfence's schema.
type statements struct {
	tryLock, tryLockShared, tryLockBatch                     string
	tryLockXact, tryLockXactShared, lockXact, lockXactShared string
	parkLock                                                 string
}

// newStatements fills the quoted schema into the statement templates.
func newStatements(schema string) statements {
	f := func(tmpl string) string { return fmt.Sprintf(tmpl, schema) }
	return statements{
		tryLock:           f(tryLockSQL),
		tryLockShared:     f(tryLockSharedSQL),
		tryLockBatch:      f(tryLockBatchSQL),
		tryLockXact:       f(tryLockXactSQL),
		tryLockXactShared: f(tryLockXactSharedSQL),
		lockXact:          f(lockXactSQL),
		lockXactShared:    f(lockXactSharedSQL),
		parkLock:          f(parkLockSQL),
	}
}

// Close releases every lock of the Locker (pg_advisory_unlock_all), closes
// its sessions, stops its goroutines and makes its methods return
// pgfence.ErrClosed. Calling it again does nothing.
//
// Locks still held end as lost, their holders told before the release: their
// Err matches pgfence.ErrLeaseLost and pgfence.ErrClosed. Waiting Acquire
// calls return pgfence.ErrClosed. Close waits for the statements in progress,
// each bounded by Config.QueryTimeout; sessions are closed concurrently.
func (k *Locker) Close() {
	k.mu.Lock()
	if k.closed {
		k.mu.Unlock()
		return
	}
	k.closed = true
	k.closeStop()
	sessions := append([]*session(nil), k.sessions...)
	k.mu.Unlock()
	if k.hooks != nil && k.hooks.closeNoWait {
		go k.closeSessions(sessions)
		return
	}
	k.closeSessions(sessions)
}

// closeSessions closes sessions all at once (during an outage each may take
// QueryTimeout), then waits for the Locker's goroutines.
func (k *Locker) closeSessions(sessions []*session) {
	var closing sync.WaitGroup
	for _, s := range sessions {
		closing.Go(func() {
			<-s.opened
			if s.openErr != nil {
				return
			}
			s.sem <- struct{}{}
			s.fail(context.Background(), fmt.Errorf("pgfence: advisory: Locker closed: %w", pgfence.ErrClosed))
			<-s.sem
		})
	}
	closing.Wait()
	k.wg.Wait()
	k.ev.Close()
}

// Stats returns a snapshot of the Locker's state and counters; it is safe
// to call at any time, after Close too. Held counts session locks (not
// transaction locks), Waiting the Acquire and Do calls in progress. Every
// lock handed out ends counted once, in Released or in Lost.
// RenewalFailures is always zero: a failed session check loses its locks.
func (k *Locker) Stats() pgfence.Stats {
	k.mu.Lock()
	held := 0
	for _, s := range k.sessions {
		held += len(s.locks)
	}
	listening := k.listening
	k.mu.Unlock()
	return pgfence.Stats{
		Held:          held,
		Waiting:       int(k.waiting.Load()),
		Acquired:      k.acquired.Load(),
		NotAcquired:   k.notAcquired.Load(),
		Released:      k.released.Load(),
		Lost:          k.lost.Load(),
		Listening:     listening,
		EventsDropped: k.ev.Dropped(),
	}
}
