package leasetable

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pgfence/pgfence"
	"github.com/pgfence/pgfence/internal/hold"
)

type leaseState int

const (
	stateHeld leaseState = iota
	stateLost
	stateReleased
)

// Lease is a held lease: the right, while it lasts, to do the work its name
// protects, and a fencing token for guarded writes. The Locker renews it
// until it is released or lost. It satisfies [pgfence.Lease]. Its methods
// are safe for concurrent use, and Release is safe on a nil *Lease.
type Lease struct {
	k         *Locker
	name      string
	token     int64
	secret    string // proves ownership to pgfence's functions
	timing    leaseTiming
	ctx       context.Context
	cancel    context.CancelCauseFunc
	values    context.Context // the acquiring ctx's values, without its cancellation
	grantedAt time.Time       // local time of the grant, for HeldFor

	releaseMu sync.Mutex // serialises Release calls

	// Guarded by k.mu.
	state      leaseState
	acquiredAt time.Time     // database time of acquisition
	deadline   time.Time     // local deadline: last request sent + TTL (or what a hand-over left) - margin
	nextRenew  time.Time     // when the watchdog renews it next
	timer      *time.Timer   // fires at deadline
	inflight   chan struct{} // closed when the renewal including it ends
	dbReleased bool          // the release statement reached a definite outcome
	wasHeld    bool          // a Release ended it while held
	retrying   chan struct{} // closed when the background release retry ends
	retryErr   error         // its last error, once retrying is closed
	renewFails int           // consecutive failed renewal attempts
	adopted    bool          // handed out (renewed by the watchdog)
	maxTimer   *time.Timer   // fires at MaxHold

	endedAtMax atomic.Bool // released at MaxHold; the next Release reports it
}

var _ pgfence.Lease = (*Lease)(nil)

func (k *Locker) newLease(ctx context.Context, name string, rep acquireReply, t leaseTiming) *Lease {
	// The lease is good for the TTL from when its request was sent, or for
	// what the database says is left of it when that is less: a permit
	// handed over keeps its last holder's expiry (migration 000009), and a
	// grant a claim call finds was made before the call was sent. It is
	// renewed as a lease acquired that much earlier.
	short := max(t.ttl-rep.expiresAt.Sub(rep.dbNow), 0)
	l := &Lease{
		k:          k,
		values:     context.WithoutCancel(ctx),
		grantedAt:  time.Now(),
		name:       name,
		token:      rep.token,
		secret:     rep.secret,
		timing:     t,
		acquiredAt: rep.acquiredAt,
		deadline:   rep.sent.Add(t.ttl - short - t.margin),
		nextRenew:  rep.sent.Add(t.renewEvery - short),
	}
	l.ctx, l.cancel = context.WithCancelCause(hold.Mark(context.Background(), k, name, l))
	return l
}

// adopt starts renewing l. It reports false when the Locker was closed.
func (k *Locker) adopt(l *Lease) bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.closed {
		return false
	}
	k.leases[l] = struct{}{}
	k.held[l.name] = l
	l.adopted = true
	l.timer = time.AfterFunc(time.Until(l.deadline), func() { k.checkDeadline(l) })
	if l.timing.maxHold > 0 {
		l.maxTimer = time.AfterFunc(time.Until(l.grantedAt.Add(l.timing.maxHold)), func() { k.maxHoldReached(l) })
	}
	if !k.watchdogRunning {
		k.watchdogRunning = true
		k.background.Add(1)
		go k.watchdog()
	} else {
		select {
		case k.watchdogWake <- struct{}{}:
		default:
		}
	}
	return true
}

// lock identifies l in events.
func (l *Lease) lock() pgfence.Lock {
	return pgfence.Lock{Kind: pgfence.StrategyLeaseTable, Name: l.name, Token: l.token}
}

// Name returns the lease name.
func (l *Lease) Name() string { return l.name }

// Token returns the lease's fencing token, larger than every earlier token
// of the name. Present it to guarded writes (package fence).
func (l *Lease) Token() int64 { return l.token }

// Secret returns the secret that proves this acquisition to lease-checked
// writes. Hand it only to code acting for this holder.
func (l *Lease) Secret() pgfence.Secret { return pgfence.NewSecret(l.secret) }

// AcquiredAt returns when the lease was acquired, on the database clock.
func (l *Lease) AcquiredAt() time.Time { return l.acquiredAt }

// Expiry returns the lease's local deadline, on the local clock: the last
// successful acquire or renewal request's send time, plus the TTL (for a
// permit handed over by its last holder's release, what was left of that
// holder's lease, when less), minus the safety margin. Unless renewed
// first, the lease is lost then.
func (l *Lease) Expiry() time.Time {
	l.k.mu.Lock()
	defer l.k.mu.Unlock()
	return l.deadline
}

// Done returns a channel that is closed when the lease is lost or released.
func (l *Lease) Done() <-chan struct{} { return l.ctx.Done() }

// Context returns a context, not derived from Acquire's, that is cancelled
// when the lease is lost (cause matching [pgfence.ErrLeaseLost]) or
// released ([pgfence.ErrNotHeld]). Derive the protected work's contexts
// from it: an Acquire of the name under it returns [pgfence.ErrAlreadyHeld].
func (l *Lease) Context() context.Context { return l.ctx }

// Err returns nil while the lease is held. After a loss it returns an error
// matching [pgfence.ErrLeaseLost] and its cause: [pgfence.ErrLeaseExpired],
// [pgfence.ErrLeaseTakenOver] or [pgfence.ErrClosed]; after a Release, one
// matching [pgfence.ErrNotHeld].
func (l *Lease) Err() error { return context.Cause(l.ctx) }

// checkDeadline runs when l's deadline timer fires: renewals move the
// deadline without resetting the timer, so it re-arms itself.
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
		"pgfence: leasetable: lease %q (token %d): no successful renewal before the local deadline: %w",
		l.name, l.token, pgfence.ErrLeaseExpired))
}

// endLocked ends a held lease, lost or released, and wakes the name's
// waiters of this Locker. k.mu is held.
func (k *Locker) endLocked(l *Lease, state leaseState, cause error) {
	if l.state != stateHeld {
		return
	}
	l.state = state
	if l.timer != nil {
		l.timer.Stop()
	}
	if l.maxTimer != nil {
		l.maxTimer.Stop()
	}
	delete(k.leases, l)
	if k.held[l.name] == l {
		delete(k.held, l.name)
	}
	l.cancel(cause)
	for w := range k.waiters[l.name] {
		w.wake()
	}
	k.wakePermitWaitersLocked(l.name)
	if state == stateLost {
		k.cfg.Logger.WarnContext(l.values, "pgfence: leasetable: lease lost", append(logAttrs(l), "cause", cause)...)
		k.nLost.Add(1)
		if k.ev.Enabled() {
			k.ev.Async(l.values, pgfence.Lost{Lock: l.lock(), HeldFor: time.Since(l.grantedAt), Cause: cause})
		}
	}
}

var errLostClosed = fmt.Errorf("%w: %w", pgfence.ErrLeaseLost, pgfence.ErrClosed)

// logAttrs are the log attributes describing a lease.
func logAttrs(l *Lease) []any {
	return []any{slog.String("lease", l.name), slog.Int64("token", l.token)}
}
