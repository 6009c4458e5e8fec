package advisory

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence"
	"github.com/pgfence/pgfence/internal/hold"
	"github.com/pgfence/pgfence/internal/install"
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
	firstPause   time.Duration  // minPollInterval; tests may raise it
	notifyHeld   time.Duration  // notifyAfterHeld; tests may change it
	wg           sync.WaitGroup // watchdogs and the LISTEN loop

	mu            sync.Mutex
	closed        bool
	sessions      []*session // live or opening
	nextSessionID int
	keys          map[int64]*keyState

	// Wake-ups across sessions (wake.go).
	interests       map[int64]*interest
	listenStarted   bool
	listenDirty     bool               // interests changed since applied
	listenRetry     bool               // some interest lock was refused
	listenInterrupt context.CancelFunc // ends the LISTEN loop's wait
	listenIdleSince time.Time          // since when the LISTEN loop saw no interest
}

// keyState is the in-process state of one key: who holds (or is acquiring)
// it here. Advisory locks are re-entrant per session, so the server would
// grant a key twice to the same session; the Locker grants it in-process
// instead: at most one exclusive holder, or any number of shared holders
// that all go to the same session.
type keyState struct {
	exclusive bool
	refs      int           // holders plus acquisitions in flight
	s         *session      // the session holding it
	released  chan struct{} // closed when the last ref is dropped
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
	if err := install.Check(ctx, pool, schema, quoted); err != nil {
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
		sql:          newStatements(quoted),
		log:          c.Logger,
		connConfig:   cc,
		listenConfig: lc,
		closeCtx:     closeCtx,
		closeStop:    closeStop,
		firstPause:   minPollInterval,
		notifyHeld:   notifyAfterHeld,
		keys:         make(map[int64]*keyState),
		interests:    make(map[int64]*interest),
	}, nil
}

// Schema returns the schema whose sequence the Locker draws tokens from.
func (k *Locker) Schema() string { return k.cfg.Schema }

// statements is the Locker's SQL that names pgfence's schema.
type statements struct {
	tryLock, tryLockShared                                   string
	tryLockXact, tryLockXactShared, lockXact, lockXactShared string
}

// newStatements fills the quoted schema into the statement templates.
func newStatements(schema string) statements {
	f := func(tmpl string) string { return fmt.Sprintf(tmpl, schema) }
	return statements{
		tryLock:           f(tryLockSQL),
		tryLockShared:     f(tryLockSharedSQL),
		tryLockXact:       f(tryLockXactSQL),
		tryLockXactShared: f(tryLockXactSharedSQL),
		lockXact:          f(lockXactSQL),
		lockXactShared:    f(lockXactSharedSQL),
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
// Config.QueryTimeout). Calling it again does nothing.
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
	for _, s := range sessions {
		<-s.ready
		if s.openErr != nil {
			continue
		}
		s.sem <- struct{}{}
		k.failSession(s, fmt.Errorf("pgfence: advisory: Locker closed: %w", pgfence.ErrClosed))
		<-s.sem
	}
	k.wg.Wait()
}

// TryAcquire takes the session lock on [Name](name) and returns at once; it
// is [Locker.TryAcquireKey] for that key. The returned [pgfence.Lease] is a
// *[Lease].
func (k *Locker) TryAcquire(ctx context.Context, name string, opts *AcquireOpts) (pgfence.Lease, error) {
	l, err := k.TryAcquireKey(ctx, Name(name), opts)
	if err != nil {
		return nil, err
	}
	return l, nil
}

// TryAcquireKey takes the session lock on key if it is free, and returns at
// once.
//
// When another holder has it (another session, or another caller of this
// Locker), TryAcquireKey returns an error matching pgfence.ErrNotAcquired;
// when ctx descends from the held lock's own context (the caller holds it),
// one matching pgfence.ErrAlreadyHeld. After the Locker is closed it
// returns pgfence.ErrClosed.
//
// ctx bounds the wait for a session of the Locker (opening one, or for
// statements queued on it). The lock statement itself is bounded by
// Config.QueryTimeout only, because cancelling a statement closes the
// session with every lock on it; ctx's values still reach the pgx tracer.
// If ctx ends while the statement runs and the lock was granted, the lock
// is released and the error wraps ctx's cause: when it returns an error,
// the lock is not held.
//
// An error the server reports for the statement (such as SQLSTATE 53200,
// out of shared memory, when its lock table is full) is returned wrapped,
// and the session keeps its other locks. When the session itself fails
// during the statement (or its state cannot be told, as when a shared key
// it already holds fails again), every lock on that session is lost and
// it returns the failure.
func (k *Locker) TryAcquireKey(ctx context.Context, key Key, opts *AcquireOpts) (*Lease, error) {
	if err := k.prepare(ctx, key, opts); err != nil {
		return nil, err
	}
	if ctx.Err() != nil {
		return nil, fmt.Errorf("pgfence: advisory: acquire %v: %w", key, context.Cause(ctx))
	}
	l, _, err := k.tryAcquire(ctx, key, opts != nil && opts.Shared)
	if err != nil && ctx.Err() != nil {
		return nil, fmt.Errorf("pgfence: advisory: acquire %v: %w", key, context.Cause(ctx))
	}
	return l, err
}

// prepare validates an acquire of key.
func (k *Locker) prepare(ctx context.Context, key Key, opts *AcquireOpts) error {
	if err := key.validate(); err != nil {
		return err
	}
	if err := checkOpts(opts); err != nil {
		return err
	}
	if hold.Held(ctx, k, key.markName()) {
		return fmt.Errorf("pgfence: advisory: acquire %v: %w", key, pgfence.ErrAlreadyHeld)
	}
	return nil
}

// Acquire waits for the session lock on [Name](name); it is
// [Locker.AcquireKey] for that key. The returned [pgfence.Lease] is a
// *[Lease].
func (k *Locker) Acquire(ctx context.Context, name string, opts *AcquireOpts) (pgfence.Lease, error) {
	l, err := k.AcquireKey(ctx, Name(name), opts)
	if err != nil {
		return nil, err
	}
	return l, nil
}

// AcquireKey waits until it holds the session lock on key, until ctx ends
// (the error wraps ctx's cause), or until opts.WaitTimeout runs out (then
// the error matches pgfence.ErrNotAcquired and context.DeadlineExceeded).
// When ctx descends from the context of the lock it asks for (a nested
// [Locker.Do]) it returns at once with an error matching
// pgfence.ErrAlreadyHeld.
//
// It waits by retrying pg_try_advisory_lock on the Locker's sessions,
// pausing 5ms at first and doubling up to Config.MaxPollInterval, and at
// once when a holder in this Locker unlocks. Once its pause reaches 80ms it
// also registers on the Locker's LISTEN connection, so that an Unlock by
// another session wakes it with NOTIFY (see Waiting in the package
// documentation; Config.DisableListen turns this off). It never blocks a session in
// pg_advisory_lock, so cancelling a wait cannot close a session holding
// other locks. Waiters are not served in order, and a client blocked in
// pg_advisory_lock elsewhere may be granted the lock first.
//
// If ctx ends just as the lock is granted, AcquireKey releases it: when it
// returns an error, the lock is not held. Other errors are as for
// [Locker.TryAcquireKey].
func (k *Locker) AcquireKey(ctx context.Context, key Key, opts *AcquireOpts) (*Lease, error) {
	if err := k.prepare(ctx, key, opts); err != nil {
		return nil, err
	}
	var o AcquireOpts
	if opts != nil {
		o = *opts
	}
	ctx, cancel := hold.WaitTimeout(ctx, o.WaitTimeout)
	defer cancel()
	waitErr := func(err error) error {
		if ctx.Err() != nil {
			return fmt.Errorf("pgfence: advisory: acquire %v: %w", key, context.Cause(ctx))
		}
		return err
	}
	pause := k.firstPause
	var reg *waitReg            // interest registered for wake-ups (wake.go)
	var armedSeen chan struct{} // the armed channel already acted on
	defer func() {
		if reg != nil {
			k.unregister(reg)
		}
	}()
	for {
		if err := ctx.Err(); err != nil {
			return nil, waitErr(err)
		}
		// Take the wake channel before the attempt, so that a
		// notification arriving after the attempt is not missed.
		var armed, wake chan struct{}
		if reg != nil {
			armed, wake = k.channels(reg)
		}
		l, released, err := k.tryAcquire(ctx, key, o.Shared)
		if err == nil {
			return l, nil
		}
		if !errors.Is(err, pgfence.ErrNotAcquired) {
			return nil, waitErr(err)
		}
		if reg == nil && released == nil && pause >= interestAfter {
			// Held by another session for a while: ask to be woken.
			// Until the interest lock is held (armed), an Unlock would
			// not notify; armed closing makes the next attempt at once.
			if reg = k.register(key.id); reg != nil {
				armed, wake = k.channels(reg)
			}
		}
		if armed == armedSeen {
			armed = nil
		}
		// Full jitter over [pause/2, pause) spreads competing pollers.
		t := time.NewTimer(pause/2 + rand.N(pause/2+1))
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, waitErr(ctx.Err())
		case <-k.closeCtx.Done():
			t.Stop()
			return nil, pgfence.ErrClosed
		case <-released: // nil (blocks) unless held in this Locker
			t.Stop()
		case <-armed: // nil unless waiting for the interest lock
			t.Stop()
			armedSeen = armed
		case <-wake: // nil unless registered
			t.Stop()
		case <-t.C:
		}
		pause = min(2*pause, k.cfg.MaxPollInterval)
	}
}

// Do waits for the lock on [Name](name) as [Locker.Acquire] does, calls fn
// while holding it, then releases it; it is [Locker.DoKey] for that key.
func (k *Locker) Do(ctx context.Context, name string, opts *AcquireOpts, fn func(ctx context.Context, l pgfence.Lease) error) error {
	return k.DoKey(ctx, Name(name), opts, fn)
}

// DoKey waits for the lock on key as [Locker.AcquireKey] does, calls fn
// while holding it, then releases it. fn's context is derived from ctx and
// is also cancelled, with a cause matching pgfence.ErrLeaseLost, when the
// lock is lost: fn must stop then. fn may release the lock itself. A Do
// nested in fn for the same key returns pgfence.ErrAlreadyHeld at once.
//
// DoKey returns the acquire error if the lock was not acquired (fn is not
// called). Otherwise it returns fn's error, joined with the loss (an error
// matching pgfence.ErrLeaseLost) whenever the lock was lost before fn
// returned, and with the release's error.
func (k *Locker) DoKey(ctx context.Context, key Key, opts *AcquireOpts, fn func(ctx context.Context, l pgfence.Lease) error) error {
	return hold.Do(ctx, k, key.markName(), "pgfence: advisory", func(ctx context.Context) (pgfence.Lease, error) {
		l, err := k.AcquireKey(ctx, key, opts)
		if err != nil {
			return nil, err
		}
		return l, nil
	}, fn)
}

// heldHereError is the refusal of a key held in this Locker in a
// conflicting mode. It matches pgfence.ErrNotAcquired. Callers may retry
// such a key in a tight loop, and this refusal costs no round trip, so it is
// built without formatting: the message is rendered only when asked for.
type heldHereError struct{ key Key }

func (e *heldHereError) Error() string {
	return "pgfence: advisory: lock " + e.key.String() + " is held in this Locker: " + pgfence.ErrNotAcquired.Error()
}

func (e *heldHereError) Unwrap() error { return pgfence.ErrNotAcquired }

// tryAcquire makes one attempt at key. When the key is held in this Locker
// in a conflicting mode, it returns ErrNotAcquired and a channel closed when
// that changes.
func (k *Locker) tryAcquire(ctx context.Context, key Key, shared bool) (*Lease, <-chan struct{}, error) {
	id := key.id
	k.mu.Lock()
	if k.closed {
		k.mu.Unlock()
		return nil, nil, pgfence.ErrClosed
	}
	ks := k.keys[id]
	var s *session
	open := false
	if ks != nil {
		if !shared || ks.exclusive {
			ch := ks.released
			k.mu.Unlock()
			return nil, ch, &heldHereError{key: key}
		}
		ks.refs++
		s = ks.s
	} else {
		s, open = k.pickSessionLocked()
		ks = &keyState{exclusive: !shared, refs: 1, s: s, released: make(chan struct{})}
		k.keys[id] = ks
	}
	s.inflight++
	k.mu.Unlock()

	// abandon drops the reservation taken above.
	abandon := func() {
		k.mu.Lock()
		s.inflight--
		k.dropKeyRefLocked(id)
		k.mu.Unlock()
	}
	if open {
		k.openSession(s)
	}
	select {
	case <-s.ready:
	case <-ctx.Done():
		abandon()
		return nil, nil, ctx.Err()
	}
	if s.openErr != nil {
		abandon()
		return nil, nil, s.openErr
	}
	select {
	case s.sem <- struct{}{}:
	case <-ctx.Done():
		abandon()
		return nil, nil, ctx.Err()
	}
	l, err := k.lockOnSession(ctx, s, key, shared)
	<-s.sem
	if err != nil {
		abandon()
		return nil, nil, err
	}
	if ctx.Err() != nil {
		// Granted as ctx ended: the caller will not use it.
		_ = l.Release(ctx)
		return nil, nil, ctx.Err()
	}
	return l, nil, nil
}

// lockOnSession runs the lock statement on s, holding s.sem. On success the
// reservation becomes the Lock's.
func (k *Locker) lockOnSession(ctx context.Context, s *session, key Key, shared bool) (*Lease, error) {
	k.mu.Lock()
	dead, closed := s.dead, k.closed
	k.mu.Unlock()
	if closed {
		return nil, pgfence.ErrClosed
	}
	if dead {
		return nil, fmt.Errorf("pgfence: advisory: lock %v: the session failed", key)
	}
	q := k.sql.tryLock
	if shared {
		q = k.sql.tryLockShared
	}
	var token *int64
	err := s.queryKey(ctx, k, q, key.id, &token)
	if err != nil {
		// Session locks survive the rollback of the statement that took
		// them, so a failed statement may have left the lock granted.
		// When the server reported an error on a live connection (say,
		// "out of shared memory" from a full lock table), undo a possible
		// grant and keep the session.
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && !s.conn.IsClosed() && k.undoFailedLock(ctx, s, key, shared) == nil {
			return nil, fmt.Errorf("pgfence: advisory: lock %v: %w", key, err)
		}
		// Otherwise the session's state is unknown: drop it with its
		// locks, and the server releases them.
		k.failSession(s, err)
		return nil, fmt.Errorf("pgfence: advisory: lock %v: session failed, its locks are lost: %w", key, err)
	}
	if token == nil {
		return nil, fmt.Errorf("pgfence: advisory: lock %v: %w", key, pgfence.ErrNotAcquired)
	}
	l := &Lease{k: k, s: s, key: key, shared: shared, token: *token, acquired: time.Now()}
	l.ctx, l.cancel = context.WithCancelCause(hold.Mark(context.Background(), k, key.markName(), l))
	k.mu.Lock()
	s.inflight--
	s.locks[l] = struct{}{}
	k.mu.Unlock()
	return l, nil
}

// errAmbiguousUndo is returned by undoFailedLock when it cannot tell.
var errAmbiguousUndo = errors.New("pgfence: advisory: the session already holds the key")

// undoFailedLock releases key on s if the failed lock statement left it
// granted. That is only decidable when s holds no other hold of key (an
// unlock then succeeds exactly when the failed statement's grant stuck);
// otherwise, or when the unlock fails, it returns an error and the caller
// must drop the session. The caller holds s.sem.
func (k *Locker) undoFailedLock(ctx context.Context, s *session, key Key, shared bool) error {
	k.mu.Lock()
	for l := range s.locks {
		if l.key.id == key.id {
			k.mu.Unlock()
			return errAmbiguousUndo
		}
	}
	k.mu.Unlock()
	q := unlockSQL
	if shared {
		q = unlockSharedSQL
	}
	var released bool
	return s.queryKey(ctx, k, q, key.id, &released)
}

// dropKeyRefLocked drops one reference to key id, forgetting the key and
// waking waiters when it was the last. The caller holds l.mu.
func (k *Locker) dropKeyRefLocked(id int64) {
	ks := k.keys[id]
	if ks == nil {
		return
	}
	ks.refs--
	if ks.refs == 0 {
		delete(k.keys, id)
		close(ks.released)
	}
}
