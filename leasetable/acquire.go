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
	"github.com/pgfence/pgfence/internal/permerr"
	"github.com/pgfence/pgfence/internal/retry"
	"github.com/pgfence/pgfence/internal/waitline"
)

// acquireSQL takes a batch of leases in one statement (%[1]s is the
// schema), through pgfence_acquire, a SECURITY DEFINER function (the
// application role cannot write the table itself). For each name it
// inserts the missing row or takes over the row whose lease has expired
// (expires_at <= now(), database clock), drawing a fresh token under the
// row lock, in name order, so two batches over the same names cannot
// deadlock with each other. It returns one row per name: the new lease
// (true), or the current holder (false); no row when the holder committed
// after the statement's snapshot. A failed attempt on a held lease draws no
// token and locks nothing. Names must be distinct.
//
// $1 names, $2 owner, $3 TTLs in microseconds (parallel arrays).
const acquireSQL = `SELECT acquired, name, owner, fence, acquired_at, expires_at, db_now, secret FROM %[1]s.pgfence_acquire($1, $2, $3)`

// expiryJitter bounds the random delay a waiter adds to the holder's
// expiry before it retries, so that the waiters of several Lockers do not
// all retry in the same instant. Each such retry is one cheap statement
// (the waiters of one Locker share one), so a few milliseconds suffice; a
// waiter is late by at most that much plus a round trip.
const expiryJitter = 5 * time.Millisecond

// TryAcquire takes the lease name if it is free or expired, in one round
// trip, and returns at once. When another owner holds it, or another
// transaction is claiming it or holds its expired row locked, TryAcquire
// returns an error matching [pgfence.ErrNotAcquired]; when another caller of this
// Locker holds it, the same, at once and without a round trip; when ctx
// descends from the held lease's own context (the caller holds it), an
// error matching [pgfence.ErrAlreadyHeld]. A Locker never re-enters a name.
//
// ctx covers only the acquiring statement; the lease's lifetime is
// independent of it (see [Lease.Context]). If ctx ends while the statement
// is in flight, TryAcquire returns at once, but the statement is not
// cancelled: it runs on to its answer (for at most [Config].QueryTimeout
// more), and a lease it took is given back then, a round trip later. Only
// when the answer never comes (the database or the network failed) may
// such a lease stay held until its TTL ends. A ctx that has already ended
// sends nothing. A statement still
// unanswered a TTL after it was sent is cancelled in any case (its grant
// would come past the lease's local deadline), and counts as a transient
// error: a connection that died silently costs an attempt, not the wait.
//
// A transient database error (connection refused or reset, the server
// shutting down or starting, a read-only standby such as a demoted primary,
// a serialization failure: the database is failing over) is retried with
// capped, jittered backoff for at most [Config].QueryTimeout from the call
// (and while ctx lasts); when that runs out, TryAcquire returns an error
// matching [pgfence.ErrUnavailable] that wraps the last attempt's error.
// A lease whose grant arrives after its local deadline (the commit waited
// longer than the TTL, say for a synchronous standby) is never returned:
// it is given back, and TryAcquire returns an error matching
// [pgfence.ErrNotAcquired].
//
// Other errors: [pgfence.ErrClosed] after Close, an invalid name or opts
// (nothing written), an error matching [context.DeadlineExceeded] that
// says the pool is exhausted when it gave no connection within
// [Config].QueryTimeout (nothing sent), and other database errors
// (wrapped, not retried). The returned [pgfence.Lease] is a *[Lease].
func (k *Locker) TryAcquire(ctx context.Context, name string, opts *AcquireOpts) (pgfence.Lease, error) {
	l, err := k.observeAcquire(ctx, name, opts, false)
	if err != nil {
		return nil, err
	}
	return l, nil
}

// Acquire takes the lease name, waiting while another owner holds it, until
// it is held or ctx ends. While waiting it wakes when the holder releases
// the lease (at once when the holder is this Locker; through LISTEN/NOTIFY,
// within milliseconds, from other Lockers) and otherwise when the holder's
// lease is due to expire (plus a little jitter). Each attempt is the same
// single statement as [Locker.TryAcquire]. The calls of one Locker waiting
// for a lease are served about in the order they began to wait; across
// Lockers no order holds. The first Acquire opens the Locker's LISTEN
// connection, which stays open until [Locker.Close] but listens only while
// a call waits (and a second after).
//
// When ctx ends first, Acquire returns an error wrapping ctx's cause; when
// opts.WaitTimeout elapses first, an error matching [pgfence.ErrNotAcquired]
// and [context.DeadlineExceeded]. When ctx descends from the context of the
// lease it asks for (a nested [Locker.Do]), it returns at once with an
// error matching [pgfence.ErrAlreadyHeld]. After Close it returns
// [pgfence.ErrClosed].
//
// A transient database error (see [Locker.TryAcquire]: the database is
// failing over) is retried with capped, jittered backoff (from 25ms up to
// 500ms between attempts) for as long as ctx and opts.WaitTimeout allow.
// When the wait ends while the last attempt had failed that way, the error
// also matches [pgfence.ErrUnavailable] and wraps that attempt's error, in
// addition to what it matches as described above (ctx's cause, or
// ErrNotAcquired and DeadlineExceeded). A grant that arrives after its
// local deadline is given back and the wait goes on. Other database errors
// are returned at once (wrapped), and so is a wait for a pool connection
// that took longer than [Config].QueryTimeout (see [Locker.TryAcquire]).
// ctx does not bound the lease's lifetime. The returned [pgfence.Lease] is
// a *[Lease].
func (k *Locker) Acquire(ctx context.Context, name string, opts *AcquireOpts) (pgfence.Lease, error) {
	l, err := k.observeAcquire(ctx, name, opts, true)
	if err != nil {
		return nil, err
	}
	return l, nil
}

// Do acquires the lease name like [Locker.Acquire], calls fn with it, and
// releases it when fn returns. fn's context is derived from ctx and is also
// cancelled, with cause [pgfence.ErrLeaseLost], when the lease is lost while
// fn runs; fn must then stop its protected work promptly. fn may release
// the lease itself; Do then does not release it again. A Do nested in fn
// for the same name returns [pgfence.ErrAlreadyHeld] at once.
//
// Do returns the error from acquiring (and does not call fn); it matches
// [pgfence.ErrUnavailable] when the database stayed unavailable, as for
// Acquire. Otherwise it returns fn's error joined with the loss (an error
// matching [pgfence.ErrLeaseLost]) whenever the lease was lost before fn
// returned, since fn's work may not have been protected throughout, and
// joined with the release's error (the lease then expires after its TTL,
// unless the error matches ErrUnavailable: then a background retry
// releases it once the database is back; see [Lease.Release]).
func (k *Locker) Do(ctx context.Context, name string, opts *AcquireOpts, fn func(ctx context.Context, l pgfence.Lease) error) error {
	return hold.Do(ctx, k, name, "pgfence: leasetable", func(ctx context.Context) (pgfence.Lease, error) {
		return k.Acquire(ctx, name, opts)
	}, fn)
}

// observeAcquire validates an acquire of name and runs it through f,
// bracketed by the OpObserver's StartOp and EndOp, and reports the
// outcome: the Acquired or NotAcquired event (bad input aside) and the
// Stats counters. The statements run on StartOp's ctx.
func (k *Locker) observeAcquire(ctx context.Context, name string, opts *AcquireOpts, wait bool) (*Lease, error) {
	start := time.Now()
	t, err := k.prepare(ctx, name, opts)
	if err != nil && !errors.Is(err, pgfence.ErrNotAcquired) && !errors.Is(err, pgfence.ErrClosed) {
		return nil, err // bad input
	}
	op := pgfence.Op{Kind: pgfence.OpAcquire, Strategy: pgfence.StrategyLeaseTable, Name: name, Batch: 1}
	ctx = k.ev.StartOp(ctx, op)
	attempts := 0
	var l *Lease
	switch {
	case err == nil && wait:
		l, err = k.waitAcquire(ctx, name, t, opts, &attempts)
	case err == nil:
		l, err = k.tryAcquire(ctx, name, t, &attempts)
	}
	if err != nil {
		k.nNotAcquired.Add(1)
		if k.ev.Enabled() {
			k.ev.Sync(ctx, pgfence.NotAcquired{Lock: pgfence.Lock{Kind: pgfence.StrategyLeaseTable, Name: name},
				Wait: time.Since(start), Attempts: attempts, Err: err})
		}
	} else {
		k.nAcquired.Add(1)
		if k.ev.Enabled() {
			k.ev.Sync(ctx, pgfence.Acquired{Lock: l.lock(), Wait: time.Since(start), Attempts: attempts})
		}
	}
	k.ev.EndOp(ctx, op, err)
	return l, err
}

// prepare validates an acquire of name and returns the lease's timing.
func (k *Locker) prepare(ctx context.Context, name string, opts *AcquireOpts) (leaseTiming, error) {
	if err := ctx.Err(); err != nil {
		// Nothing is sent for a call whose ctx already ended.
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

func (k *Locker) tryAcquire(ctx context.Context, name string, t leaseTiming, attempts *int) (*Lease, error) {
	start := time.Now()
	var (
		l     *Lease
		local bool
		err   error
	)
	for failures := 1; ; failures++ {
		l, local, _, err = k.try(ctx, name, t, attempts, nil)
		if err == nil || ctx.Err() != nil || !k.retryable(err) {
			break
		}
		// The database is unavailable: retry while QueryTimeout lasts.
		wait := k.backoff.Wait(failures)
		if time.Since(start)+wait >= k.cfg.QueryTimeout {
			return nil, acquireError(name, retry.Unavailable("", err))
		}
		k.suspectListen()
		k.cfg.Logger.DebugContext(ctx, "pgfence: leasetable: acquire failed; retrying", "lease", name, "error", err, "retry_in", wait)
		if serr := sleep(ctx, wait); serr != nil {
			return nil, fmt.Errorf("pgfence: leasetable: acquire %q: %w; last attempt: %w", name, serr, retry.Unavailable("", err))
		}
	}
	switch {
	case err != nil:
		return nil, acquireError(name, err)
	case l == nil && local:
		return nil, fmt.Errorf("pgfence: leasetable: lease %q is held by another caller of this Locker: %w", name, pgfence.ErrNotAcquired)
	case l == nil:
		return nil, fmt.Errorf("pgfence: leasetable: lease %q: %w", name, pgfence.ErrNotAcquired)
	}
	return l, nil
}

func (k *Locker) waitAcquire(ctx context.Context, name string, t leaseTiming, opts *AcquireOpts, attempts *int) (*Lease, error) {
	k.waiting.Add(1)
	defer k.waiting.Add(-1)
	if opts != nil {
		var cancel context.CancelFunc
		ctx, cancel = hold.WaitTimeout(ctx, opts.WaitTimeout)
		defer cancel()
	}
	w, err := k.addWaiter(name)
	if err != nil {
		return nil, err
	}
	defer k.removeWaiter(name, w)
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	failures := 0
	var unavailable error // the last attempt's transient error
	ended := func() error {
		if unavailable != nil {
			return fmt.Errorf("pgfence: leasetable: acquire %q: %w; last attempt: %w", name, context.Cause(ctx), retry.Unavailable("", unavailable))
		}
		return fmt.Errorf("pgfence: leasetable: acquire %q: %w", name, context.Cause(ctx))
	}
	// The calls of this Locker waiting for name stand in its line, joined
	// at the first refusal: only the head waits for wake-ups and retries,
	// the others wait for its turn (see package waitline). They stay
	// registered (w) meanwhile, so that the attempt a new head sends or
	// shares at once cannot miss a release.
	var ln *waitline.Line
	head := false
	defer func() {
		if ln != nil {
			k.lines.Leave(name, ln, head)
		}
	}()
	for round := 0; ; round++ {
		if round > 0 && k.hooks != nil && k.hooks.onRound != nil {
			k.hooks.onRound()
		}
		l, _, retryIn, err := k.try(ctx, name, t, attempts, w)
		switch {
		case err == nil:
			failures, unavailable = 0, nil
		case ctx.Err() != nil:
			return nil, ended()
		case errors.Is(err, errLateGrant):
			failures, unavailable = failures+1, nil
			retryIn = k.backoff.Wait(failures)
		case k.retryable(err):
			failures, unavailable = failures+1, err
			retryIn = k.backoff.Wait(failures)
			k.suspectListen()
			k.cfg.Logger.DebugContext(ctx, "pgfence: leasetable: acquire failed; retrying", "lease", name, "error", err, "retry_in", retryIn)
		default:
			return nil, acquireError(name, err)
		}
		if l != nil {
			return l, nil
		}
		if ln == nil {
			ln = k.lines.Join(name)
		}
		if !head {
			waited, stopped := ln.Head(ctx, k.closeCtx.Done())
			switch {
			case stopped && ctx.Err() != nil:
				return nil, ended()
			case stopped:
				return nil, fmt.Errorf("pgfence: leasetable: acquire %q: %w", name, pgfence.ErrClosed)
			}
			head = true
			if waited {
				continue // the call before got the lease, or left: try at once
			}
		}
		if unavailable == nil {
			k.cfg.Logger.DebugContext(ctx, "pgfence: leasetable: waiting for lease", "lease", name, "retry_in", retryIn)
		}
		k.listenFor(w)
		timer.Reset(retryIn)
		select {
		case <-w.ch:
		case <-timer.C:
		case <-ctx.Done():
			return nil, ended()
		case <-k.closeCtx.Done():
			return nil, fmt.Errorf("pgfence: leasetable: acquire %q: %w", name, pgfence.ErrClosed)
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

// attempt is an acquire statement in flight for one name, which waiting
// Acquire calls of the same Locker may wait for instead of sending their
// own (see try).
type attempt struct {
	seq  uint64        // Locker.waiterSeq when it started
	done chan struct{} // closed when answered; then the fields below are set
	// refused is set when the lease was held by someone else (or the
	// holder committed after the statement's snapshot); local and retryIn
	// are then try's answer.
	refused bool
	local   bool
	retryIn time.Duration
}

// try runs one acquire attempt (batched with concurrent attempts of this
// Locker). It returns the lease when taken. Otherwise local reports that
// another caller of this Locker holds it (its release wakes the waiters at
// once), and retryIn how long to wait before the next attempt, judged from
// the holder's expiry.
//
// A waiting Acquire (w not nil) that finds another attempt of this Locker
// in flight for name waits for its answer instead of sending its own, and
// takes a refusal as its own: after a release wakes a Locker's waiters,
// one statement asks, not one per waiter. It does so only when w was
// registered before that attempt started, so that a release after the
// attempt's snapshot has woken w (which then tries again at once) rather
// than being hidden by the shared refusal.
func (k *Locker) try(ctx context.Context, name string, t leaseTiming, attempts *int, w *waiter) (l *Lease, local bool, retryIn time.Duration, err error) {
	k.mu.Lock()
	for {
		if h, ok := k.held[name]; ok {
			// The holder's release or loss wakes this Locker's waiters;
			// until then nothing changes, so retry at its local deadline
			// at the latest (not at once, which would spin).
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
		// It failed, or took the lease for its caller: look again.
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
		defer k.granting.Done() // adopted or given back: Close may return
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
		// The holder committed after our snapshot, or another transaction
		// is claiming the name or holds its expired row: retry soon.
		return nil, false, jitter(10*time.Millisecond, 50*time.Millisecond), nil
	}
	if !rep.acquired {
		k.noteHolder(name, rep.token)
		// Clamped: an expiry further ahead than any pgfence function writes
		// (set by hand) must not overflow the wait into a busy loop.
		wait := min(max(rep.expiresAt.Sub(rep.dbNow), 0), MaxTTL)
		return nil, rep.owner == k.cfg.Owner, wait + jitter(time.Millisecond, expiryJitter), nil
	}
	l = k.newLease(ctx, name, rep, t)
	if !time.Now().Before(l.deadline) {
		// The answer came after the lease's local deadline (its commit
		// waited longer than the TTL, say for a synchronous standby): it
		// may be granted to another owner any moment, so it is given back,
		// never handed out with Done already closed.
		k.giveBack([]giveBackReq{{ctx, name, rep.token, rep.secret}})
		return nil, false, 0, fmt.Errorf("pgfence: leasetable: lease %q (token %d) was granted %v after the acquire was sent, past its local deadline (TTL %v less margin %v); given back: %w: %w",
			name, rep.token, time.Since(rep.sent).Round(time.Millisecond), t.ttl, t.margin, errLateGrant, pgfence.ErrNotAcquired)
	}
	if !k.adopt(l) {
		// Closed while acquiring: give it straight back.
		l.cancel(errLostClosed)
		k.giveBack([]giveBackReq{{ctx, name, rep.token, rep.secret}})
		return nil, false, 0, fmt.Errorf("pgfence: leasetable: acquire %q: %w", name, pgfence.ErrClosed)
	}
	k.cfg.Logger.DebugContext(ctx, "pgfence: leasetable: acquired", "lease", name, "token", rep.token, "ttl", t.ttl)
	return l, false, 0, nil
}

// errLateGrant marks a grant that arrived after its local deadline.
var errLateGrant = errors.New("granted too late")

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
// statement error it answers none and returns the error. The statement's
// context carries the values of the first request's context (for tracers).
// The wait for a connection ends once every caller in the batch stopped
// waiting; the statement, once sent, runs to its answer (for at most
// QueryTimeout after the last caller left or Close began), so that a lease
// taken for a caller who stopped waiting, or after Close, is known and
// given back.
func (k *Locker) execAcquires(batch []*acquireReq) (err error) {
	defer func() { err = permerr.Wrap(err, "", k.cfg.Schema) }() // names the missing grant
	// One request per name; the others learn the first one's outcome as
	// "held" (by this Locker when the first one acquired it), exactly as
	// if they had run just after it.
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
	// Until the statement is sent, it is abandoned with its callers (or
	// Close): the wait for a connection ends when all of them stopped
	// waiting. Once sent, it is not cancelled with them at once: a
	// statement cancelled in flight may still commit, and only its answer
	// tells which leases to give back. It gets QueryTimeout more after the
	// last caller left or Close began; Close waits for it, and for the
	// give-back.
	values := batch[0].ctx
	if k.ev.Enabled() && len(batch) > 1 {
		// One statement for several callers: an operation of its own,
		// under the opener's, linked to the others'.
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
	// No answer after the longest TTL of the batch would come too late
	// anyway (past every lease's local deadline, and so given back): the
	// statement is cancelled then, so that an attempt stuck on a dead
	// connection ends and is retried on another.
	qctx, qcancel := context.WithTimeout(context.WithoutCancel(ctx), time.Duration(slices.Max(ttls))*time.Microsecond)
	defer qcancel()
	if k.hooks != nil && k.hooks.noGrantWait {
		// The negative control: Close cuts the statement, as it once did.
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

// replyAcquires answers every request in batch: with err when it is not
// nil, else from got. A lease taken for a caller that stopped waiting, or
// after Close began, is given back at once (Close waits for this). Only the
// first request for a name gets got's answer; got is updated so that later
// ones find the lease held.
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
