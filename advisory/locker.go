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
	cfg        Config
	sql        statements // the SQL that names the schema
	log        *slog.Logger
	connConfig *pgx.ConnConfig // lock sessions
	// listenConfig is the LISTEN connection's: connConfig with
	// application_name suffixed "-listen".
	listenConfig *pgx.ConnConfig
	closeCtx     context.Context // cancelled by Close
	closeStop    context.CancelFunc
	firstPause   time.Duration   // minPollInterval; tests may raise it
	notifyHeld   time.Duration   // 0: every Unlock looks for waiters; tests may raise it
	peek         time.Duration   // sessionPeekInterval; tests may turn it off (0)
	fill         int             // sessionFill; tests may change it
	wg           sync.WaitGroup  // watchdogs and the LISTEN loop
	ev           *events.Emitter // nil without Config.Observer
	// backoff spaces the retries of transient errors; noRetry (a test
	// hook) turns them off.
	backoff retry.Backoff
	noRetry bool
	// afterGrant, a test hook, runs between a grant and its hand-out.
	afterGrant func(*Lease)
	// onRound, a test hook, runs each time a waiting Acquire goes round
	// its loop again (woken, or at the end of a pause).
	onRound func()
	// onRefused, a test hook, runs when the server refused an attempt of
	// an acquire (the key is held by another session).
	onRefused func()
	// onBatch, a test hook, runs as a session's turn answers the lock
	// requests and unlocks queued on it (batch.go).
	onBatch func(locks, unlocks int)
	// afterUnlocks, a test hook, runs in a session's turn once its unlocks
	// are answered, before the lock requests are taken; noRecollect, a
	// test hook, leaves the lock requests queued meanwhile to the next
	// turn (batch.go).
	afterUnlocks func()
	noRecollect  bool
	// maxLockBatch is the most lock requests one statement carries
	// (maxLockBatch, the const; tests may lower it); onLockStatement, a
	// test hook, runs with the number of requests of each lock statement
	// a turn runs (batch.go).
	maxLockBatch    int
	onLockStatement func(requests int)
	// noPark, a test hook, keeps waiting Acquire calls from parking on a
	// session (park.go): they poll and listen instead.
	noPark bool
	// closeNoWait, a test hook, has Close return without waiting for its
	// sessions to be closed and their locks released.
	closeNoWait bool
	// wakeGap is the least time between two attempts of a waiting
	// Acquire woken by notifications (minWakeGap; tests may turn it off);
	// onWake, a test hook, runs at each such wake-up with the time left
	// to wait.
	wakeGap time.Duration
	onWake  func(wait time.Duration)

	// Counters of Stats.
	waiting                               atomic.Int64
	acquired, notAcquired, released, lost atomic.Uint64

	mu            sync.Mutex
	closed        bool
	sessions      []*session // live or opening
	nextSessionID int
	keys          map[int64]*keyState
	// Waiting Acquire calls, by key, and the registrations for wake-ups
	// of their lines (acquire.go).
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
// settings (pool.Config().ConnConfig, with the application_name and TCP
// settings of cfg), tracer included. The sessions are the Locker's own
// connections: they do not count against the pool, and the pool's
// BeforeConnect, AfterConnect and other pool hooks do not run for them.
// The pool is used for nothing else, and is never closed by the Locker.
//
// A nil cfg means the defaults. New returns an error for a nil pool or an
// invalid cfg, without a round trip. Otherwise it checks once, through the
// pool and bounded by ctx, that pgfence's schema ([Config].Schema) is
// installed at the version this code needs and that its token sequence is
// sound, and returns an error matching [pgfence.ErrNotInstalled] that says
// how to fix it when not. It opens no lock session; the first lock does.
// ctx has no effect on the Locker after New returns.
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
	inst, err := install.Check(ctx, pool, schema, quoted)
	if err != nil {
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
	return &Locker{
		cfg:          c,
		sql:          newStatements(quoted, inst.TokenBatch),
		log:          c.Logger,
		connConfig:   cc,
		listenConfig: lc,
		closeCtx:     closeCtx,
		closeStop:    closeStop,
		firstPause:   minPollInterval,
		wakeGap:      minWakeGap,
		peek:         sessionPeekInterval,
		fill:         sessionFill,
		maxLockBatch: maxLockBatch,
		ev:           events.New(c.Observer),
		backoff:      retry.Default,
		keys:         make(map[int64]*keyState),
		lines:        waitline.New[int64](false),
		lineRegs:     make(map[*waitline.Line]*waitReg),
		interests:    make(map[int64]*interest),
	}, nil
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
// tokenBatch chooses the combined lock statement that draws its tokens with
// one pgfence_next_tokens call (tryLockTokensSQL, migration 000009) over
// the one that calls pgfence_next_token per lock granted (tryLockBatchSQL).
func newStatements(schema string, tokenBatch bool) statements {
	f := func(tmpl string) string { return fmt.Sprintf(tmpl, schema) }
	batch := tryLockBatchSQL
	if tokenBatch {
		batch = tryLockTokensSQL
	}
	return statements{
		tryLock:           f(tryLockSQL),
		tryLockShared:     f(tryLockSharedSQL),
		tryLockBatch:      f(batch),
		tryLockXact:       f(tryLockXactSQL),
		tryLockXactShared: f(tryLockXactSharedSQL),
		lockXact:          f(lockXactSQL),
		lockXactShared:    f(lockXactSharedSQL),
		parkLock:          f(parkLockSQL),
	}
}

// Close releases every lock of the Locker, closes its sessions, stops its
// goroutines and makes its methods return pgfence.ErrClosed.
//
// Locks still held end as lost: their Err matches pgfence.ErrLeaseLost and
// pgfence.ErrClosed. Their holders are told first, then the locks are
// released (pg_advisory_unlock_all), so they are free for others when Close
// returns; on a session that had failed, the server frees them when it
// notices the connection end. Waiting Lock calls return pgfence.ErrClosed.
// Close waits for statements in progress (each bounded by
// Config.QueryTimeout); the sessions are closed concurrently, so during an
// outage Close takes at most about two QueryTimeouts, whatever MaxSessions.
// Calling it again does nothing.
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
	if k.closeNoWait {
		go k.closeSessions(sessions)
		return
	}
	k.closeSessions(sessions)
}

// closeSessions is Close once k is marked closed: it closes sessions, then
// waits for the Locker's goroutines.
func (k *Locker) closeSessions(sessions []*session) {
	// The sessions are closed at once, not one after the other: during an
	// outage each may take QueryTimeout.
	var closing sync.WaitGroup
	for _, s := range sessions {
		closing.Add(1)
		go func() {
			defer closing.Done()
			<-s.ready
			if s.openErr != nil {
				return
			}
			s.sem <- struct{}{}
			k.failSession(context.Background(), s, fmt.Errorf("pgfence: advisory: Locker closed: %w", pgfence.ErrClosed), nil)
			<-s.sem
		}()
	}
	closing.Wait()
	k.wg.Wait()
	k.ev.Close()
}

// Stats returns a snapshot of the Locker's state and counters. Held counts
// the session locks held now (transaction locks are not counted: they
// belong to the caller's transaction), Waiting the Acquire and Do calls
// in progress (waiting for the lock, or riding out an outage). Every lock handed out ends counted once, in Released (by
// its holder, including a release that failed) or in Lost (its session
// died, its MaxHold passed, or the Locker closed). RenewalFailures is always zero: a failed
// check of a session loses its locks at once (they count in Lost), as
// there is no TTL to ride out. It is safe to call at any time, after
// Close too.
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
