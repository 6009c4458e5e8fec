package leasetable

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence"
	"github.com/pgfence/pgfence/internal/events"
	"github.com/pgfence/pgfence/internal/hold"
	"github.com/pgfence/pgfence/internal/install"
	"github.com/pgfence/pgfence/internal/notifier"
	"github.com/pgfence/pgfence/internal/notifykey"
	"github.com/pgfence/pgfence/internal/retry"
	"github.com/pgfence/pgfence/internal/waitline"
)

// Locker acquires, renews and releases leases in the pgfence_leases table
// through a pool. It is safe for concurrent use. Create it with [New] and
// stop it with [Locker.Close]. It satisfies [pgfence.Locker].
type Locker struct {
	pool         *pgxpool.Pool
	cfg          Config          // resolved: defaults filled in
	sql          statements      // the SQL, with the schema filled in
	closeCtx     context.Context // cancelled by Close
	closeFunc    context.CancelFunc
	background   sync.WaitGroup  // watchdog, listener and release-retry goroutines
	backoff      retry.Backoff   // spaces retries after transient errors
	noRetry      bool            // tests: transient errors are not retried
	keepStale    bool            // tests: connections to a read-only server are kept
	noShare      bool            // tests: waiters do not share attempts (see try)
	onRound      func()          // tests: runs each time a waiting Acquire goes round its loop again
	onListen     func()          // tests: runs when a waiter first waits for notifications (listenFor)
	noListenWake bool            // tests: the LISTEN connection's subscribing wakes no waiter
	noGrantWait  bool            // tests: Close cuts acquire statements in flight and does not wait for grants (the negative control)
	ev           *events.Emitter // nil without Config.Observer

	// Stats counters.
	waiting                                                   atomic.Int64
	nAcquired, nNotAcquired, nReleased, nLost, nRenewFailures atomic.Uint64

	// renewRTT is the shortest round trip, in nanoseconds, of an answered
	// renewal statement (see fastestRenewal); lateRenewals turns its check
	// off (tests: the negative control).
	renewRTT     atomic.Int64
	lateRenewals bool

	mu              sync.Mutex
	closed          bool
	leases          map[*Lease]struct{} // held leases, renewed by the watchdog
	held            map[string]*Lease   // the same, by name
	watchdogRunning bool
	watchdogWake    chan struct{}      // buffered(1): a lease was added
	listener        *notifier.Notifier // the LISTEN loop, once started
	waiters         map[string]map[*waiter]struct{}
	notifyKey       notifykey.Key       // checks notifications (see notify)
	tagNames        map[string]string   // a listened-for name by its notification tag
	watched         map[string]*watch   // the listened-for names (see listenFor)
	waiterSeq       uint64              // the seq of the last waiter added
	listenWants     int                 // waiters that wait for notifications (see wantListen)
	listenIdleSince time.Time           // when listenWants last fell to 0
	listenAnswer    bool                // wantListen's last answer to the notifier
	listenAsked     int64               // wantListen's answers so far (tests)
	lingerTimer     *time.Timer         // asks the notifier again once listenLinger has passed
	attempts        map[string]*attempt // attempts in flight, by name (see try)
	// lines queues the waiting Acquire calls by name: only the head of a
	// name's line retries and is woken (see acquire).
	lines *waitline.Lines[string]

	acquires batcher[*acquireReq] // combines concurrent acquires
	granting sync.WaitGroup       // grants handed to callers, not yet adopted or given back
	releases batcher[*releaseReq] // combines concurrent releases
}

var _ pgfence.Locker = (*Locker)(nil)

// watch is what a Locker knows of a name its waiters listen for: the tag
// its notifications carry, and the newest released token acted on, so that
// a replayed notification is dropped.
type watch struct {
	tag      string
	notified int64
}

type waiter struct {
	name    string
	ch      chan struct{} // buffered(1)
	seq     uint64        // order of registration (Locker.waiterSeq)
	listens bool          // it waits for notifications (counted in Locker.listenWants)
}

func (w *waiter) wake() {
	select {
	case w.ch <- struct{}{}:
	default:
	}
}

// New returns a Locker that uses pool for every statement. cfg may be nil for
// the defaults. New returns an error when cfg is invalid or pool is nil;
// then nothing is sent. Otherwise it checks once, in a round trip or two
// bounded by ctx, that pgfence's schema ([Config].Schema) is installed at
// the version this code needs and that its token sequence is sound, and
// returns an error matching [pgfence.ErrNotInstalled] that says how to fix
// it when not. Database errors are returned wrapped. ctx has no effect on
// the Locker after New returns.
//
// The pool stays the caller's: [Locker.Close] does not close it, and it must
// stay open until Close returns. The Locker takes a connection from it for
// each statement, as the caller does, waiting at most [Config].QueryTimeout
// for one; it needs MaxConns of at least 2, and New logs a Warn for a pool
// of one (see "Pool size" in the package documentation).
func New(ctx context.Context, pool *pgxpool.Pool, cfg *Config) (*Locker, error) {
	if pool == nil {
		return nil, errNilPool
	}
	resolved, err := cfg.resolve()
	if err != nil {
		return nil, err
	}
	schema, quoted, err := install.Schema("pgfence: leasetable: Config.Schema", resolved.Schema)
	if err != nil {
		return nil, err
	}
	resolved.Schema = schema
	if _, err := install.Check(ctx, pool, schema, quoted); err != nil {
		return nil, fmt.Errorf("pgfence: leasetable: %w", err)
	}
	key, err := notifykey.Load(ctx, pool, quoted)
	if err != nil {
		return nil, fmt.Errorf("pgfence: leasetable: %w", err)
	}
	if resolved.ListenConnConfig == nil && !resolved.DisableListen {
		resolved.ListenConnConfig = pool.Config().ConnConfig.Copy()
	}
	closeCtx, cancel := context.WithCancel(context.Background())
	k := &Locker{
		pool:         pool,
		cfg:          resolved,
		sql:          newStatements(quoted),
		closeCtx:     closeCtx,
		closeFunc:    cancel,
		leases:       make(map[*Lease]struct{}),
		held:         make(map[string]*Lease),
		watchdogWake: make(chan struct{}, 1),
		waiters:      make(map[string]map[*waiter]struct{}),
		notifyKey:    key,
		tagNames:     make(map[string]string),
		watched:      make(map[string]*watch),
		attempts:     make(map[string]*attempt),
		lines:        waitline.New[string](false),
		backoff:      retry.Default,
		ev:           events.New(resolved.Observer),
	}
	k.acquires.exec, k.acquires.fail = k.execAcquires, k.failAcquire
	k.releases.exec, k.releases.fail = k.execReleases, failRelease
	k.warnSmallPool(ctx)
	return k, nil
}

// Owner returns the owner id this Locker writes into the leases it takes.
func (k *Locker) Owner() string { return k.cfg.Owner }

// Schema returns the schema the Locker's statements use.
func (k *Locker) Schema() string { return k.cfg.Schema }

// Close releases every lease the Locker still holds (each such lease is
// lost: its context is cancelled with a cause matching both
// [pgfence.ErrLeaseLost] and [pgfence.ErrClosed]), wakes waiting Acquire
// calls, which return [pgfence.ErrClosed], and stops the renewal watchdog and
// the LISTEN connection. The releases go out together, and a transient
// error is retried for at most [Config].QueryTimeout (never in the
// background); the release retries that earlier Release calls left in the
// background stop, their leases expiring after their TTL. An acquire
// statement in flight is waited for (at most QueryTimeout) and its grants
// given back, so no lease of the Locker is held once Close returns unless
// the database stopped answering. Close returns
// when all background goroutines have stopped, the Observer's queued
// events were delivered, and pgx has finished closing the LISTEN
// connection; it waits at most a second for the latter when the server
// does not answer. It does not close the pool. Close is idempotent; later
// calls of the Locker's methods return [pgfence.ErrClosed].
func (k *Locker) Close() {
	k.mu.Lock()
	if k.closed {
		k.mu.Unlock()
		return
	}
	k.closed = true
	if k.lingerTimer != nil {
		k.lingerTimer.Stop()
	}
	held := make([]*Lease, 0, len(k.leases))
	for l := range k.leases {
		held = append(held, l)
	}
	k.mu.Unlock()
	k.closeFunc() // stops the watchdog's in-flight renewal, the listener, waiters and release retries
	// Released together: they go out in one batch, and during an outage
	// Close waits one QueryTimeout for all of them, not one each.
	var releases sync.WaitGroup
	for _, l := range held {
		releases.Add(1)
		go func() {
			defer releases.Done()
			err := l.release(l.values, errLostClosed)
			if err != nil && !errors.Is(err, pgfence.ErrNotHeld) {
				k.cfg.Logger.WarnContext(l.values, "pgfence: leasetable: release on close failed", "lease", l.name, "token", l.token, "error", err)
			}
		}()
	}
	releases.Wait()
	k.acquires.close()
	if !k.noGrantWait {
		k.granting.Wait() // grants handed to callers as Close began: adopted (and released above) or given back
	}
	k.releases.close()
	k.background.Wait()
	k.ev.Close() // delivers the queued events
}

// Stats returns a snapshot of the Locker's state and counters: leases held
// and Acquire calls waiting now, totals of grants, calls that returned
// without a lease (bad input aside), releases, losses and failed renewal
// attempts, whether the LISTEN connection listens now, and how many
// background events a slow [Config].Observer made it drop. It never sends
// a statement, and works after Close.
func (k *Locker) Stats() pgfence.Stats {
	k.mu.Lock()
	held, listener := len(k.leases), k.listener
	k.mu.Unlock()
	return pgfence.Stats{
		Held:            held,
		Waiting:         int(k.waiting.Load()),
		Acquired:        k.nAcquired.Load(),
		NotAcquired:     k.nNotAcquired.Load(),
		Released:        k.nReleased.Load(),
		Lost:            k.nLost.Load(),
		RenewalFailures: k.nRenewFailures.Load(),
		Listening:       listener.Listening(),
		EventsDropped:   k.ev.Dropped(),
	}
}

var errLostClosed = fmt.Errorf("%w: %w", pgfence.ErrLeaseLost, pgfence.ErrClosed)

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
	l, err := k.observeAcquire(ctx, name, opts, k.tryAcquire)
	if err != nil {
		return nil, err
	}
	return l, nil
}

// acquireFunc is tryAcquire or acquire: it counts its round trips in
// *attempts.
type acquireFunc func(ctx context.Context, name string, t leaseTiming, opts *AcquireOpts, attempts *int) (*Lease, error)

// observeAcquire validates an acquire of name and runs it through f,
// bracketed by the OpObserver's StartOp and EndOp, and reports the
// outcome: the Acquired or NotAcquired event (bad input aside) and the
// Stats counters. The statements run on StartOp's ctx.
func (k *Locker) observeAcquire(ctx context.Context, name string, opts *AcquireOpts, f acquireFunc) (*Lease, error) {
	start := time.Now()
	t, err := k.prepare(ctx, name, opts)
	if err != nil && !errors.Is(err, pgfence.ErrNotAcquired) && !errors.Is(err, pgfence.ErrClosed) {
		return nil, err // bad input
	}
	op := pgfence.Op{Kind: pgfence.OpAcquire, Strategy: pgfence.StrategyLeaseTable, Name: name, Batch: 1}
	ctx = k.ev.StartOp(ctx, op)
	attempts := 0
	var l *Lease
	if err == nil {
		l, err = f(ctx, name, t, opts, &attempts)
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

func (k *Locker) tryAcquire(ctx context.Context, name string, t leaseTiming, _ *AcquireOpts, attempts *int) (*Lease, error) {
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
	l, err := k.observeAcquire(ctx, name, opts, k.acquire)
	if err != nil {
		return nil, err
	}
	return l, nil
}

func (k *Locker) acquire(ctx context.Context, name string, t leaseTiming, opts *AcquireOpts, attempts *int) (*Lease, error) {
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
		if round > 0 && k.onRound != nil {
			k.onRound()
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

// retryable reports whether err of one of the Locker's statements is
// retried: a transient database error (retry.Transient).
func (k *Locker) retryable(err error) bool {
	var noAnswer *noAnswerError
	return !k.noRetry && (retry.Transient(err) || errors.As(err, &noAnswer))
}

// suspectListen asks the LISTEN connection, if any, to check itself now:
// a statement just failed with a transient error, and the LISTEN
// connection may have died with the others without noticing.
func (k *Locker) suspectListen() {
	k.mu.Lock()
	n := k.listener
	k.mu.Unlock()
	n.Suspect()
}

// sleep waits d or until ctx ends, returning ctx's cause then.
func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return context.Cause(ctx)
	}
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

func (k *Locker) checkOpen() error {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.closed {
		return pgfence.ErrClosed
	}
	return nil
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

func jitter(lo, hi time.Duration) time.Duration {
	if hi <= lo {
		return lo
	}
	return lo + rand.N(hi-lo)
}

// logAttrs are the log attributes describing a lease.
func logAttrs(l *Lease) []any {
	return []any{slog.String("lease", l.name), slog.Int64("token", l.token)}
}

// statements is the Locker's SQL, with its schema filled in.
type statements struct {
	acquire, release, renew, list, get, forceRelease, listForced string
	pruneScan, pruneDelete                                       string
}

// newStatements fills the quoted schema into every statement template.
func newStatements(schema string) statements {
	f := func(tmpl string) string { return fmt.Sprintf(tmpl, schema) }
	return statements{
		acquire:      f(acquireSQL),
		release:      f(releaseSQL),
		renew:        f(renewSQL),
		list:         f(listSQL),
		get:          f(getSQL),
		forceRelease: f(forceReleaseSQL),
		listForced:   f(listForcedSQL),
		pruneScan:    f(pruneScanSQL),
		pruneDelete:  f(pruneDeleteSQL),
	}
}
