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

// TryAcquire is [Locker.TryAcquireKey] for [Name](name). The returned
// [pgfence.Lease] is a *[Lease].
func (k *Locker) TryAcquire(ctx context.Context, name string, opts *AcquireOpts) (pgfence.Lease, error) {
	l, err := k.TryAcquireKey(ctx, Name(name), opts)
	if err != nil {
		return nil, err
	}
	return l, nil
}

// TryAcquireKey takes the session lock on key if it is free, and returns at
// once. ctx bounds the wait for a session; the lock statement is bounded by
// Config.QueryTimeout alone, since cancelling it would close the session.
// When it returns an error, the lock is not held.
//
// It returns an error matching pgfence.ErrNotAcquired when another holder
// has the key, pgfence.ErrAlreadyHeld when ctx descends from the key's own
// Lease, pgfence.ErrClosed after Close, and ctx's cause when ctx ends.
// Transient errors are retried on a new session for up to QueryTimeout, then
// returned matching pgfence.ErrUnavailable. Other server errors are returned
// wrapped.
func (k *Locker) TryAcquireKey(ctx context.Context, key Key, opts *AcquireOpts) (*Lease, error) {
	return k.acquire(ctx, key, opts, false)
}

// Acquire is [Locker.AcquireKey] for [Name](name). The returned
// [pgfence.Lease] is a *[Lease].
func (k *Locker) Acquire(ctx context.Context, name string, opts *AcquireOpts) (pgfence.Lease, error) {
	l, err := k.AcquireKey(ctx, Name(name), opts)
	if err != nil {
		return nil, err
	}
	return l, nil
}

// AcquireKey waits until it holds the session lock on key, ctx ends, or
// opts.WaitTimeout runs out. While another session holds the key it waits
// in the server on a parked session, or polls and listens for the release
// (see Waiting in the package documentation). Transient errors are retried
// on a new session for as long as ctx and WaitTimeout allow.
//
// A WaitTimeout that runs out returns an error matching
// pgfence.ErrNotAcquired and context.DeadlineExceeded; an ended ctx, its
// cause; either one also matches pgfence.ErrUnavailable when the last
// attempt failed transiently. Other errors are as for
// [Locker.TryAcquireKey]. When it returns an error, the lock is not held.
func (k *Locker) AcquireKey(ctx context.Context, key Key, opts *AcquireOpts) (*Lease, error) {
	return k.acquire(ctx, key, opts, true)
}

// Do is [Locker.DoKey] for [Name](name).
func (k *Locker) Do(ctx context.Context, name string, opts *AcquireOpts, fn func(ctx context.Context, l pgfence.Lease) error) error {
	return k.DoKey(ctx, Name(name), opts, fn)
}

// DoKey waits for the lock on key as [Locker.AcquireKey] does, calls fn
// while holding it, then releases it. fn's context is cancelled, with a
// cause matching pgfence.ErrLeaseLost, when the lock is lost; a nested Do
// for the same key returns pgfence.ErrAlreadyHeld.
//
// It returns the acquire's error (fn is not called), or fn's error joined
// with the loss, if the lock was lost before fn returned, and with the
// release's error.
func (k *Locker) DoKey(ctx context.Context, key Key, opts *AcquireOpts, fn func(ctx context.Context, l pgfence.Lease) error) error {
	return hold.Do(ctx, k, key.markName(), "pgfence: advisory", func(ctx context.Context) (pgfence.Lease, error) {
		l, err := k.AcquireKey(ctx, key, opts)
		if err != nil {
			return nil, err
		}
		return l, nil
	}, fn)
}

// acquire is TryAcquireKey (wait false) and AcquireKey (wait true): it
// validates the call, runs its attempts within an OpAcquire, and reports
// the outcome (the Acquired or NotAcquired event, and the counters).
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

// attempts runs the attempts of an acquire. ctx is the operation's (the
// statements carry its values), values the caller's own. n counts the
// attempts that asked the database.
func (k *Locker) attempts(ctx, values context.Context, key Key, opts *AcquireOpts, wait bool) (l *Lease, n int, err error) {
	if hold.Held(values, k, key.markName()) {
		return nil, 0, fmt.Errorf("pgfence: advisory: acquire %v: %w", key, pgfence.ErrAlreadyHeld)
	}
	w := waiter{k: k, values: values, key: key, wait: wait, pause: k.hooks.pauseStart()}
	if opts != nil {
		w.opts = *opts
	}
	if !wait {
		w.opts.WaitTimeout = 0
	}
	ctx, cancel := hold.WaitTimeout(ctx, w.opts.WaitTimeout)
	defer cancel()
	w.ctx, w.start = ctx, time.Now()
	l, err = w.run()
	return l, w.n, err
}

// step is what the next round of an acquire does.
type step int

const (
	stepAsk  step = iota // try the lock on a session
	stepPark             // wait for it in the server, on a parked session
	stepSkip             // count as refused without asking: a call of this Locker just was
)

// waiter is one acquire going round: each round makes the attempt that
// step names, and its outcome chooses the next step. A TryAcquire makes one
// attempt, plus the retries of transient errors. An Acquire refused joins
// the key's line (package waitline): only the line's head asks the server
// and is woken, so a release wakes one call per Locker.
type waiter struct {
	k           *Locker
	ctx, values context.Context // the operation's ctx, bounded by WaitTimeout; the caller's
	key         Key
	opts        AcquireOpts
	wait        bool // AcquireKey: go round until granted
	start       time.Time
	n           int // attempts that asked the database

	next       step
	parkFailed bool // the last stepPark found no session: poll before parking again

	last     error // the last attempt's transient error; nil after an answer
	failures int   // consecutive transient failures

	ln   *waitline.Line // the key's line, joined at the first refusal
	head bool           // at the head of ln

	pause     time.Duration // the next polling pause
	armedSeen chan struct{} // the armed channel already acted on
	lastWake  time.Time     // when the last attempt a notification woke began
}

// run goes round until the lock is granted, a final error comes, or ctx
// ends.
func (w *waiter) run() (*Lease, error) {
	defer w.leaveLine()
	for round := 0; ; round++ {
		if round > 0 {
			w.k.hooks.round()
		}
		if w.ctx.Err() != nil {
			return nil, w.ended()
		}
		// Taken before the attempt, so that a notification arriving after
		// it is not missed.
		armed, wake := w.lineChannels()
		l, local, err := w.attempt()
		if err == nil {
			l.holdFor(w.opts.MaxHold)
			return l, nil
		}
		if w.ctx.Err() != nil {
			return nil, w.ended()
		}
		if w.k.transient(err) {
			if err := w.backOff(err); err != nil {
				return nil, err
			}
			continue
		}
		if !w.wait || !errors.Is(err, pgfence.ErrNotAcquired) {
			return nil, err
		}
		if err := w.refused(local, armed, wake); err != nil {
			return nil, err
		}
	}
}

// attempt makes the attempt of the current step and hands out its grant.
// local is the key's state when a call of this Locker holds or asks for it.
func (w *waiter) attempt() (l *Lease, local *keyState, err error) {
	k := w.k
	st := w.next
	w.next = stepAsk
	if st == stepSkip {
		return nil, nil, pgfence.ErrNotAcquired
	}
	var asked, parked bool
	if st == stepPark {
		k.mu.Lock()
		s, open := k.parkSessionLocked(w.key.id)
		k.mu.Unlock()
		if parked = s != nil; parked {
			l, err = s.park(w.ctx, w.values, w.key, open)
		}
		asked, w.parkFailed = parked, !parked
	}
	if !parked {
		l, local, asked, err = k.tryAcquire(w.ctx, w.values, w.key, w.opts.Shared)
	}
	if err == nil {
		l, err = k.handOut(w.ctx, w.key, l)
	}
	if asked {
		w.n++
		k.hooks.refused(err)
	}
	return l, local, err
}

// leaveLine takes the call out of its key's line, and drops the line's
// registration when it was the last.
func (w *waiter) leaveLine() {
	if w.ln == nil {
		return
	}
	k := w.k
	if !k.lines.Leave(w.key.id, w.ln, w.head) {
		return
	}
	k.mu.Lock()
	reg := k.lineRegs[w.ln]
	delete(k.lineRegs, w.ln)
	k.mu.Unlock()
	if reg != nil {
		k.unregister(reg)
	}
}

// register registers the call's line for wake-ups unless it already is,
// and returns its channels (see lineChannels). The line keeps one
// registration from head to head.
func (w *waiter) register() (armed, wake chan struct{}) {
	k := w.k
	k.mu.Lock()
	defer k.mu.Unlock()
	reg, registered := k.lineRegs[w.ln]
	if !registered {
		reg = k.registerLocked(w.values, w.key.id) // nil after Close or with DisableListen
		k.lineRegs[w.ln] = reg
	}
	if reg == nil {
		return nil, nil
	}
	return reg.in.armed, reg.in.wake
}

// lineChannels returns the channels the line's head selects on: armed
// until the interest lock is held, and the current wake channel; nil while
// the line is not registered.
func (w *waiter) lineChannels() (armed, wake chan struct{}) {
	if w.ln == nil {
		return nil, nil
	}
	k := w.k
	k.mu.Lock()
	defer k.mu.Unlock()
	reg := k.lineRegs[w.ln]
	if reg == nil {
		return nil, nil
	}
	return reg.in.armed, reg.in.wake
}

// backOff waits before the retry of a transient error, or returns the error
// to give up with.
func (w *waiter) backOff(err error) error {
	k := w.k
	w.last = err
	w.failures++
	d := k.backoff.Wait(w.failures)
	if !k.hooks.retries() || (!w.wait && time.Since(w.start)+d > k.cfg.QueryTimeout) {
		return retry.Unavailable(fmt.Sprintf("pgfence: advisory: acquire %v: ", w.key), err)
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-w.ctx.Done():
		return w.ended()
	case <-k.closeCtx.Done():
		return pgfence.ErrClosed
	case <-t.C:
		return nil
	}
}

// refused takes a refusal: the call waits for the head of the key's line,
// then parks when it can, or else waits for a wake-up or its pause.
func (w *waiter) refused(local *keyState, armed, wake chan struct{}) error {
	w.last, w.failures = nil, 0
	if w.ln == nil {
		w.ln = w.k.lines.Join(w.key.id)
	}
	if !w.head {
		waited, stopped := w.ln.Head(w.ctx, w.k.closeCtx.Done())
		switch {
		case stopped && w.ctx.Err() != nil:
			return w.ended()
		case stopped:
			return pgfence.ErrClosed
		}
		w.head = true
		if waited {
			return nil // behind other calls until now: ask at once
		}
	}
	if local == nil && !w.opts.Shared && !w.parkFailed && w.k.canPark(w.key.id) {
		w.next = stepPark
		return nil
	}
	w.parkFailed = false
	return w.sleep(local, armed, wake)
}

// sleep waits for a pause (jittered over [pause/2, pause), doubling up to
// MaxPollInterval), or sooner for a wake-up: local's release when a call of
// this Locker has the key, else a notification (registering for it first).
// armed and wake are the line's channels taken before the attempt: a
// notification that came since closed wake, and the channel registering
// returns now would not show it. Registering's channels serve only a line
// that was not registered then.
func (w *waiter) sleep(local *keyState, armed, wake chan struct{}) error {
	k := w.k
	var released chan struct{}
	if local != nil {
		released = local.released
	} else if a, wk := w.register(); wake == nil || k.hooks.lateWake() {
		armed, wake = a, wk
	}
	if armed == w.armedSeen {
		armed = nil
	}
	t := time.NewTimer(w.pause/2 + rand.N(w.pause/2+1))
	defer t.Stop()
	select {
	case <-w.ctx.Done():
		return w.ended()
	case <-k.closeCtx.Done():
		return pgfence.ErrClosed
	case <-released:
		k.mu.Lock()
		refused := local.refused
		k.mu.Unlock()
		if refused {
			// The other call was refused by the server: so are we.
			w.next = stepSkip
			w.register()
			return nil
		}
	case <-armed:
		w.armedSeen = armed
	case <-wake:
		if !w.wakeAfterGap() {
			if w.ctx.Err() != nil {
				return w.ended()
			}
			return pgfence.ErrClosed
		}
		w.lastWake = time.Now()
	case <-t.C:
	}
	w.pause = min(2*w.pause, k.cfg.MaxPollInterval)
	return nil
}

// wakeAfterGap waits until the least gap between two notified attempts has
// passed since the last one, so that forged notifications make at most one
// attempt per gap. It returns false when ctx ended or the Locker closed.
func (w *waiter) wakeAfterGap() bool {
	d := w.k.hooks.notifiedGap() - time.Since(w.lastWake)
	w.k.hooks.woke(d)
	if d <= 0 {
		return true
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-w.ctx.Done():
		return false
	case <-w.k.closeCtx.Done():
		return false
	case <-t.C:
		return true
	}
}

// ended is the error of a call whose ctx ended, with the last transient
// failure if the database was unavailable.
func (w *waiter) ended() error {
	if w.last != nil {
		return fmt.Errorf("pgfence: advisory: acquire %v: %w; last attempt: %w", w.key, ctxError(w.ctx), retry.Unavailable("", w.last))
	}
	return fmt.Errorf("pgfence: advisory: acquire %v: %w", w.key, ctxError(w.ctx))
}

// ctxError is ctx's cause, made to match ctx.Err() too.
func ctxError(ctx context.Context) error {
	cause := context.Cause(ctx)
	if errors.Is(cause, ctx.Err()) {
		return cause
	}
	return fmt.Errorf("%w: %w", ctx.Err(), cause)
}

// transient reports whether an attempt's error is worth retrying: the
// database was unavailable, or the attempt's session failed.
func (k *Locker) transient(err error) bool {
	if errors.Is(err, pgfence.ErrNotAcquired) {
		return false // the hot refusal: spare retry.Transient's errors.As calls
	}
	return errors.Is(err, errSessionFailed) || errors.Is(err, errLostAtGrant) || errors.Is(err, errUnconfirmedCommit) || retry.Transient(err)
}

// heldHereError is the refusal of a key held in this Locker in a
// conflicting mode; it matches pgfence.ErrNotAcquired. It costs no round
// trip, so its message is rendered only when asked for.
type heldHereError struct{ key Key }

func (e *heldHereError) Error() string {
	return "pgfence: advisory: lock " + e.key.String() + " is held in this Locker: " + pgfence.ErrNotAcquired.Error()
}

func (e *heldHereError) Unwrap() error { return pgfence.ErrNotAcquired }

// errLostAtGrant is the error of an attempt whose session failed between
// the grant and the hand-out.
var errLostAtGrant = errors.New("the session failed just after the grant")

// tryAcquire asks once for key on a session, the key's own when a call of
// this Locker holds it shared, and returns the grant, not yet handed out.
// When the key is held or asked for here in a conflicting mode it returns
// ErrNotAcquired and the key's state, whose released channel closes when
// that changes. asked reports that the attempt reached for the database.
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

	// abandon drops the reservation; refused: the server refused the lock.
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
	if err := s.ready(ctx, open); err != nil {
		abandon(false)
		return nil, nil, asked, err
	}
	l, ran, err := s.grant(ctx, values, key, shared)
	if !ran {
		abandon(false)
		return nil, nil, asked, err
	}
	if err != nil {
		abandon(errors.Is(err, pgfence.ErrNotAcquired))
		return nil, nil, true, err
	}
	return l, nil, true, nil
}

// handOut returns l, just granted, to the acquire's caller: it releases l
// when ctx has ended, and hands it out only while it is held (its session
// may have failed since the grant).
func (k *Locker) handOut(ctx context.Context, key Key, l *Lease) (*Lease, error) {
	if h := k.hooks; h != nil && h.afterGrant != nil {
		h.afterGrant(l)
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
