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
)

// Locker takes session-level advisory locks on a few database sessions it
// owns. Create one with [New] and call [Locker.Close] when done. Its
// methods are safe for concurrent use.
type Locker struct {
	cfg        Config
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
// BeforeConnect, AfterConnect and other pool hooks do not run for them. pool is not used otherwise, and is
// never closed by the Locker.
//
// A nil cfg means the defaults. New opens no connection; the first lock
// does. It returns an error for a nil pool or an invalid cfg.
func New(pool *pgxpool.Pool, cfg *Config) (*Locker, error) {
	if pool == nil {
		return nil, errors.New("advisory: New: nil pool")
	}
	c, err := cfg.resolve()
	if err != nil {
		return nil, err
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
func (l *Locker) Close() {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return
	}
	l.closed = true
	l.closeStop()
	sessions := append([]*session(nil), l.sessions...)
	l.mu.Unlock()
	for _, s := range sessions {
		<-s.ready
		if s.openErr != nil {
			continue
		}
		s.sem <- struct{}{}
		l.failSession(s, fmt.Errorf("advisory: Locker closed: %w", pgfence.ErrClosed))
		<-s.sem
	}
	l.wg.Wait()
}

// TryLock takes the session lock on key if it is free, and returns at once.
//
// When another holder has it (another session, or another caller of this
// Locker), TryLock returns an error matching pgfence.ErrNotAcquired. After
// the Locker is closed it returns pgfence.ErrClosed.
//
// ctx bounds the wait for a session of the Locker (opening one, or for
// statements queued on it). The lock statement itself is bounded by
// Config.QueryTimeout only, because cancelling a statement closes the
// session with every lock on it; ctx's values still reach the pgx tracer.
// If ctx ends while the statement runs and the lock was granted, TryLock
// releases it and returns ctx.Err(): when it returns an error, the lock is
// not held.
//
// An error the server reports for the statement (such as SQLSTATE 53200,
// out of shared memory, when its lock table is full) is returned wrapped,
// and the session keeps its other locks. When the session itself fails
// during the statement (or its state cannot be told, as when a shared key
// it already holds fails again), every lock on that session is lost and
// TryLock returns the failure.
func (l *Locker) TryLock(ctx context.Context, key Key, opts *LockOpts) (*Lock, error) {
	if err := key.validate(); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	lk, _, err := l.tryAcquire(ctx, key, opts != nil && opts.Shared)
	return lk, err
}

// errWaitTimeout is the cause of a Lock's context when opts.WaitTimeout ran
// out.
var errWaitTimeout = errors.New("advisory: wait timeout")

// Lock waits until it holds the session lock on key, until ctx ends, or
// until opts.WaitTimeout runs out (then the error matches
// pgfence.ErrNotAcquired).
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
// If ctx ends just as the lock is granted, Lock releases it and returns
// ctx.Err(): when Lock returns an error, the lock is not held. Other errors
// are as for [Locker.TryLock].
func (l *Locker) Lock(ctx context.Context, key Key, opts *LockOpts) (*Lock, error) {
	if err := key.validate(); err != nil {
		return nil, err
	}
	var o LockOpts
	if opts != nil {
		o = *opts
	}
	if o.WaitTimeout < 0 {
		return nil, fmt.Errorf("advisory: LockOpts.WaitTimeout is negative (%v)", o.WaitTimeout)
	}
	parent := ctx
	if o.WaitTimeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeoutCause(ctx, o.WaitTimeout, errWaitTimeout)
		defer cancel()
	}
	waitErr := func(err error) error {
		if parent.Err() == nil && errors.Is(context.Cause(ctx), errWaitTimeout) {
			return fmt.Errorf("advisory: lock %v not acquired within %v: %w", key, o.WaitTimeout, pgfence.ErrNotAcquired)
		}
		return err
	}
	pause := l.firstPause
	var reg *waitReg            // interest registered for wake-ups (wake.go)
	var armedSeen chan struct{} // the armed channel already acted on
	defer func() {
		if reg != nil {
			l.unregister(reg)
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
			armed, wake = l.channels(reg)
		}
		lk, released, err := l.tryAcquire(ctx, key, o.Shared)
		if err == nil {
			return lk, nil
		}
		if !errors.Is(err, pgfence.ErrNotAcquired) {
			return nil, waitErr(err)
		}
		if reg == nil && released == nil && pause >= interestAfter {
			// Held by another session for a while: ask to be woken.
			// Until the interest lock is held (armed), an Unlock would
			// not notify; armed closing makes the next attempt at once.
			if reg = l.register(key.id); reg != nil {
				armed, wake = l.channels(reg)
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
		case <-l.closeCtx.Done():
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
		pause = min(2*pause, l.cfg.MaxPollInterval)
	}
}

// Do waits for the lock on key as [Locker.Lock] does, calls fn while holding
// it, then unlocks it. fn's context is derived from ctx and is also
// cancelled, with a cause matching pgfence.ErrLeaseLost, when the lock is
// lost: fn must stop then.
//
// Do returns Lock's error if the lock was not acquired (fn is not called).
// Otherwise it returns fn's error, joined with the loss (an error matching
// pgfence.ErrLeaseLost and pgfence.ErrNotHeld) if the lock was lost before
// fn returned, or with Unlock's error.
func (l *Locker) Do(ctx context.Context, key Key, opts *LockOpts, fn func(ctx context.Context, lk *Lock) error) error {
	if fn == nil {
		return errors.New("advisory: Do: nil fn")
	}
	lk, err := l.Lock(ctx, key, opts)
	if err != nil {
		return err
	}
	fctx, cancel := context.WithCancelCause(ctx)
	stop := context.AfterFunc(lk.Context(), func() { cancel(context.Cause(lk.Context())) })
	ferr := fn(fctx, lk)
	stop()
	cancel(nil)
	return errors.Join(ferr, lk.Unlock(ctx))
}

// heldHereError is the refusal of a key held in this Locker in a
// conflicting mode. It matches pgfence.ErrNotAcquired. Callers may retry
// such a key in a tight loop, and this refusal costs no round trip, so it is
// built without formatting: the message is rendered only when asked for.
type heldHereError struct{ key Key }

func (e *heldHereError) Error() string {
	return "advisory: lock " + e.key.String() + " is held in this Locker: " + pgfence.ErrNotAcquired.Error()
}

func (e *heldHereError) Unwrap() error { return pgfence.ErrNotAcquired }

// tryAcquire makes one attempt at key. When the key is held in this Locker
// in a conflicting mode, it returns ErrNotAcquired and a channel closed when
// that changes.
func (l *Locker) tryAcquire(ctx context.Context, key Key, shared bool) (*Lock, <-chan struct{}, error) {
	id := key.id
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return nil, nil, pgfence.ErrClosed
	}
	ks := l.keys[id]
	var s *session
	open := false
	if ks != nil {
		if !shared || ks.exclusive {
			ch := ks.released
			l.mu.Unlock()
			return nil, ch, &heldHereError{key: key}
		}
		ks.refs++
		s = ks.s
	} else {
		s, open = l.pickSessionLocked()
		ks = &keyState{exclusive: !shared, refs: 1, s: s, released: make(chan struct{})}
		l.keys[id] = ks
	}
	s.inflight++
	l.mu.Unlock()

	// abandon drops the reservation taken above.
	abandon := func() {
		l.mu.Lock()
		s.inflight--
		l.dropKeyRefLocked(id)
		l.mu.Unlock()
	}
	if open {
		l.openSession(s)
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
	lk, err := l.lockOnSession(ctx, s, key, shared)
	<-s.sem
	if err != nil {
		abandon()
		return nil, nil, err
	}
	if ctx.Err() != nil {
		// Granted as ctx ended: the caller will not use it.
		_ = lk.Unlock(ctx)
		return nil, nil, ctx.Err()
	}
	return lk, nil, nil
}

// lockOnSession runs the lock statement on s, holding s.sem. On success the
// reservation becomes the Lock's.
func (l *Locker) lockOnSession(ctx context.Context, s *session, key Key, shared bool) (*Lock, error) {
	l.mu.Lock()
	dead, closed := s.dead, l.closed
	l.mu.Unlock()
	if closed {
		return nil, pgfence.ErrClosed
	}
	if dead {
		return nil, fmt.Errorf("advisory: lock %v: the session failed", key)
	}
	q := tryLockSQL
	if shared {
		q = tryLockSharedSQL
	}
	var token *int64
	err := s.queryKey(ctx, l, q, key.id, &token)
	if err != nil {
		// Session locks survive the rollback of the statement that took
		// them, so a failed statement may have left the lock granted.
		// When the server reported an error on a live connection (say,
		// "out of shared memory" from a full lock table), undo a possible
		// grant and keep the session.
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && !s.conn.IsClosed() && l.undoFailedLock(ctx, s, key, shared) == nil {
			return nil, fmt.Errorf("advisory: lock %v: %w", key, err)
		}
		// Otherwise the session's state is unknown: drop it with its
		// locks, and the server releases them.
		l.failSession(s, err)
		return nil, fmt.Errorf("advisory: lock %v: session failed, its locks are lost: %w", key, err)
	}
	if token == nil {
		return nil, fmt.Errorf("advisory: lock %v: %w", key, pgfence.ErrNotAcquired)
	}
	lk := &Lock{l: l, s: s, key: key, shared: shared, token: *token, acquired: time.Now()}
	lk.ctx, lk.cancel = context.WithCancelCause(context.Background())
	l.mu.Lock()
	s.inflight--
	s.locks[lk] = struct{}{}
	l.mu.Unlock()
	return lk, nil
}

// errAmbiguousUndo is returned by undoFailedLock when it cannot tell.
var errAmbiguousUndo = errors.New("advisory: the session already holds the key")

// undoFailedLock releases key on s if the failed lock statement left it
// granted. That is only decidable when s holds no other hold of key (an
// unlock then succeeds exactly when the failed statement's grant stuck);
// otherwise, or when the unlock fails, it returns an error and the caller
// must drop the session. The caller holds s.sem.
func (l *Locker) undoFailedLock(ctx context.Context, s *session, key Key, shared bool) error {
	l.mu.Lock()
	for lk := range s.locks {
		if lk.key.id == key.id {
			l.mu.Unlock()
			return errAmbiguousUndo
		}
	}
	l.mu.Unlock()
	q := unlockSQL
	if shared {
		q = unlockSharedSQL
	}
	var released bool
	return s.queryKey(ctx, l, q, key.id, &released)
}

// dropKeyRefLocked drops one reference to key id, forgetting the key and
// waking waiters when it was the last. The caller holds l.mu.
func (l *Locker) dropKeyRefLocked(id int64) {
	ks := l.keys[id]
	if ks == nil {
		return
	}
	ks.refs--
	if ks.refs == 0 {
		delete(l.keys, id)
		close(ks.released)
	}
}
