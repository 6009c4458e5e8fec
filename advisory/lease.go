package advisory

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/pgfence/pgfence"
)

// Package advisory honours these fields of [pgfence.AcquireOpts]:
//
//   - Shared takes the lock in shared mode (pg_advisory_lock_shared and
//     friends): any number of shared holders, or one exclusive holder.
//     Each shared holder gets its own fencing token.
//   - WaitTimeout bounds how long [Locker.Acquire], [Locker.Do] and
//     [Locker.AcquireTx] wait for the lock.
//
// TTL and AtLeast are rejected: an advisory lock lasts as long as its
// database session (or transaction), not for a time.
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
// closed, or until the database session holding it dies; then [Lease.Done]
// closes. It satisfies [pgfence.Lease]. Its methods are safe for concurrent
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

	// Guarded by l.mu.
	state    lockState
	reported bool // Release has returned the loss once
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
// the Locker is closed, it returns an error matching pgfence.ErrLeaseLost
// (and pgfence.ErrClosed for a closed Locker). After a successful
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
// pgfence.ErrNotHeld (and pgfence.ErrLeaseLost); it also does so when the
// session fails during the release (the session is closed, and the server
// releases the lock when it sees the connection end). Calling Release
// again, or concurrently, or on a nil *Lease, returns nil.
func (l *Lease) Release(ctx context.Context) error {
	if l == nil {
		return nil
	}
	k := l.k
	k.mu.Lock()
	switch l.state {
	case stateUnlocking, stateUnlocked:
		k.mu.Unlock()
		return nil
	case stateLost:
		return l.reportLostLocked()
	}
	l.state = stateUnlocking
	k.mu.Unlock()

	s := l.s
	s.sem <- struct{}{}
	defer func() { <-s.sem }()

	k.mu.Lock()
	if l.state == stateLost {
		return l.reportLostLocked()
	}
	k.mu.Unlock()

	// A lock held briefly unlocks without looking for waiters to notify:
	// see notifyAfterHeld.
	q := unlockSQL
	switch notify := time.Since(l.acquired) >= k.notifyHeld; {
	case l.shared && notify:
		q = unlockSharedNotifySQL
	case l.shared:
		q = unlockSharedSQL
	case notify:
		q = unlockNotifySQL
	}
	var released bool
	err := s.queryKey(ctx, k, q, l.key.id, &released)
	if err == nil && !released {
		err = errors.New("the server reports the lock was not held by the session")
	}
	if err != nil {
		// The session's state is unknown or wrong: drop it, with every
		// lock on it; the server releases them when the connection ends.
		k.failSession(s, err)
		k.mu.Lock()
		return l.reportLostLocked()
	}
	k.mu.Lock()
	l.state = stateUnlocked
	l.reported = true
	delete(s.locks, l)
	k.dropKeyRefLocked(l.key.id)
	l.cancel(errReleased)
	k.mu.Unlock()
	return nil
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
// pgfence.ErrLeaseLost). After a release or loss it returns [Lease.Err]
// without a round trip. ctx bounds the wait for the session; the check
// itself is bounded by Config.QueryTimeout, since cancelling it would close
// the session.
func (l *Lease) Renew(ctx context.Context) error {
	if err := l.Err(); err != nil {
		return err
	}
	k, s := l.k, l.s
	select {
	case s.sem <- struct{}{}:
	case <-ctx.Done():
		return fmt.Errorf("pgfence: advisory: renew %v: %w", l.key, context.Cause(ctx))
	}
	defer func() { <-s.sem }()
	if err := l.Err(); err != nil {
		return err
	}
	if err := s.ping(ctx, k); err != nil {
		k.failSession(s, fmt.Errorf("pgfence: advisory: liveness check failed: %w", err))
	}
	return l.Err()
}
