package leasetable

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	"github.com/pgfence/pgfence"
	"github.com/pgfence/pgfence/internal/hold"
	"github.com/pgfence/pgfence/internal/install"
)

// acquireSQL takes a batch of leases (%[1]s is the schema) through the
// SECURITY DEFINER pgfence_acquire: for each name, in name order, it inserts
// the row or takes over an expired one under a fresh token. It returns one
// row per name, the new lease or the holder; none when the holder committed
// after the statement's snapshot. $1 names (distinct), $2 owner, $3 TTLs in
// microseconds.
const acquireSQL = `SELECT acquired, name, owner, fence, acquired_at, expires_at, db_now, secret FROM %[1]s.pgfence_acquire($1, $2, $3)`

// expiryJitter bounds the random delay a waiter adds to the holder's
// expiry, so that the waiters of several Lockers do not retry at once.
const expiryJitter = 5 * time.Millisecond

// TryAcquire takes the lease name if it is free or expired, in one round
// trip, and returns at once. ctx covers the acquiring statement only, not
// the lease's lifetime; a lease granted after ctx ended is given back.
// Transient errors (a failover) are retried for at most [Config].QueryTimeout.
//
// It returns an error matching [pgfence.ErrNotAcquired] when another owner,
// another caller of this Locker or another transaction holds or claims the
// name, or the grant came after its local deadline; [pgfence.ErrAlreadyHeld]
// when ctx descends from the lease's own context; [pgfence.ErrUnavailable]
// when the retries ran out; [context.DeadlineExceeded] when the pool gave no
// connection within QueryTimeout; [pgfence.ErrClosed] after Close; other
// errors wrapped. The returned [pgfence.Lease] is a *[Lease].
func (k *Locker) TryAcquire(ctx context.Context, name string, opts *AcquireOpts) (pgfence.Lease, error) {
	l, err := k.observeAcquire(ctx, name, opts, false)
	if err != nil {
		return nil, err
	}
	return l, nil
}

// Acquire takes the lease name, waiting while another owner holds it, until
// it is held or ctx ends. It wakes at the holder's release (through
// LISTEN/NOTIFY from other Lockers) or at its expiry, and retries transient
// errors while ctx and opts.WaitTimeout allow. The calls of one Locker are
// served about in the order they began to wait.
//
// It returns an error wrapping ctx's cause when ctx ends, and one matching
// [pgfence.ErrNotAcquired] and [context.DeadlineExceeded] when
// opts.WaitTimeout elapses, both also matching [pgfence.ErrUnavailable] when
// the last attempt failed transiently; [pgfence.ErrAlreadyHeld] and
// [pgfence.ErrClosed] as [Locker.TryAcquire] does; other errors at once.
func (k *Locker) Acquire(ctx context.Context, name string, opts *AcquireOpts) (pgfence.Lease, error) {
	l, err := k.observeAcquire(ctx, name, opts, true)
	if err != nil {
		return nil, err
	}
	return l, nil
}

// Do acquires the lease name like [Locker.Acquire], calls fn with it, and
// releases it when fn returns, unless fn released it. fn's context is also
// cancelled, with cause [pgfence.ErrLeaseLost], when the lease is lost.
//
// Do returns Acquire's error without calling fn; otherwise fn's error,
// joined with an error matching [pgfence.ErrLeaseLost] when the lease was
// lost before fn returned, and with the release's error.
func (k *Locker) Do(ctx context.Context, name string, opts *AcquireOpts, fn func(ctx context.Context, l pgfence.Lease) error) error {
	return hold.Do(ctx, k, name, "pgfence: leasetable", func(ctx context.Context) (pgfence.Lease, error) {
		return k.Acquire(ctx, name, opts)
	}, fn)
}

// observeAcquire validates an acquire and runs it, waiting or not, as one
// operation for the Observer, counting its outcome in Stats.
func (k *Locker) observeAcquire(ctx context.Context, name string, opts *AcquireOpts, wait bool) (*Lease, error) {
	op := pgfence.Op{Kind: pgfence.OpAcquire, Strategy: pgfence.StrategyLeaseTable, Name: name, Batch: 1}
	ls, err := k.observed(ctx, op, []string{name}, func() (leaseTiming, error) { return k.prepare(ctx, name, opts) },
		func(ctx context.Context, t leaseTiming, attempts *int) ([]*Lease, error) {
			if !wait {
				return one(k.tryAcquire(ctx, name, t, attempts))
			}
			return one(k.waitAcquire(ctx, name, t, opts, attempts))
		})
	if err != nil {
		return nil, err
	}
	return ls[0], nil
}

// prepare validates an acquire of name and returns the lease's timing.
func (k *Locker) prepare(ctx context.Context, name string, opts *AcquireOpts) (leaseTiming, error) {
	if err := ctx.Err(); err != nil {
		if cause := context.Cause(ctx); cause != err {
			err = fmt.Errorf("%w: %w", cause, err)
		}
		return leaseTiming{}, fmt.Errorf("pgfence: leasetable: acquire %q: %w", name, err)
	}
	if err := checkText("lease name", name); err != nil {
		return leaseTiming{}, err
	}
	t, err := k.cfg.timing(opts)
	if err != nil {
		return leaseTiming{}, err
	}
	if hold.Held(ctx, k, name) {
		return leaseTiming{}, fmt.Errorf("pgfence: leasetable: lease %q: %w", name, pgfence.ErrAlreadyHeld)
	}
	return t, k.checkOpen()
}

// tryAcquire is TryAcquire's attempt, retried while QueryTimeout lasts.
func (k *Locker) tryAcquire(ctx context.Context, name string, t leaseTiming, attempts *int) (*Lease, error) {
	var (
		l     *Lease
		local bool
	)
	err := k.retrying(ctx, fmt.Sprintf("acquire %q", name), name, func() (err error) {
		l, local, _, err = k.try(ctx, name, t, attempts, nil)
		return err
	}, func(err error) error { return acquireError(name, err) })
	switch {
	case err != nil:
		return nil, err
	case l == nil && local:
		return nil, fmt.Errorf("pgfence: leasetable: lease %q is held by another caller of this Locker: %w", name, pgfence.ErrNotAcquired)
	case l == nil:
		return nil, fmt.Errorf("pgfence: leasetable: lease %q: %w", name, pgfence.ErrNotAcquired)
	}
	return l, nil
}

// waitAcquire is Acquire's loop: an attempt, then a wait in the name's line
// for a wake-up or the retry time.
func (k *Locker) waitAcquire(ctx context.Context, name string, t leaseTiming, opts *AcquireOpts, attempts *int) (*Lease, error) {
	loop := k.newWaitLoop(ctx, opts, fmt.Sprintf("acquire %q", name), name)
	defer loop.stop()
	ctx = loop.ctx
	// Only the head of the line retries; the others stay registered (w), so
	// that the attempt a new head makes cannot miss a release.
	w, err := k.addWaiter(name)
	if err != nil {
		return nil, err
	}
	defer k.removeWaiter(name, w)
	final := func(err error) error { return acquireError(name, err) }
	for round := 0; ; round++ {
		if round > 0 && k.hooks != nil && k.hooks.onRound != nil {
			k.hooks.onRound()
		}
		l, _, retryIn, err := k.try(ctx, name, t, attempts, w)
		if retryIn, err = loop.next(err, retryIn, final); err != nil {
			return nil, err
		}
		if l != nil {
			return l, nil
		}
		if waited, err := loop.headOf(name); err != nil {
			return nil, err
		} else if waited {
			continue
		}
		if loop.unavailable == nil {
			k.cfg.Logger.DebugContext(ctx, "pgfence: leasetable: waiting for lease", "lease", name, "retry_in", retryIn)
		}
		k.listenFor(w)
		if err := loop.sleep(w.ch, retryIn); err != nil {
			return nil, err
		}
	}
}

// acquireError prefixes an error of an acquire of name.
func acquireError(name string, err error) error {
	if errors.Is(err, pgfence.ErrClosed) || errors.Is(err, errLateGrant) {
		return err // already says which lease
	}
	return fmt.Errorf("pgfence: leasetable: acquire %q: %w", name, err)
}

// attempt is an acquire statement in flight for one name, whose answer
// waiting calls of the Locker may share (see try).
type attempt struct {
	seq  uint64        // Locker.waiterSeq when it started
	done chan struct{} // closed when answered; then the fields below are set

	refused bool // not granted; local and retryIn are then try's answer
	local   bool
	retryIn time.Duration
}

// try runs one acquire attempt. It returns the lease when taken; otherwise
// local reports that another caller of this Locker holds it, and retryIn
// when to try again. A waiter (w not nil) registered before an attempt for
// name started shares that attempt's refusal instead of sending its own.
func (k *Locker) try(ctx context.Context, name string, t leaseTiming, attempts *int, w *waiter) (l *Lease, local bool, retryIn time.Duration, err error) {
	k.mu.Lock()
	for {
		if h, ok := k.held[name]; ok {
			// Its release wakes the waiters; retry at its deadline at the latest.
			retryIn = max(time.Until(h.deadline), time.Millisecond)
			k.mu.Unlock()
			return nil, true, retryIn, nil
		}
		a := k.attempts[name]
		if a == nil || w == nil || w.seq > a.seq || (k.hooks != nil && k.hooks.noShare) {
			break
		}
		k.mu.Unlock()
		select {
		case <-a.done:
		case <-ctx.Done():
			return nil, false, 0, ctx.Err()
		}
		if a.refused {
			return nil, a.local, a.retryIn, nil
		}
		k.mu.Lock()
	}
	a := &attempt{seq: k.waiterSeq, done: make(chan struct{})}
	if k.attempts[name] == nil {
		k.attempts[name] = a
	}
	k.mu.Unlock()
	defer func() {
		k.mu.Lock()
		if k.attempts[name] == a {
			delete(k.attempts, name)
		}
		k.mu.Unlock()
		close(a.done)
	}()
	l, local, retryIn, err = k.attempt(ctx, name, t, attempts)
	if l == nil && err == nil {
		a.refused, a.local, a.retryIn = true, local, retryIn
	}
	return l, local, retryIn, err
}

// attempt sends one acquire attempt for try.
func (k *Locker) attempt(ctx context.Context, name string, t leaseTiming, attempts *int) (l *Lease, local bool, retryIn time.Duration, err error) {
	*attempts++
	rep, err := k.submitAcquire(ctx, name, t)
	if err == nil && rep.acquired {
		defer k.granting.Done() // adopted or given back
	}
	if err == nil {
		err = rep.err
	}
	if err != nil && ctx.Err() == nil && k.closeCtx.Err() != nil {
		// Close cancelled the statement.
		return nil, false, 0, fmt.Errorf("pgfence: leasetable: acquire %q: %w", name, pgfence.ErrClosed)
	}
	if err != nil {
		return nil, false, 0, err // the caller says which lease
	}
	if !rep.found || rep.busy {
		// Committed after our snapshot, or claimed by another transaction.
		return nil, false, jitter(10*time.Millisecond, 50*time.Millisecond), nil
	}
	if !rep.acquired {
		k.noteHolder(name, rep.token)
		// Clamped, so that an expiry set by hand cannot overflow the wait.
		wait := min(max(rep.expiresAt.Sub(rep.dbNow), 0), MaxTTL)
		return nil, rep.owner == k.cfg.Owner, wait + jitter(time.Millisecond, expiryJitter), nil
	}
	l = k.newLease(ctx, name, rep, t)
	if !time.Now().Before(l.deadline) {
		// Past its local deadline: never handed out already lost.
		k.giveBack([]giveBackReq{{ctx, name, rep.token, rep.secret}})
		return nil, false, 0, fmt.Errorf("pgfence: leasetable: lease %q (token %d) was granted %v after the acquire was sent, past its local deadline (TTL %v less margin %v); given back: %w: %w",
			name, rep.token, time.Since(rep.sent).Round(time.Millisecond), t.ttl, t.margin, errLateGrant, pgfence.ErrNotAcquired)
	}
	if !k.adopt(l) {
		l.cancel(errLostClosed)
		k.giveBack([]giveBackReq{{ctx, name, rep.token, rep.secret}})
		return nil, false, 0, fmt.Errorf("pgfence: leasetable: acquire %q: %w", name, pgfence.ErrClosed)
	}
	k.cfg.Logger.DebugContext(ctx, "pgfence: leasetable: acquired", "lease", name, "token", rep.token, "ttl", t.ttl)
	return l, false, 0, nil
}

// errLateGrant marks a grant that arrived after its local deadline.
var errLateGrant = errors.New("granted too late")

// jitter returns a random duration in [lo, hi).
func jitter(lo, hi time.Duration) time.Duration {
	if hi <= lo {
		return lo
	}
	return lo + rand.N(hi-lo)
}

// acquireReq is one caller's request to acquire a lease.
type acquireReq struct {
	ctx   context.Context
	name  string
	ttlUs int64

	mu        sync.Mutex
	abandoned bool              // the caller stopped waiting
	res       chan acquireReply // buffered(1)
}

// acquireReply is the outcome of one acquire request.
type acquireReply struct {
	found                 bool // a row came back
	busy                  bool // another transaction claims the name or locks its row
	acquired              bool
	owner                 string
	token                 int64
	secret                string // the acquisition's secret, when acquired
	acquiredAt, expiresAt time.Time
	dbNow                 time.Time
	sent                  time.Time // when the statement was sent
	err                   error
}

// submitAcquire runs one acquire through the Locker's batcher and waits for
// the reply or the end of ctx.
func (k *Locker) submitAcquire(ctx context.Context, name string, t leaseTiming) (acquireReply, error) {
	r := &acquireReq{ctx: ctx, name: name, ttlUs: t.ttl.Microseconds(), res: make(chan acquireReply, 1)}
	k.acquires.submit(r)
	select {
	case rep := <-r.res:
		return rep, nil
	case <-ctx.Done():
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	select {
	case rep := <-r.res:
		return rep, nil
	default:
		r.abandoned = true
		return acquireReply{}, ctx.Err()
	}
}

// execAcquires runs acquireSQL for batch and answers each request; on a
// statement error it answers none and returns the error. Once sent, the
// statement runs to its answer for at most QueryTimeout after its last
// caller left or Close began, so that every lease it took is known.
func (k *Locker) execAcquires(batch []*acquireReq) (err error) {
	defer func() { err = install.WrapPermission(err, "", k.cfg.Schema) }() // names the missing grant
	// One entry per name; later requests find it held (see replyAcquires).
	names := make([]string, 0, len(batch))
	ttls := make([]int64, 0, len(batch))
	seen := make(map[string]bool, len(batch))
	ctxs := make([]context.Context, 0, len(batch))
	for _, r := range batch {
		ctxs = append(ctxs, r.ctx)
		if !seen[r.name] {
			seen[r.name] = true
			names = append(names, r.name)
			ttls = append(ttls, r.ttlUs)
		}
	}
	values := batch[0].ctx
	if k.ev.Enabled() && len(batch) > 1 {
		op := pgfence.Op{Kind: pgfence.OpAcquire, Strategy: pgfence.StrategyLeaseTable, Batch: len(batch), Links: ctxs[1:]}
		if len(names) == 1 {
			op.Name = names[0]
		}
		values = k.ev.StartOp(values, op)
		defer func() { k.ev.EndOp(values, op, err) }()
	}
	ctx, cancel := batchContext(k.closeCtx, values, ctxs)
	defer cancel()
	conn, err := k.conn(ctx, "acquire", k.cfg.QueryTimeout, false)
	if err != nil {
		return err
	}
	defer conn.Release()
	// An answer after the longest TTL would be given back anyway.
	qctx, qcancel := context.WithTimeout(context.WithoutCancel(ctx), time.Duration(slices.Max(ttls))*time.Microsecond)
	defer qcancel()
	if k.hooks != nil && k.hooks.noGrantWait {
		defer context.AfterFunc(k.closeCtx, qcancel)()
	}
	var graceMu sync.Mutex
	var grace *time.Timer
	stopAbandon := context.AfterFunc(ctx, func() {
		graceMu.Lock()
		defer graceMu.Unlock()
		grace = time.AfterFunc(k.cfg.QueryTimeout, qcancel)
	})
	defer func() {
		stopAbandon()
		graceMu.Lock()
		defer graceMu.Unlock()
		if grace != nil {
			grace.Stop()
		}
	}()
	sent := time.Now()
	rows, err := conn.Query(qctx, k.sql.acquire, names, k.cfg.Owner, ttls)
	if err != nil {
		k.discardStale(conn, err)
		return err
	}
	got := make(map[string]acquireReply, len(names))
	for rows.Next() {
		var (
			rep                   acquireReply
			name                  string
			owner, secret         *string
			token                 *int64
			acquiredAt, expiresAt *time.Time
		)
		if err := rows.Scan(&rep.acquired, &name, &owner, &token, &acquiredAt, &expiresAt, &rep.dbNow, &secret); err != nil {
			rows.Close()
			return err
		}
		rep.found = true
		if owner == nil || token == nil || acquiredAt == nil || expiresAt == nil {
			rep.busy = true
		} else {
			rep.owner, rep.token, rep.acquiredAt, rep.expiresAt = *owner, *token, *acquiredAt, *expiresAt
		}
		if rep.acquired {
			if secret == nil || rep.busy {
				rows.Close()
				return fmt.Errorf("pgfence_acquire granted %q without a token or secret", name)
			}
			rep.secret = *secret
		}
		got[name] = rep
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		k.discardStale(conn, err)
		return err
	}
	k.replyAcquires(batch, got, sent, nil)
	return nil
}

// replyAcquires answers every request in batch, with err or from got. Only
// the first request for a name gets got's answer; later ones find the lease
// held. A lease taken for a caller that left, or after Close began, is
// given back.
func (k *Locker) replyAcquires(batch []*acquireReq, got map[string]acquireReply, sent time.Time, err error) {
	var back []giveBackReq
	defer func() { k.giveBack(back) }()
	closed := k.closeCtx.Err() != nil
	for _, r := range batch {
		rep := acquireReply{err: err}
		if err == nil {
			rep = got[r.name]
			rep.sent = sent
			held := rep
			held.acquired = false
			got[r.name] = held
		}
		if closed && rep.acquired {
			back = append(back, giveBackReq{r.ctx, r.name, rep.token, rep.secret})
			rep = acquireReply{err: pgfence.ErrClosed}
		}
		r.mu.Lock()
		if !r.abandoned {
			if rep.acquired {
				k.granting.Add(1)
			}
			r.res <- rep
			r.mu.Unlock()
			continue
		}
		r.mu.Unlock()
		if rep.acquired {
			back = append(back, giveBackReq{r.ctx, r.name, rep.token, rep.secret})
		}
	}
}

// failAcquire answers one acquire request with err.
func (k *Locker) failAcquire(r *acquireReq, err error) {
	k.replyAcquires([]*acquireReq{r}, nil, time.Time{}, err)
}
