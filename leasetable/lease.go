package leasetable

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/pgfence/pgfence"
)

type leaseState int

const (
	stateHeld leaseState = iota
	stateLost
	stateReleased
)

// Lease is a held lease: the right, while it lasts, to do the work its name
// protects, and a fencing token to present to guarded writes. The Locker's
// watchdog renews it in the background until it is released or lost.
//
// The methods are safe for concurrent use.
type Lease struct {
	k      *Locker
	name   string
	token  int64
	timing leaseTiming
	ctx    context.Context
	cancel context.CancelCauseFunc

	releaseMu sync.Mutex // serialises Release calls

	// Guarded by k.mu.
	state      leaseState
	acquiredAt time.Time     // database time of acquisition
	deadline   time.Time     // local deadline: last request sent + TTL - margin
	nextRenew  time.Time     // when the watchdog renews it next
	timer      *time.Timer   // fires at deadline
	inflight   chan struct{} // closed when the renewal including it ends
	dbReleased bool          // the release statement reached a definite outcome
}

func (k *Locker) newLease(name string, token int64, acquiredAt, sent time.Time, t leaseTiming) *Lease {
	ctx, cancel := context.WithCancelCause(context.Background())
	return &Lease{
		k:          k,
		name:       name,
		token:      token,
		timing:     t,
		ctx:        ctx,
		cancel:     cancel,
		acquiredAt: acquiredAt,
		deadline:   sent.Add(t.ttl - t.margin),
		nextRenew:  sent.Add(t.renewEvery),
	}
}

// Name returns the lease name.
func (l *Lease) Name() string { return l.name }

// Token returns the lease's fencing token. Tokens come from one database
// sequence: every acquisition of any lease gets a larger token than every
// earlier acquisition of the same name. Present it to guarded writes (see
// package fence) so that a holder that lost the lease without noticing
// cannot overwrite a later holder's work.
func (l *Lease) Token() int64 { return l.token }

// AcquiredAt returns when the lease was acquired, on the database clock.
func (l *Lease) AcquiredAt() time.Time { return l.acquiredAt }

// Done returns a channel that is closed when the lease is lost or released.
// It is l.Context().Done().
func (l *Lease) Done() <-chan struct{} { return l.ctx.Done() }

// Context returns a context that is cancelled when the lease is lost, with a
// cause matching [pgfence.ErrLeaseLost], or released, with a cause matching
// [pgfence.ErrNotHeld]. It is not derived from the context given to Acquire.
// Derive the contexts of the protected work from it (or use [Locker.Do]).
func (l *Lease) Context() context.Context { return l.ctx }

// Err returns nil while the lease is held; after it was lost, an error
// matching [pgfence.ErrLeaseLost] that says why (also matching
// [pgfence.ErrClosed] when the Locker was closed); after a Release, an error
// matching [pgfence.ErrNotHeld].
func (l *Lease) Err() error { return context.Cause(l.ctx) }

var errReleased = fmt.Errorf("leasetable: lease was released: %w", pgfence.ErrNotHeld)

// Release gives the lease up: Done is closed, renewals stop, and the row is
// expired in place if this lease still holds it (owner and token match and it
// has not expired), which wakes waiters in other Lockers at once. With
// [AcquireOpts].AtLeast the row stays held until acquired_at + AtLeast.
//
// Release returns an error matching [pgfence.ErrNotHeld] when the lease was
// no longer held: it had been lost (locally or in the database). Then nothing
// belonging to another owner is changed. After one call returned nil or
// ErrNotHeld, later calls return nil. When the statement fails (for example
// the database is unreachable), the error is returned and a later call tries
// again; without one the lease simply expires after its TTL.
//
// Release runs under context.WithoutCancel(ctx) bounded by
// [Config].ReleaseTimeout, so it still works from a defer whose ctx has
// ended; ctx's values are kept.
func (l *Lease) Release(ctx context.Context) error {
	return l.release(ctx, errReleased)
}

func (l *Lease) release(ctx context.Context, cause error) error {
	l.releaseMu.Lock()
	defer l.releaseMu.Unlock()
	k := l.k
	k.mu.Lock()
	if l.dbReleased {
		k.mu.Unlock()
		return nil
	}
	wasHeld := l.state == stateHeld
	if wasHeld {
		k.endLocked(l, stateReleased, cause)
	}
	inflight := l.inflight
	k.mu.Unlock()

	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), k.cfg.ReleaseTimeout)
	defer cancel()
	if inflight != nil {
		// Let a renewal that includes this lease finish first, so that it
		// cannot extend the row after the release.
		select {
		case <-inflight:
		case <-ctx.Done():
			return fmt.Errorf("leasetable: release %q: waiting for a renewal: %w", l.name, ctx.Err())
		}
	}
	held, err := k.releaseRow(ctx, l.name, l.token, l.timing.atLeast)
	if err != nil {
		return fmt.Errorf("leasetable: release %q (token %d): %w", l.name, l.token, err)
	}
	notHeld := !held
	k.mu.Lock()
	l.dbReleased = true
	k.mu.Unlock()
	if notHeld || !wasHeld {
		return fmt.Errorf("leasetable: release %q (token %d): %w", l.name, l.token, pgfence.ErrNotHeld)
	}
	k.cfg.Logger.Debug("pgfence: leasetable: released", logAttrs(l)...)
	return nil
}

// endLocked ends a held lease: it is lost or released. k.mu must be held.
func (k *Locker) endLocked(l *Lease, state leaseState, cause error) {
	if l.state != stateHeld {
		return
	}
	l.state = state
	if l.timer != nil {
		l.timer.Stop()
	}
	delete(k.leases, l)
	l.cancel(cause)
	if state == stateLost {
		k.cfg.Logger.Warn("pgfence: leasetable: lease lost", append(logAttrs(l), "cause", cause)...)
	}
}

// checkDeadline runs when a lease's local deadline timer fires. Renewals move
// the deadline without resetting the timer, so it re-arms itself when the
// deadline has moved.
func (k *Locker) checkDeadline(l *Lease) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if l.state != stateHeld {
		return
	}
	if d := time.Until(l.deadline); d > 0 {
		l.timer.Reset(d)
		return
	}
	k.endLocked(l, stateLost, fmt.Errorf(
		"leasetable: lease %q (token %d): no successful renewal before the local deadline: %w",
		l.name, l.token, pgfence.ErrLeaseLost))
}
