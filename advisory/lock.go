package advisory

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/pgfence/pgfence"
)

// LockOpts are per-call options of the lock methods. A nil *LockOpts means
// the zero value: an exclusive lock, waited for until ctx ends.
type LockOpts struct {
	// Shared takes the lock in shared mode (pg_advisory_lock_shared and
	// friends): any number of shared holders, or one exclusive holder.
	// Each shared holder gets its own fencing token.
	Shared bool

	// WaitTimeout, when positive, bounds how long [Locker.Lock],
	// [Locker.Do] and [LockTx] wait for the lock; when it runs out they
	// return an error matching pgfence.ErrNotAcquired. Zero means wait
	// until ctx ends. The non-blocking calls ignore it.
	WaitTimeout time.Duration
}

// lockState is where a Lock is in its life; guarded by Locker.mu.
type lockState int

const (
	stateHeld      lockState = iota
	stateUnlocking           // Unlock is running
	stateUnlocked            // Unlock succeeded
	stateLost                // its session died, or the Locker closed
)

// errUnlocked is the cause of a Lock's context after a successful Unlock.
var errUnlocked = fmt.Errorf("advisory: lock was unlocked: %w", pgfence.ErrNotHeld)

// Lock is a held session-level advisory lock, returned by [Locker.TryLock]
// and [Locker.Lock]. It stays held until [Lock.Unlock], until the Locker is
// closed, or until the database session holding it dies; then [Lock.Done]
// closes. Its methods are safe for concurrent use.
type Lock struct {
	l        *Locker
	s        *session
	key      Key
	shared   bool
	token    int64
	acquired time.Time // when granted, to choose the unlock statement
	ctx      context.Context
	cancel   context.CancelCauseFunc

	// Guarded by l.mu.
	state    lockState
	reported bool // Unlock has returned the loss once
}

// Key returns the lock's key.
func (lk *Lock) Key() Key { return lk.key }

// Shared reports whether the lock is held in shared mode.
func (lk *Lock) Shared() bool { return lk.shared }

// Token returns the fencing token drawn when the lock was granted. Tokens
// come from the sequence shared with the lease-table strategy, so the next
// holder of the same key (in any mode, through any Locker or transaction)
// gets a larger token; present it to fenced writes (package fence).
func (lk *Lock) Token() int64 { return lk.token }

// Done returns a channel that is closed when the lock ends: lost (its
// session died), released by [Lock.Unlock], or dropped by [Locker.Close].
// [Lock.Err] then says which.
func (lk *Lock) Done() <-chan struct{} { return lk.ctx.Done() }

// Err returns nil while the lock is held. Once it is lost, including when
// the Locker is closed, it returns an error matching pgfence.ErrLeaseLost
// (and pgfence.ErrClosed for a closed Locker). After a successful
// [Lock.Unlock] it returns an error matching pgfence.ErrNotHeld.
func (lk *Lock) Err() error { return context.Cause(lk.ctx) }

// Context returns a context that is cancelled when the lock ends, with
// [Lock.Err] as its cause (context.Cause). Derive the contexts of protected
// work from it, or use [Locker.Do], so that work stops when the lock is lost.
func (lk *Lock) Context() context.Context { return lk.ctx }

// Unlock releases the lock (pg_advisory_unlock on its session) and closes
// [Lock.Done].
//
// ctx is only used for its values, which reach the pgx tracer: Unlock
// usually runs deferred, after the caller's context ended, so it ignores
// ctx's cancellation. It waits for the
// statements queued before it on the same session, each bounded by
// Config.QueryTimeout.
//
// When the lock was already lost, Unlock returns an error matching
// pgfence.ErrNotHeld (and pgfence.ErrLeaseLost); it also does so when the
// session fails during the unlock (the session is closed, and the server
// releases the lock when it sees the connection end). Calling Unlock again,
// or concurrently, returns nil.
func (lk *Lock) Unlock(ctx context.Context) error {
	l := lk.l
	l.mu.Lock()
	switch lk.state {
	case stateUnlocking, stateUnlocked:
		l.mu.Unlock()
		return nil
	case stateLost:
		return lk.reportLostLocked()
	}
	lk.state = stateUnlocking
	l.mu.Unlock()

	s := lk.s
	s.sem <- struct{}{}
	defer func() { <-s.sem }()

	l.mu.Lock()
	if lk.state == stateLost {
		return lk.reportLostLocked()
	}
	l.mu.Unlock()

	// A lock held briefly unlocks without looking for waiters to notify:
	// see notifyAfterHeld.
	q := unlockSQL
	switch notify := time.Since(lk.acquired) >= l.notifyHeld; {
	case lk.shared && notify:
		q = unlockSharedNotifySQL
	case lk.shared:
		q = unlockSharedSQL
	case notify:
		q = unlockNotifySQL
	}
	var released bool
	err := s.queryKey(ctx, l, q, lk.key.id, &released)
	if err == nil && !released {
		err = errors.New("the server reports the lock was not held by the session")
	}
	if err != nil {
		// The session's state is unknown or wrong: drop it, with every
		// lock on it; the server releases them when the connection ends.
		l.failSession(s, err)
		l.mu.Lock()
		return lk.reportLostLocked()
	}
	l.mu.Lock()
	lk.state = stateUnlocked
	lk.reported = true
	delete(s.locks, lk)
	l.dropKeyRefLocked(lk.key.id)
	lk.cancel(errUnlocked)
	l.mu.Unlock()
	return nil
}

// reportLostLocked is Unlock's answer for a lost lock: the loss the first
// time, nil after. It is called with l.mu held and unlocks it.
func (lk *Lock) reportLostLocked() error {
	defer lk.l.mu.Unlock()
	if lk.reported {
		return nil
	}
	lk.reported = true
	return fmt.Errorf("advisory: unlock %v: %w: %w", lk.key, pgfence.ErrNotHeld, context.Cause(lk.ctx))
}
