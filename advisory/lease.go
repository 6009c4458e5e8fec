package advisory

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/pgfence/pgfence"
	"github.com/pgfence/pgfence/internal/retry"
)

// Package advisory honours these fields of [pgfence.AcquireOpts]:
//
//   - Shared takes the lock in shared mode (pg_advisory_lock_shared and
//     friends): any number of shared holders, or one exclusive holder.
//     Each shared holder gets its own fencing token.
//   - WaitTimeout bounds how long [Locker.Acquire], [Locker.Do] and
//     [Locker.AcquireTx] wait for the lock.
//   - MaxHold bounds how long a session lock is held: at the bound the
//     Locker releases it and its context ends with cause
//     [pgfence.ErrMaxHold] (the lock counts as lost).
//
// TTL and AtLeast are rejected: an advisory lock lasts as long as its
// database session (or transaction), not for a time. MaxHold is rejected
// by the transaction methods: a transaction lock ends with its transaction.
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

// lockState is where a Lock is in its life; guarded by Locker.mu.
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

// Lease is a held session-level advisory lock, returned by the Locker's
// acquire methods. It stays held until [Lease.Release], until the Locker is
// closed, until its MaxHold bound passes, or until the database session
// holding it dies; then [Lease.Done] closes. It satisfies [pgfence.Lease]. Its methods are safe for concurrent
// use, and Release is safe on a nil *Lease.
type Lease struct {
	k        *Locker
	s        *session
	key      Key
	shared   bool
	token    int64
	acquired time.Time // when granted, to choose the unlock statement
	ctx      context.Context
	cancel   context.CancelCauseFunc
	// values is the acquiring call's ctx, used for its values only (never
	// for its cancellation): the session checks of the lock and its
	// background events carry them. It is kept as given, so that an
	// acquire without an Observer allocates nothing for it.
	values context.Context

	// Guarded by Locker.mu.
	state    lockState
	reported bool // Release has returned the loss once
	out      bool // handed to the caller: its end is counted and observed
	// maxHeld is set when the MaxHold bound ended the lock, and maxDone
	// closes once its unlock is over; maxTimer, nil without a bound, fires
	// at it (endMaxHold).
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
// It lasts until it is released or its session ends, which the Locker
// notices within Config.SessionCheckInterval + Config.QueryTimeout.
func (l *Lease) Expiry() time.Time { return time.Time{} }

// Shared reports whether the lock is held in shared mode.
func (l *Lease) Shared() bool { return l.shared }

// Token returns the fencing token drawn when the lock was granted. Tokens
// come from the sequence shared with the lease-table strategy, so the next
// holder of the same key (in any mode, through any Locker or transaction)
// gets a larger token; present it to fenced writes (package fence).
func (l *Lease) Token() int64 { return l.token }

// Done returns a channel that is closed when the lock ends: lost (its
// session died), released by [Lease.Release], or dropped by
// [Locker.Close]. [Lease.Err] then says which.
func (l *Lease) Done() <-chan struct{} { return l.ctx.Done() }

// Err returns nil while the lock is held. Once it is lost, including when
// the Locker is closed, it returns an error matching pgfence.ErrLeaseLost,
// and pgfence.ErrSessionEnded when its session ended, pgfence.ErrMaxHold
// when its MaxHold bound passed, or pgfence.ErrClosed for a closed Locker.
// After a successful
// [Lease.Release] it returns an error matching pgfence.ErrNotHeld.
func (l *Lease) Err() error { return context.Cause(l.ctx) }

// Context returns a context that is cancelled when the lock ends, with
// [Lease.Err] as its cause (context.Cause). Derive the contexts of protected
// work from it, or use [Locker.Do], so that work stops when the lock is lost:
// an acquire of the same key under it returns [pgfence.ErrAlreadyHeld].
func (l *Lease) Context() context.Context { return l.ctx }

// Release releases the lock (pg_advisory_unlock on its session) and closes
// [Lease.Done].
//
// ctx is only used for its values, which reach the pgx tracer: Release
// usually runs deferred, after the caller's context ended, so it ignores
// ctx's cancellation. It waits for the statements queued before it on the
// same session, each bounded by Config.QueryTimeout.
//
// When the lock was already lost, Release returns an error matching
// pgfence.ErrNotHeld (and pgfence.ErrLeaseLost); when MaxHold ended it, it
// first waits for the Locker's unlock of it. It also does so when the
// session fails during the release: the session is closed, which is what
// releases the lock (the server ends a session's locks with it; an unlock
// cannot be retried from another session). When that failure is a
// database outage (a transient error: connection lost or timed out, the
// server shutting down) the error matches pgfence.ErrUnavailable too and
// wraps the cause. After a timeout the server may hold the lock until it
// notices the closed connection (at worst when Config.TCPUserTimeout or
// the keepalives give up on the client); see Release failures in the
// package documentation for why nothing is retried. Calling Release
// again, or concurrently, or on a nil *Lease, returns nil.
func (l *Lease) Release(ctx context.Context) error {
	if l == nil {
		return nil
	}
	k := l.k
	k.mu.Lock()
	switch {
	case l.maxHeld:
		// Ended at MaxHold: wait for its unlock (bounded by QueryTimeout),
		// so that the lock is free when Release returns.
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
// session, where it runs alone or combined with the other statements queued
// meanwhile (batch.go). released reports whether this call ended the lock
// (successfully or not); it is false when the lock had been lost before
// the unlock could run.
func (l *Lease) release(ctx context.Context) (released bool, err error) {
	r := &request{ctx: ctx, values: ctx, key: l.key, shared: l.shared, unlock: l, done: make(chan struct{})}
	l.k.submit(nil, l.s, r)
	return r.released, r.err
}

// unlockStatement returns the statement that releases l: it looks for
// waiters to notify (wake.go) unless a test raised k.notifyHeld above how
// long l was held.
func (l *Lease) unlockStatement() (q string, notify bool) {
	q = unlockSQL
	switch notify = l.k.notifyHeld == 0 || time.Since(l.acquired) >= l.k.notifyHeld; {
	case l.shared && notify:
		q = unlockSharedNotifySQL
	case l.shared:
		q = unlockSharedSQL
	case notify:
		q = unlockNotifySQL
	}
	return q, notify
}

// unlockOnSession runs l's unlock statement alone on its session, with
// ctx's values. The caller holds s.sem and has checked that l is not lost.
func (l *Lease) unlockOnSession(ctx context.Context) error {
	q, _ := l.unlockStatement()
	var ok bool
	err := l.s.queryKey(ctx, l.k, q, l.key.id, &ok)
	if err == nil && !ok {
		err = errNotHeldByServer
	}
	if err != nil {
		// The session's state is unknown or wrong: drop it, with every
		// lock on it; the server releases them when the connection ends.
		l.k.failSession(ctx, l.s, err, l)
		return l.failedUnlock()
	}
	l.unlocked()
	return nil
}

// errNotHeldByServer is the failure of an unlock the server answered
// false: the session did not hold the lock.
var errNotHeldByServer = errors.New("the server reports the lock was not held by the session")

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
		return // lost before the unlock ran: failSession counted it
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
// called with l.mu held and unlocks it.
func (l *Lease) unlockLossLocked() error {
	if !l.maxHeld {
		return l.reportLostLocked()
	}
	defer l.k.mu.Unlock()
	return fmt.Errorf("pgfence: advisory: release %v: %w: %w", l.key, pgfence.ErrNotHeld, context.Cause(l.ctx))
}

// reportLostLocked is Release's answer for a lost lock: the loss the first
// time, nil after. It is called with l.mu held and unlocks it.
func (l *Lease) reportLostLocked() error {
	defer l.k.mu.Unlock()
	if l.reported {
		return nil
	}
	l.reported = true
	return fmt.Errorf("pgfence: advisory: release %v: %w: %w", l.key, pgfence.ErrNotHeld, context.Cause(l.ctx))
}

// Renew confirms the lock now: it checks the lock's session with a round
// trip (as the watchdog does every Config.SessionCheckInterval), after the
// statements queued on the session before it. A session lock has no TTL,
// so nothing is extended. When the check fails the session is dropped with
// every lock on it, and Renew returns the loss (matching
// pgfence.ErrLeaseLost): a session check is never retried, since a session
// that did not answer may already have lost its locks on the server. After
// a release or loss it returns [Lease.Err] without a round trip. ctx bounds
// the wait for the session and lends its values to the check; the check
// itself is bounded by Config.QueryTimeout, since cancelling it would close
// the session.
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
	err := s.ping(octx, k)
	if err != nil {
		err = fmt.Errorf("pgfence: advisory: liveness check failed: %w", err)
		k.failSession(octx, s, err, nil)
	}
	if k.ev != nil {
		k.ev.EndOp(octx, op, err)
		if err == nil {
			k.ev.Async(context.WithoutCancel(ctx), pgfence.Renewed{Lock: l.lock()})
		}
	}
	return l.Err()
}
