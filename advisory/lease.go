package advisory

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/pgfence/pgfence"
	"github.com/pgfence/pgfence/internal/retry"
)

// AcquireOpts are the options of an acquire. Package advisory honours
// Shared (any number of shared holders, each with its own token),
// WaitTimeout, and MaxHold (at the bound the Locker releases the lock,
// whose context ends with cause [pgfence.ErrMaxHold]; rejected by the
// transaction methods). TTL and AtLeast are rejected: an advisory lock
// lasts as long as its session or transaction.
type AcquireOpts = pgfence.AcquireOpts

// checkOpts rejects the fields of o that advisory locks cannot honour.
func checkOpts(o *AcquireOpts) error {
	switch {
	case o == nil:
		return nil
	case o.TTL != 0:
		return errors.New("pgfence: advisory: AcquireOpts.TTL is set; an advisory lock has no TTL (it lasts as long as its session)")
	case o.AtLeast != 0:
		return errors.New("pgfence: advisory: AcquireOpts.AtLeast is set; advisory locks cannot be kept past their release")
	case o.WaitTimeout < 0:
		return fmt.Errorf("pgfence: advisory: AcquireOpts.WaitTimeout is negative (%v)", o.WaitTimeout)
	case o.MaxHold < 0:
		return fmt.Errorf("pgfence: advisory: AcquireOpts.MaxHold is negative (%v)", o.MaxHold)
	}
	return nil
}

// lockState is where a Lease is in its life; guarded by Locker.mu.
type lockState int

const (
	stateHeld      lockState = iota
	stateUnlocking           // Release is running
	stateUnlocked            // Release succeeded
	stateLost                // its session died, or the Locker closed
)

// errReleased is the cause of a Lease's context after a successful
// Release.
var errReleased = fmt.Errorf("pgfence: advisory: lock was released: %w", pgfence.ErrNotHeld)

// Lease is a held session-level advisory lock. It stays held until
// [Lease.Release], [Locker.Close], its MaxHold bound, or the end of its
// database session; then [Lease.Done] closes. It satisfies [pgfence.Lease].
// Its methods are safe for concurrent use, and Release is safe on a nil
// *Lease.
type Lease struct {
	k        *Locker
	s        *session
	key      Key
	shared   bool
	token    int64
	acquired time.Time // when granted, to choose the unlock statement
	ctx      context.Context
	cancel   context.CancelCauseFunc
	// values is the acquiring call's ctx, for its values only: the session
	// checks and background events of the lock carry them.
	values context.Context

	// Guarded by Locker.mu.
	state    lockState
	reported bool // Release has returned the loss once
	out      bool // handed to the caller: its end is counted and observed
	// maxHeld is set when MaxHold ended the lock, maxDone closes once its
	// unlock is over, maxTimer (nil without a bound) fires at MaxHold.
	maxHeld  bool
	maxDone  chan struct{}
	maxTimer *time.Timer
}

// lock returns l as events name it.
func (l *Lease) lock() pgfence.Lock {
	return pgfence.Lock{Kind: pgfence.StrategyAdvisory, Name: l.Name(), Token: l.token}
}

var _ pgfence.Lease = (*Lease)(nil)

// Key returns the lock's key.
func (l *Lease) Key() Key { return l.key }

// Name returns the name the lock was acquired by: the name of a [Name] key,
// or the decimal number of an [ID] key.
func (l *Lease) Name() string { return l.key.displayName() }

// Expiry returns the zero time: a session lock has no deadline of its own.
func (l *Lease) Expiry() time.Time { return time.Time{} }

// Shared reports whether the lock is held in shared mode.
func (l *Lease) Shared() bool { return l.shared }

// Token returns the fencing token drawn when the lock was granted: larger
// than the token of every earlier holder of the key, through any Locker,
// transaction or lease table. Present it to fenced writes (package fence).
func (l *Lease) Token() int64 { return l.token }

// Done returns a channel that is closed when the lock ends: released,
// lost, or dropped by [Locker.Close]. [Lease.Err] then says which.
func (l *Lease) Done() <-chan struct{} { return l.ctx.Done() }

// Err returns nil while the lock is held. Once it is lost it returns an
// error matching pgfence.ErrLeaseLost, and pgfence.ErrSessionEnded,
// pgfence.ErrMaxHold or pgfence.ErrClosed for the cause; after a successful
// [Lease.Release], one matching pgfence.ErrNotHeld.
func (l *Lease) Err() error { return context.Cause(l.ctx) }

// Context returns a context cancelled when the lock ends, with [Lease.Err]
// as its cause. Derive the contexts of protected work from it; an acquire of
// the same key under it returns [pgfence.ErrAlreadyHeld].
func (l *Lease) Context() context.Context { return l.ctx }

// Release releases the lock and closes [Lease.Done]. ctx lends only its
// values (Release usually runs deferred, after ctx ended); the unlock is
// bounded by Config.QueryTimeout. Calling it again, or on a nil *Lease,
// returns nil.
//
// When the lock was already lost, or the session fails during the unlock
// (the session is then closed, which releases the lock), Release returns
// an error matching pgfence.ErrNotHeld and pgfence.ErrLeaseLost, and
// pgfence.ErrUnavailable too when the failure was transient.
func (l *Lease) Release(ctx context.Context) error {
	if l == nil {
		return nil
	}
	k := l.k
	k.mu.Lock()
	switch {
	case l.maxHeld:
		// Ended at MaxHold: wait for its unlock, so the lock is free.
		k.mu.Unlock()
		<-l.maxDone
		k.mu.Lock()
		return l.reportLostLocked()
	case l.state == stateLost:
		return l.reportLostLocked()
	case l.state != stateHeld:
		k.mu.Unlock()
		return nil
	}
	l.state = stateUnlocking
	l.stopMaxHoldLocked()
	out := l.out
	k.mu.Unlock()
	if !out || k.ev == nil {
		released, err := l.release(ctx)
		if released && out {
			k.released.Add(1)
		}
		return err
	}
	op := pgfence.Op{Kind: pgfence.OpRelease, Strategy: pgfence.StrategyAdvisory, Name: l.Name(), Batch: 1}
	octx := k.ev.StartOp(ctx, op)
	released, err := l.release(octx)
	if released {
		k.released.Add(1)
		k.ev.Sync(octx, pgfence.Released{Lock: l.lock(), HeldFor: time.Since(l.acquired), Err: err})
	}
	k.ev.EndOp(octx, op, err)
	return err
}

// release is Release once l is unlocking: it queues the unlock on l's
// session. released reports whether this call ended the lock; it is false
// when the lock was lost before the unlock ran.
func (l *Lease) release(ctx context.Context) (released bool, err error) {
	r := &request{ctx: ctx, values: ctx, key: l.key, shared: l.shared, unlock: l, done: make(chan struct{})}
	l.s.submit(nil, r)
	return r.released, r.err
}

// unlockStatement returns the statement that releases l, and whether it
// wakes waiters (every unlock does, unless a test says otherwise).
func (l *Lease) unlockStatement() (q string, notify bool) {
	q = unlockSQL
	after := l.k.hooks.notifyAfter()
	switch notify = after == 0 || time.Since(l.acquired) >= after; {
	case l.shared && notify:
		q = unlockSharedNotifySQL
	case l.shared:
		q = unlockSharedSQL
	case notify:
		q = unlockNotifySQL
	}
	return q, notify
}

// unlocked records the successful unlock of l.
func (l *Lease) unlocked() {
	k := l.k
	k.mu.Lock()
	if l.maxHeld {
		l.state = stateLost // Release reports the loss
	} else {
		l.state = stateUnlocked
		l.reported = true
	}
	delete(l.s.locks, l)
	k.dropKeyRefLocked(l.key.id)
	l.cancel(errReleased)
	k.mu.Unlock()
}

// failedUnlock is Release's error once its unlock failed and the session
// was dropped.
func (l *Lease) failedUnlock() error {
	l.k.mu.Lock()
	err := l.unlockLossLocked()
	if retry.Transient(err) {
		err = fmt.Errorf("%w: %w", pgfence.ErrUnavailable, err)
	}
	return err
}

// holdFor starts l's MaxHold bound d (none when d is zero), counted from
// the grant.
func (l *Lease) holdFor(d time.Duration) {
	if d <= 0 {
		return
	}
	k := l.k
	k.mu.Lock()
	defer k.mu.Unlock()
	if l.state == stateHeld {
		l.maxTimer = time.AfterFunc(d-time.Since(l.acquired), func() { l.endMaxHold(d) })
	}
}

// stopMaxHoldLocked stops l's MaxHold timer, if any. The caller holds
// k.mu.
func (l *Lease) stopMaxHoldLocked() {
	if l.maxTimer != nil {
		l.maxTimer.Stop()
	}
}

// endMaxHold ends l at its MaxHold bound d: it cancels l's context with a
// cause matching pgfence.ErrMaxHold, then unlocks it as Release does. The
// lock ends counted in Lost, with a Lost event; the holder's Release then
// returns the loss. It does nothing once l has ended or the Locker closed.
func (l *Lease) endMaxHold(d time.Duration) {
	k := l.k
	k.mu.Lock()
	if k.closed || l.state != stateHeld {
		k.mu.Unlock()
		return
	}
	l.state = stateUnlocking
	l.maxHeld = true
	l.maxDone = make(chan struct{})
	cause := fmt.Errorf("pgfence: advisory: lock %v held for its MaxHold of %v: %w", l.key, d, pgfence.ErrMaxHold)
	l.cancel(cause) // the holder is told first, then the lock is freed
	k.wg.Add(1)     // Close waits for the unlock
	k.mu.Unlock()
	defer k.wg.Done()
	ctx := context.WithoutCancel(l.values)
	released, err := l.release(ctx)
	close(l.maxDone)
	if !released {
		return // lost before the unlock ran: the session's failure counted it
	}
	k.lost.Add(1)
	if err != nil {
		k.log.WarnContext(ctx, "pgfence: advisory: unlock at MaxHold failed; the session was closed", "key", l.key.String(), "error", err)
	}
	if k.ev != nil {
		k.ev.Async(ctx, pgfence.Lost{Lock: l.lock(), HeldFor: time.Since(l.acquired), Cause: cause})
	}
}

// unlockLossLocked is the answer of an unlock whose lock was lost: that of
// reportLostLocked, except for the unlock at MaxHold (the only unlock of a
// maxHeld lock), which leaves the report to the holder's Release. It is
// called with k.mu held and unlocks it.
func (l *Lease) unlockLossLocked() error {
	if !l.maxHeld {
		return l.reportLostLocked()
	}
	defer l.k.mu.Unlock()
	return fmt.Errorf("pgfence: advisory: release %v: %w: %w", l.key, pgfence.ErrNotHeld, context.Cause(l.ctx))
}

// reportLostLocked is Release's answer for a lost lock: the loss the first
// time, nil after. It is called with k.mu held and unlocks it.
func (l *Lease) reportLostLocked() error {
	defer l.k.mu.Unlock()
	if l.reported {
		return nil
	}
	l.reported = true
	return fmt.Errorf("pgfence: advisory: release %v: %w: %w", l.key, pgfence.ErrNotHeld, context.Cause(l.ctx))
}

// Renew checks the lock's session with a round trip, as the watchdog does;
// a session lock has no TTL, so nothing is extended. ctx bounds the wait
// for the session and lends its values to the check. After a release or
// loss it returns [Lease.Err]; when the check fails the session is dropped
// with its locks and Renew returns the loss (matching pgfence.ErrLeaseLost).
func (l *Lease) Renew(ctx context.Context) error {
	if err := l.Err(); err != nil {
		return err
	}
	k, s := l.k, l.s
	if ctx.Err() != nil {
		return fmt.Errorf("pgfence: advisory: renew %v: %w", l.key, ctxError(ctx))
	}
	select {
	case s.sem <- struct{}{}:
	case <-ctx.Done():
		return fmt.Errorf("pgfence: advisory: renew %v: %w", l.key, ctxError(ctx))
	}
	defer func() { <-s.sem }()
	if err := l.Err(); err != nil {
		return err
	}
	var op pgfence.Op
	octx := ctx
	if k.ev != nil {
		op = pgfence.Op{Kind: pgfence.OpRenew, Strategy: pgfence.StrategyAdvisory, Name: l.Name(), Batch: 1}
		octx = k.ev.StartOp(ctx, op)
	}
	err := s.ping(octx)
	if err != nil {
		err = fmt.Errorf("pgfence: advisory: liveness check failed: %w", err)
		s.fail(octx, err)
	}
	if k.ev != nil {
		k.ev.EndOp(octx, op, err)
		if err == nil {
			k.ev.Async(context.WithoutCancel(ctx), pgfence.Renewed{Lock: l.lock()})
		}
	}
	return l.Err()
}
