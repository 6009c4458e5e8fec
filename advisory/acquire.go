package advisory

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/pgfence/pgfence"
	"github.com/pgfence/pgfence/internal/hold"
	"github.com/pgfence/pgfence/internal/retry"
	"github.com/pgfence/pgfence/internal/waitline"
)

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
// the lock is not held. When ctx has already ended it sends nothing and
// returns an error wrapping ctx's cause and matching ctx.Err().
//
// A transient database error (the server unreachable, restarting or
// failing over, a session that died: see pgfence.ErrUnavailable) is
// retried with capped, jittered backoff on a new session for at most
// Config.QueryTimeout in all, then returned wrapped in an error matching
// pgfence.ErrUnavailable. A grant whose session died before TryAcquireKey
// could return it is retried likewise: it never returns a lock that is
// already lost.
//
// Another error the server reports for the statement (such as SQLSTATE
// 53200, out of shared memory, when its lock table is full) is returned
// wrapped, and the session keeps its other locks. When the session itself
// fails during the statement (or its state cannot be told, as when a
// shared key it already holds fails again), every lock on that session is
// lost; for a transient failure the acquire then retries as above, for
// another it returns the failure.
func (k *Locker) TryAcquireKey(ctx context.Context, key Key, opts *AcquireOpts) (*Lease, error) {
	return k.acquire(ctx, key, opts, false)
}

// acquire is TryAcquireKey (wait false) and AcquireKey (wait true): it
// validates the call, brackets its attempts with an OpAcquire (whose ctx
// the statements run with) and reports the outcome: the Acquired or
// NotAcquired event, sent with that ctx before EndOp (bad input aside),
// and the Stats counters.
func (k *Locker) acquire(ctx context.Context, key Key, opts *AcquireOpts, wait bool) (*Lease, error) {
	if err := key.validate(); err != nil {
		return nil, err
	}
	if err := checkOpts(opts); err != nil {
		return nil, err
	}
	if wait {
		k.waiting.Add(1)
		defer k.waiting.Add(-1)
	}
	if k.ev == nil {
		l, _, err := k.attempts(ctx, ctx, key, opts, wait)
		if err == nil {
			k.acquired.Add(1)
		} else {
			k.notAcquired.Add(1)
		}
		return l, err
	}
	start := time.Now()
	op := pgfence.Op{Kind: pgfence.OpAcquire, Strategy: pgfence.StrategyAdvisory, Name: key.displayName(), Batch: 1}
	octx := k.ev.StartOp(ctx, op)
	l, n, err := k.attempts(octx, ctx, key, opts, wait)
	if err == nil {
		k.acquired.Add(1)
		k.ev.Sync(octx, pgfence.Acquired{Lock: l.lock(), Wait: time.Since(start), Attempts: n})
	} else {
		k.notAcquired.Add(1)
		k.ev.Sync(octx, pgfence.NotAcquired{Lock: pgfence.Lock{Kind: pgfence.StrategyAdvisory, Name: op.Name},
			Wait: time.Since(start), Attempts: n, Err: err})
	}
	k.ev.EndOp(octx, op, err)
	return l, err
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
// When another session holds the key, it waits in the server: it parks on
// a session of the Locker that holds no lock (opening one if MaxSessions
// allows, and leaving at least one session to other keys) and blocks there
// in pg_advisory_lock, so the holder's Unlock, in any process, hands the
// lock over at once, and the parked waits of all Lockers are served in the
// order their wait statements began (a statement is sent again every
// SessionCheckInterval, or half of the server's deadlock_timeout, and
// then joins the back of the line: no FIFO order is promised). When no
// session can be parked (MaxSessions 1, or MaxSessions-1 of them parked
// already), and for shared locks, it waits by
// retrying pg_try_advisory_lock on the Locker's sessions, pausing 5ms at
// first and doubling up to Config.MaxPollInterval, and registers on the
// Locker's LISTEN connection so that the Unlock wakes it with NOTIFY (see
// Waiting in the package documentation; Config.DisableListen turns this
// off). A parked session holds nothing else, and a cancelled wait is ended
// with a cancel request, so cancelling a wait never closes a session
// holding other locks. When a holder in this Locker unlocks, the next
// waiting call of the Locker tries at once. The waiting calls of one
// Locker are served about in the order they were first refused: only the
// first of them parks or retries and is woken, the others wait in-process
// behind it, so a release wakes one call per Locker however many wait.
//
// Transient database errors (see pgfence.ErrUnavailable) are retried, on a
// new session, with capped, jittered backoff (25ms doubling up to 500ms)
// for as long as ctx and opts.WaitTimeout allow: a wait rides through a
// restart or failover of the database. When ctx or WaitTimeout ends while
// the database is unavailable (the last attempt failed with a transient
// error), the error matches pgfence.ErrUnavailable and wraps the last
// cause as well as ctx's cause (so a WaitTimeout still matches
// pgfence.ErrNotAcquired and context.DeadlineExceeded).
//
// If ctx ends just as the lock is granted, AcquireKey releases it: when it
// returns an error, the lock is not held. It never returns a lock already
// lost. Other errors are as for [Locker.TryAcquireKey].
func (k *Locker) AcquireKey(ctx context.Context, key Key, opts *AcquireOpts) (*Lease, error) {
	return k.acquire(ctx, key, opts, true)
}

// attempts runs the attempts of an acquire: one for TryAcquireKey (plus
// retries of transient errors), as many as it takes for AcquireKey. ctx is
// the operation's ctx (statements run with its values), values the
// caller's own. n counts the attempts that asked the database (a refusal
// by a holder in this Locker does not).
func (k *Locker) attempts(ctx, values context.Context, key Key, opts *AcquireOpts, wait bool) (l *Lease, n int, err error) {
	if hold.Held(values, k, key.markName()) {
		return nil, 0, fmt.Errorf("pgfence: advisory: acquire %v: %w", key, pgfence.ErrAlreadyHeld)
	}
	var o AcquireOpts
	if opts != nil {
		o = *opts
	}
	if !wait {
		o.WaitTimeout = 0
	}
	ctx, cancel := hold.WaitTimeout(ctx, o.WaitTimeout)
	defer cancel()
	start := time.Now()
	var last error // the last attempt's transient error; nil after an answer
	failures := 0  // consecutive transient failures
	ended := func() error {
		if last != nil {
			return fmt.Errorf("pgfence: advisory: acquire %v: %w; last attempt: %w", key, ctxError(ctx), retry.Unavailable("", last))
		}
		return fmt.Errorf("pgfence: advisory: acquire %v: %w", key, ctxError(ctx))
	}
	pause := k.firstPause
	// ln is the key's line of waiting calls in this Locker, joined at the
	// first refusal; only the call at its head (head) retries and selects
	// on the wake-ups below, the others wait for its turn (package
	// waitline, and the registration notes above leaveLine).
	var ln *waitline.Line
	head := false
	var armedSeen chan struct{} // the armed channel already acted on
	// skip is set when this call waited behind another of this Locker's
	// calls for the key and that call was refused by the server: the next
	// round waits (for a wake-up or its pause) without asking again, so a
	// refusal is not repeated once per local waiter.
	skip := false
	// parkNext makes the next round wait in the server (park.go), after
	// a refusal by another session; parkFailed records that it could not
	// park, so that the round waits as before instead.
	parkNext, parkFailed := false, false
	// lastWake is when the last attempt woken by a notification began:
	// the next one waits until k.wakeGap after it (see Waiting in the
	// package documentation).
	var lastWake time.Time
	defer func() {
		if ln != nil {
			k.leaveLine(key.id, ln, head)
		}
	}()
	for round := 0; ; round++ {
		if round > 0 && k.onRound != nil {
			k.onRound()
		}
		if ctx.Err() != nil {
			return nil, n, ended()
		}
		// Take the wake channel before the attempt, so that a
		// notification arriving after the attempt is not missed.
		var armed, wake chan struct{}
		if ln != nil {
			armed, wake = k.lineChannels(ln)
		}
		var l *Lease
		var local *keyState
		var asked bool
		var err error
		if skip {
			skip, err = false, pgfence.ErrNotAcquired
		} else {
			parked := false
			if parkNext {
				// Wait in the server (park.go); when no session can be
				// parked, try once and wait as before.
				parkNext = false
				l, parked, err = k.park(ctx, values, key)
				asked, parkFailed = parked, !parked
			}
			if !parked {
				l, local, asked, err = k.tryAcquire(ctx, values, key, o.Shared)
			}
		}
		if asked {
			n++
			if k.onRefused != nil && errors.Is(err, pgfence.ErrNotAcquired) {
				k.onRefused()
			}
		}
		if err == nil {
			l.holdFor(o.MaxHold)
			return l, n, nil
		}
		if ctx.Err() != nil {
			return nil, n, ended()
		}
		var released chan struct{}
		if local != nil {
			released = local.released
		}
		if k.transient(err) {
			last = err
			failures++
			d := k.backoff.Wait(failures)
			if k.noRetry || (!wait && time.Since(start)+d > k.cfg.QueryTimeout) {
				return nil, n, retry.Unavailable(fmt.Sprintf("pgfence: advisory: acquire %v: ", key), err)
			}
			t := time.NewTimer(d)
			select {
			case <-ctx.Done():
				t.Stop()
				return nil, n, ended()
			case <-k.closeCtx.Done():
				t.Stop()
				return nil, n, pgfence.ErrClosed
			case <-t.C:
			}
			continue
		}
		if !wait || !errors.Is(err, pgfence.ErrNotAcquired) {
			return nil, n, err
		}
		last, failures = nil, 0
		if ln == nil {
			ln = k.lines.Join(key.id)
		}
		if !head {
			waited, stopped := ln.Head(ctx, k.closeCtx.Done())
			switch {
			case stopped && ctx.Err() != nil:
				return nil, n, ended()
			case stopped:
				return nil, n, pgfence.ErrClosed
			}
			head = true
			if waited {
				// Behind other waiting calls until now: try at once (the
				// call before got the key, then held here, or left
				// without it).
				continue
			}
		}
		if local == nil && !o.Shared && !parkFailed && k.canPark(key.id) {
			// Held by another session: wait for it in the server.
			parkNext = true
			continue
		}
		parkFailed = false
		if local == nil {
			// Held by another session: ask to be woken. Until the
			// interest lock is held (armed), an Unlock would not
			// notify; armed closing makes the next attempt at once.
			armed, wake = k.lineRegister(ln, values, key.id)
		}
		if armed == armedSeen {
			armed = nil
		}
		// Full jitter over [pause/2, pause) spreads competing pollers.
		t := time.NewTimer(pause/2 + rand.N(pause/2+1))
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, n, ended()
		case <-k.closeCtx.Done():
			t.Stop()
			return nil, n, pgfence.ErrClosed
		case <-released: // nil (blocks) unless held or asked for in this Locker
			t.Stop()
			k.mu.Lock()
			refused := local.refused
			k.mu.Unlock()
			if refused {
				// Asked for by another call of this Locker, and refused:
				// wait for the holder's Unlock (registering now) or for
				// the pause, as if refused ourselves.
				skip = true
				k.lineRegister(ln, values, key.id)
				continue
			}
		case <-armed: // nil unless waiting for the interest lock
			t.Stop()
			armedSeen = armed
		case <-wake: // nil unless registered
			t.Stop()
			if !k.wakeAfterGap(ctx, lastWake) {
				if ctx.Err() != nil {
					return nil, n, ended()
				}
				return nil, n, pgfence.ErrClosed
			}
			lastWake = time.Now()
		case <-t.C:
		}
		pause = min(2*pause, k.cfg.MaxPollInterval)
	}
}

// wakeAfterGap waits, after a notification woke an Acquire, until k.wakeGap
// has passed since the last attempt a notification woke (at last), so that
// notifications, which any role can send, make at most one attempt per
// wakeGap for a key of a Locker. It returns false when ctx ended or the
// Locker closed first.
func (k *Locker) wakeAfterGap(ctx context.Context, last time.Time) bool {
	d := k.wakeGap - time.Since(last)
	if k.onWake != nil {
		k.onWake(d)
	}
	if d <= 0 {
		return true
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-k.closeCtx.Done():
		return false
	case <-t.C:
		return true
	}
}

// ctxError is the error of a call whose ctx ended: ctx's cause, which
// also matches ctx.Err() (context.Canceled or DeadlineExceeded).
func ctxError(ctx context.Context) error {
	cause := context.Cause(ctx)
	if errors.Is(cause, ctx.Err()) {
		return cause
	}
	return fmt.Errorf("%w: %w", ctx.Err(), cause)
}

// transient reports whether an attempt's error is worth retrying: the
// database was unavailable (retry.Transient), or the attempt's session
// failed (before its turn, or just after the grant).
func (k *Locker) transient(err error) bool {
	if errors.Is(err, pgfence.ErrNotAcquired) {
		return false // the hot refusal: spare it retry.Transient's errors.As calls
	}
	return errors.Is(err, errSessionFailed) || errors.Is(err, errLostAtGrant) || retry.Transient(err)
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
// called): as for AcquireKey, it matches pgfence.ErrUnavailable when the
// database stayed unavailable until ctx or WaitTimeout ended. Otherwise
// it returns fn's error, joined with the loss (an error matching
// pgfence.ErrLeaseLost) whenever the lock was lost before fn returned, and
// with the release's error: one error, whose message is one line ("; "
// between the parts), matching each part with errors.Is and errors.As.
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

// errLostAtGrant is the error of an attempt whose lock was granted but
// whose session failed before the attempt could return it.
var errLostAtGrant = errors.New("the session failed just after the grant")

// tryAcquire makes one attempt at key. When the key is held in this Locker
// in a conflicting mode, or another call of this Locker is asking the
// server for it, it returns ErrNotAcquired and that key's state: its
// released channel closes when that changes, and its refused field (read
// under k.mu) then tells whether the other call was refused by the server,
// the key being held by another session. asked reports whether the attempt reached for the database
// (dialed a session or sent the lock statement). ctx is the acquire's
// operation ctx; values the caller's, kept by the Lease.
func (k *Locker) tryAcquire(ctx, values context.Context, key Key, shared bool) (l *Lease, local *keyState, asked bool, err error) {
	id := key.id
	k.mu.Lock()
	if k.closed {
		k.mu.Unlock()
		return nil, nil, false, pgfence.ErrClosed
	}
	ks := k.keys[id]
	var s *session
	open := false
	if ks != nil {
		if !shared || ks.exclusive {
			k.mu.Unlock()
			return nil, ks, false, &heldHereError{key: key}
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

	// abandon drops the reservation taken above; refused says why: the
	// server refused the lock (another session holds it).
	abandon := func(refused bool) {
		k.mu.Lock()
		s.inflight--
		if refused && ks.refs == 1 && k.keys[id] == ks {
			ks.refused = true
		}
		k.dropKeyRefLocked(id)
		k.mu.Unlock()
	}
	asked = open
	if err := k.sessionReady(ctx, s, open); err != nil {
		abandon(false)
		return nil, nil, asked, err
	}
	// Wait for the session's turn, or for a caller holding it to run this
	// request along with its own (batch.go).
	l, ran, err := k.grant(ctx, values, s, key, shared)
	if !ran {
		abandon(false)
		return nil, nil, asked, err
	}
	if err != nil {
		abandon(errors.Is(err, pgfence.ErrNotAcquired))
		return nil, nil, true, err
	}
	l, err = k.handOut(ctx, key, l)
	return l, nil, true, err
}

// sessionReady waits until s is open, dialing it first when open is true
// (the caller reserved a new session). The dial runs in the background, so
// that the caller can leave when ctx ends (a dial to a host that does not
// answer lasts QueryTimeout) while the others routed to the session wait
// on. It returns ctx's error, or why the session could not be opened.
func (k *Locker) sessionReady(ctx context.Context, s *session, open bool) error {
	if open {
		k.wg.Add(1)
		go func() {
			defer k.wg.Done()
			k.openSession(ctx, s)
		}()
	}
	select {
	case <-s.ready:
	case <-ctx.Done():
		return ctx.Err()
	}
	return s.openErr
}

// handOut returns l, just granted for key, to the acquire's caller: it
// releases l when ctx has ended (the caller will not use it), and hands it
// out only while it is held, since its session may have failed since the
// statement answered (the watchdog, or a statement of another caller).
// The caller does not hold l's session.
func (k *Locker) handOut(ctx context.Context, key Key, l *Lease) (*Lease, error) {
	if k.afterGrant != nil {
		k.afterGrant(l)
	}
	if ctx.Err() != nil {
		_ = l.Release(ctx)
		return nil, ctx.Err()
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	if l.state == stateLost {
		return nil, fmt.Errorf("pgfence: advisory: lock %v: %w: %w", key, errLostAtGrant, context.Cause(l.ctx))
	}
	l.out = true
	return l, nil
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
	// refused is set, before released closes, when the last ref was an
	// acquisition the server refused: the key is held by another session,
	// so the calls that waited for this one should not all ask again at
	// once (see attempts).
	refused bool
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

// The calls of one Locker waiting for a key stand in its line (package
// waitline): only the head retries, polls and listens for the wake-ups (a
// holder of this Locker unlocking, a NOTIFY from another process); the
// others wait for its turn. So a release or a notification wakes one call
// per Locker, not every waiting call. The line keeps one registration for
// wake-ups from head to head (Locker.lineRegs), so a hand-over inside the
// Locker does not drop and take again the interest lock. Calls that do not
// wait (TryAcquire) and the first attempt of an Acquire do not queue.

// leaveLine takes the caller out of key id's line ln (see
// waitline.Lines.Leave), and drops the line's registration when the caller
// was the last.
func (k *Locker) leaveLine(id int64, ln *waitline.Line, head bool) {
	if !k.lines.Leave(id, ln, head) {
		return
	}
	k.mu.Lock()
	reg := k.lineRegs[ln]
	delete(k.lineRegs, ln)
	k.mu.Unlock()
	if reg != nil {
		k.unregister(reg)
	}
}

// lineRegister registers ln for wake-ups of key id unless it already is,
// and returns its channels (see lineChannels).
func (k *Locker) lineRegister(ln *waitline.Line, values context.Context, id int64) (armed, wake chan struct{}) {
	k.mu.Lock()
	defer k.mu.Unlock()
	reg, registered := k.lineRegs[ln]
	if !registered {
		reg = k.registerLocked(values, id) // nil after Close or with DisableListen
		k.lineRegs[ln] = reg
	}
	if reg == nil {
		return nil, nil
	}
	return reg.in.armed, reg.in.wake
}

// lineChannels returns the channels the head of ln selects on: armed until
// the line's interest lock is held, and the current wake channel; both nil
// while the line is not registered.
func (k *Locker) lineChannels(ln *waitline.Line) (armed, wake chan struct{}) {
	k.mu.Lock()
	defer k.mu.Unlock()
	reg := k.lineRegs[ln]
	if reg == nil {
		return nil, nil
	}
	return reg.in.armed, reg.in.wake
}
