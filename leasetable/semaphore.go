package leasetable

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence"
	"github.com/pgfence/pgfence/internal/hold"
	"github.com/pgfence/pgfence/internal/install"
)

// MaxPermits is the largest number of permits a semaphore may have.
const MaxPermits = 1024

// MaxSemaphoreNameLength is the longest semaphore name, in bytes: a
// permit's lease name adds a separator and the slot number.
const MaxSemaphoreNameLength = MaxNameLength - 5

// PermitSeparator separates a semaphore's name from a permit's slot number
// in the permit's lease name. Lease names cannot contain it.
const PermitSeparator = "\x1f"

// ErrPermitsMismatch is returned when a semaphore is asked for with another
// number of permits than the one recorded for its name while a permit of it
// is held. With no permit held, the new number replaces the recorded one.
var ErrPermitsMismatch = errors.New("pgfence: leasetable: the semaphore has another number of permits")

// permitSQL takes one permit (%[1]s is the schema) through the SECURITY
// DEFINER pgfence_acquire_permit. $1 semaphore, $2 permits, $3 owner, $4
// TTL in microseconds, $5 whether the caller holds the semaphore's line
// (line.go).
const permitSQL = `SELECT acquired, name, owner, fence, acquired_at, expires_at, db_now, secret, permits, busy, queued
FROM %[1]s.pgfence_acquire_permit($1, $2, $3, $4, $5)`

// PermitName returns the lease name of permit slot (0 to permits-1) of
// semaphore: the name, [PermitSeparator], and the slot in decimal.
func PermitName(semaphore string, slot int) string {
	return semaphore + PermitSeparator + strconv.Itoa(slot)
}

// SplitPermit returns the semaphore and slot of a permit's lease name, and
// ok false for any other lease name.
func SplitPermit(leaseName string) (semaphore string, slot int, ok bool) {
	sem, s, found := strings.Cut(leaseName, PermitSeparator)
	if !found || sem == "" {
		return "", 0, false
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 0 || n >= MaxPermits || strconv.Itoa(n) != s {
		return "", 0, false
	}
	return sem, n, true
}

// semaphoreKey is the name under which a semaphore's waiters wait and its
// release notifications are tagged; no lease name equals it.
func semaphoreKey(semaphore string) string { return semaphore + PermitSeparator }

// wakePermitWaitersLocked wakes the waiters of the semaphore whose permit
// is the lease name, if it is one. k.mu is held.
func (k *Locker) wakePermitWaitersLocked(name string) {
	if sem, _, ok := SplitPermit(name); ok {
		for w := range k.waiters[semaphoreKey(sem)] {
			w.wake()
		}
	}
}

// TryAcquirePermit takes one of the permits permits (1 to [MaxPermits]) of
// the semaphore name, if one is free or expired, in one round trip. The
// permit is a *[Lease] named [PermitName](name, slot) with its own fencing
// token, renewed, lost and released like any lease; opts as for
// [Locker.TryAcquire]. Transient errors are retried for at most
// [Config].QueryTimeout.
//
// It returns an error matching [pgfence.ErrNotAcquired] when all permits
// are held or claimed, or callers wait for one (it does not go ahead of
// them); [ErrPermitsMismatch] when name has another number of
// permits and one is held; [pgfence.ErrAlreadyHeld] when ctx descends from
// a permit of name; [pgfence.ErrUnavailable], [pgfence.ErrClosed] and
// other errors as TryAcquire does. Bad arguments are refused before
// anything is sent.
func (k *Locker) TryAcquirePermit(ctx context.Context, name string, permits int, opts *AcquireOpts) (pgfence.Lease, error) {
	l, err := k.observePermit(ctx, name, permits, opts, false)
	if err != nil {
		return nil, err
	}
	return l, nil
}

// AcquirePermit takes one of the permits permits of the semaphore name like
// [Locker.TryAcquirePermit], waiting while all are held, until one is taken
// or ctx (or opts.WaitTimeout) ends. A release of any permit, from any
// Locker, wakes it through LISTEN/NOTIFY; an expiry, at the earliest held
// permit's expiry. Waiting calls form one line across Lockers: those of
// one Locker in the order they began to wait, the Lockers in turn, in the
// order they joined the database's line (a session connection of the
// Locker's own, while its LISTEN connection listens); callers that do not
// wait cannot go ahead of them. See docs/semaphores.md, Fairness.
//
// It returns the errors of [Locker.Acquire], and [ErrPermitsMismatch] at
// once.
func (k *Locker) AcquirePermit(ctx context.Context, name string, permits int, opts *AcquireOpts) (pgfence.Lease, error) {
	l, err := k.observePermit(ctx, name, permits, opts, true)
	if err != nil {
		return nil, err
	}
	return l, nil
}

// observePermit validates a permit acquire and runs it, as one operation
// for the Observer, counting its outcome in Stats.
func (k *Locker) observePermit(ctx context.Context, name string, permits int, opts *AcquireOpts, wait bool) (*Lease, error) {
	op := pgfence.Op{Kind: pgfence.OpAcquire, Strategy: pgfence.StrategyLeaseTable, Name: name, Batch: 1}
	ls, err := k.observed(ctx, op, []string{name}, func() (leaseTiming, error) { return k.preparePermit(ctx, name, permits, opts) },
		func(ctx context.Context, t leaseTiming, attempts *int) ([]*Lease, error) {
			if !wait {
				return one(k.tryPermit(ctx, name, permits, t, attempts))
			}
			return one(k.waitPermit(ctx, name, permits, t, opts, attempts))
		})
	if err != nil {
		return nil, err
	}
	return ls[0], nil
}

// checkPermits rejects a semaphore name or permit count the function would.
func checkPermits(name string, permits int) error {
	if err := checkText("semaphore name", name); err != nil {
		return err
	}
	if len(name) > MaxSemaphoreNameLength {
		return fmt.Errorf("pgfence: leasetable: semaphore name is %d bytes long; at most %d are allowed", len(name), MaxSemaphoreNameLength)
	}
	if permits < 1 || permits > MaxPermits {
		return fmt.Errorf("pgfence: leasetable: a semaphore has 1 to %d permits, not %d", MaxPermits, permits)
	}
	return nil
}

// checkForceName validates a lease name, or a permit's, to force-release
// or read (Get).
func checkForceName(name string) error {
	if sem, _, ok := SplitPermit(name); ok {
		return checkPermits(sem, 1)
	}
	return checkText("lease name", name)
}

// preparePermit validates a permit acquire and returns the permit's timing.
func (k *Locker) preparePermit(ctx context.Context, name string, permits int, opts *AcquireOpts) (leaseTiming, error) {
	if err := ctx.Err(); err != nil {
		if cause := context.Cause(ctx); cause != err {
			err = fmt.Errorf("%w: %w", cause, err)
		}
		return leaseTiming{}, fmt.Errorf("pgfence: leasetable: acquire permit of %q: %w", name, err)
	}
	if err := checkPermits(name, permits); err != nil {
		return leaseTiming{}, err
	}
	t, err := k.cfg.timing(opts)
	if err != nil {
		return leaseTiming{}, err
	}
	for s := range permits {
		if hold.Held(ctx, k, PermitName(name, s)) {
			return leaseTiming{}, fmt.Errorf("pgfence: leasetable: permit %d of semaphore %q: %w", s, name, pgfence.ErrAlreadyHeld)
		}
	}
	return t, k.checkOpen()
}

// tryPermit is TryAcquirePermit's attempt, retried while QueryTimeout lasts.
func (k *Locker) tryPermit(ctx context.Context, name string, permits int, t leaseTiming, attempts *int) (*Lease, error) {
	var l *Lease
	var queued bool
	err := k.retrying(ctx, fmt.Sprintf("acquire permit of %q", name), name, func() (err error) {
		l, _, queued, err = k.permitAttempt(ctx, name, permits, t, false, attempts)
		return err
	}, func(err error) error { return permitError(name, err) })
	switch {
	case err != nil:
		return nil, err
	case queued:
		return nil, fmt.Errorf("pgfence: leasetable: semaphore %q: callers are waiting for a permit: %w", name, pgfence.ErrNotAcquired)
	case l == nil:
		return nil, fmt.Errorf("pgfence: leasetable: semaphore %q: all %d permits are held: %w", name, permits, pgfence.ErrNotAcquired)
	}
	return l, nil
}

// waitPermit is AcquirePermit's loop, as waitAcquire's: only the head of
// the semaphore's line retries; the others wait their turn.
func (k *Locker) waitPermit(ctx context.Context, name string, permits int, t leaseTiming, opts *AcquireOpts, attempts *int) (*Lease, error) {
	loop := k.newWaitLoop(ctx, opts, fmt.Sprintf("acquire permit of %q", name), name)
	defer loop.stop()
	ctx = loop.ctx
	key := semaphoreKey(name)
	w, err := k.addWaiter(key)
	if err != nil {
		return nil, err
	}
	defer k.removeWaiter(key, w)
	// contended: callers of this Locker waited before this one, so an
	// attempt outside the database's line would be refused while they
	// wait there: the call goes to the line at once (the claim call takes
	// a permit that is free).
	contended := false
	if k.lines.Members(key) > 0 {
		// Callers wait: no barging in ahead of them.
		if _, err := loop.headOf(key); err != nil {
			return nil, err
		}
		contended = true
	}
	// The head of the Locker's line waits in the database's (line.go), so
	// that callers of other Lockers are served in turn with it, and there
	// claims the next permit released (handover.go).
	var dbLine *lineHold
	adopted := false
	defer func() {
		if dbLine != nil {
			dbLine.leave(!adopted)
		}
	}()
	final := func(err error) error { return permitError(name, err) }
	for {
		if dbLine == nil && contended && k.lineOn() {
			if dbLine, err = k.enterLine(ctx, name); err != nil {
				if _, err = loop.next(err, 0, final); err != nil {
					return nil, err
				}
				contended = false // try outside the line, then queue again
			}
		}
		var l *Lease
		var retryIn time.Duration
		if dbLine != nil && dbLine.claim != nil {
			// At the head of the line: the claim call returns a permit
			// granted to the claim, takes a free one, or registers the
			// claim for the next release.
			l, retryIn, err = k.claimAttempt(ctx, dbLine, permits, t, attempts)
			if err != nil {
				// The line connection may be gone, and its session's place
				// with it: leave (giving back what the claim may have been
				// granted) and queue again.
				dbLine.leave(true)
				dbLine = nil
			}
		} else {
			l, retryIn, _, err = k.permitAttempt(ctx, name, permits, t, dbLine != nil, attempts)
		}
		if retryIn, err = loop.next(err, retryIn, final); err != nil {
			return nil, err
		}
		if l != nil {
			adopted = true
			return l, nil
		}
		if waited, err := loop.headOf(key); err != nil {
			return nil, err
		} else if waited {
			contended = true
			continue
		}
		if dbLine == nil && k.lineOn() {
			// Refused: join the database's line, then try again at once
			// (a permit may have come free meanwhile).
			dbLine, err = k.enterLine(ctx, name)
			if err == nil {
				continue
			}
			if retryIn, err = loop.next(err, 0, final); err != nil {
				return nil, err
			}
		}
		k.listenFor(w)
		g, handed, err := loop.sleepOrGrant(w.ch, dbLine.grants(), retryIn)
		if err != nil {
			return nil, err
		}
		if handed {
			l, err := k.adoptHanded(ctx, dbLine, g, t)
			if _, err = loop.next(err, 0, final); err != nil {
				return nil, err
			}
			if l != nil {
				adopted = true
				return l, nil
			}
		}
	}
}

// permitError prefixes an error of a permit acquire of name.
func permitError(name string, err error) error {
	if errors.Is(err, pgfence.ErrClosed) || errors.Is(err, errLateGrant) || errors.Is(err, ErrPermitsMismatch) {
		return err
	}
	return fmt.Errorf("pgfence: leasetable: acquire permit of %q: %w", name, err)
}

// permitAttempt sends one pgfence_acquire_permit, as the head of the
// semaphore's line when inLine. It returns the permit when taken, else
// when to try again, and queued when callers wait in the line.
func (k *Locker) permitAttempt(ctx context.Context, name string, permits int, t leaseTiming, inLine bool, attempts *int) (l *Lease, retryIn time.Duration, queued bool, err error) {
	*attempts++
	back, err := k.startGrant()
	if err != nil {
		return nil, 0, false, err
	}
	defer back()
	var (
		rep       acquireReply
		pname     *string
		recorded  int
		expiresAt *time.Time
	)
	err = k.grantStatement(ctx, t, func(qctx context.Context, c *pgxpool.Conn) error {
		var owner, secret *string
		var token *int64
		var acquiredAt *time.Time
		rep.sent = time.Now()
		err := c.QueryRow(qctx, k.sql.permit, name, permits, k.cfg.Owner, t.ttl.Microseconds(), inLine).Scan(
			&rep.acquired, &pname, &owner, &token, &acquiredAt, &expiresAt, &rep.dbNow, &secret, &recorded, &rep.busy, &queued)
		if err != nil || !rep.acquired {
			return err
		}
		if pname == nil || owner == nil || token == nil || acquiredAt == nil || expiresAt == nil || secret == nil {
			return fmt.Errorf("pgfence_acquire_permit granted %q without a token or secret", name)
		}
		rep.owner, rep.token, rep.acquiredAt, rep.expiresAt, rep.secret = *owner, *token, *acquiredAt, *expiresAt, *secret
		return nil
	})
	if err != nil {
		return nil, 0, false, err
	}
	l, retryIn, err = k.permitReply(ctx, name, permits, t, rep, pname, recorded, expiresAt, queued)
	return l, retryIn, queued, err
}

// permitReply makes the answer of a permit attempt (pgfence_acquire_permit
// or pgfence_claim_permit) the permit taken, or says when to try again:
// soon when another transaction was taking a slot or callers wait in the
// line (queued; waitPermit joins it when it can), else at the earliest
// held permit's expiry. A count other than permits recorded while a permit
// is held is ErrPermitsMismatch.
func (k *Locker) permitReply(ctx context.Context, name string, permits int, t leaseTiming, rep acquireReply, pname *string, recorded int, expiresAt *time.Time, queued bool) (*Lease, time.Duration, error) {
	switch {
	case rep.acquired:
		l, err := k.adoptGrant(ctx, *pname, rep, t)
		return l, 0, err
	case recorded != permits:
		return nil, 0, fmt.Errorf("pgfence: leasetable: semaphore %q was asked for with %d permits, but has %d and one is held: %w",
			name, permits, recorded, ErrPermitsMismatch)
	case queued || rep.busy || expiresAt == nil:
		return nil, jitter(10*time.Millisecond, 50*time.Millisecond), nil
	}
	wait := min(max(expiresAt.Sub(rep.dbNow), 0), MaxTTL)
	return nil, wait + jitter(time.Millisecond, expiryJitter), nil
}

// startGrant registers a statement that may grant leases, so that Close
// waits for its grants to be adopted or given back. It returns
// [pgfence.ErrClosed] after Close.
func (k *Locker) startGrant() (done func(), err error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.closed {
		return nil, pgfence.ErrClosed
	}
	k.background.Add(1)
	return k.background.Done, nil
}

// grantStatement runs fn on a pool connection. Once sent, the statement
// runs to its answer for at most QueryTimeout after ctx ended (and never
// past the TTL, after which a grant is useless), so that every lease it
// took is known and can be given back.
func (k *Locker) grantStatement(ctx context.Context, t leaseTiming, fn func(context.Context, *pgxpool.Conn) error) (err error) {
	defer func() { err = install.WrapPermission(err, "", k.cfg.Schema) }()
	conn, err := k.conn(ctx, "acquire", k.cfg.QueryTimeout, false)
	if err != nil {
		return err
	}
	defer conn.Release()
	qctx, done := k.grantContext(ctx, t)
	defer done()
	err = fn(qctx, conn)
	if err != nil {
		k.discardStale(conn, err)
	}
	return err
}

// grantContext is the context of a statement that may grant leases: it
// ends QueryTimeout after ctx does, and at the TTL at the latest.
func (k *Locker) grantContext(ctx context.Context, t leaseTiming) (context.Context, func()) {
	qctx, qcancel := context.WithTimeout(context.WithoutCancel(ctx), t.ttl)
	var graceMu sync.Mutex
	var grace *time.Timer
	stop := context.AfterFunc(ctx, func() {
		graceMu.Lock()
		defer graceMu.Unlock()
		grace = time.AfterFunc(k.cfg.QueryTimeout, qcancel)
	})
	return qctx, func() {
		stop()
		graceMu.Lock()
		if grace != nil {
			grace.Stop()
		}
		graceMu.Unlock()
		qcancel()
	}
}

// adoptGrant makes a granted row a held *Lease, or gives it back when its
// caller left, the Locker closed, or it came past its local deadline.
func (k *Locker) adoptGrant(ctx context.Context, name string, rep acquireReply, t leaseTiming) (*Lease, error) {
	back := []giveBackReq{{ctx, name, rep.token, rep.secret}}
	if err := ctx.Err(); err != nil {
		k.giveBack(back)
		return nil, err
	}
	l := k.newLease(ctx, name, rep, t)
	if !time.Now().Before(l.deadline) {
		k.giveBack(back)
		return nil, fmt.Errorf("pgfence: leasetable: lease %q (token %d) was granted %v after the acquire was sent, past its local deadline (TTL %v less margin %v); given back: %w: %w",
			name, rep.token, time.Since(rep.sent).Round(time.Millisecond), t.ttl, t.margin, errLateGrant, pgfence.ErrNotAcquired)
	}
	if !k.adopt(l) {
		l.cancel(errLostClosed)
		k.giveBack(back)
		return nil, fmt.Errorf("pgfence: leasetable: acquire %q: %w", name, pgfence.ErrClosed)
	}
	k.cfg.Logger.DebugContext(ctx, "pgfence: leasetable: acquired", "lease", name, "token", rep.token, "ttl", t.ttl)
	return l, nil
}
