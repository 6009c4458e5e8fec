package leasetable

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence"
	"github.com/pgfence/pgfence/internal/engine"
	"github.com/pgfence/pgfence/internal/events"
	"github.com/pgfence/pgfence/internal/install"
	"github.com/pgfence/pgfence/internal/notifier"
	"github.com/pgfence/pgfence/internal/retry"
	"github.com/pgfence/pgfence/internal/waitline"
)

// Locker acquires, renews and releases leases in the pgfence_leases table
// through a pool. It is safe for concurrent use. Create it with [New] and
// stop it with [Locker.Close]. It satisfies [pgfence.Locker].
type Locker struct {
	pool       *pgxpool.Pool
	cfg        Config          // resolved: defaults filled in
	sql        statements      // the SQL, with the schema filled in
	closeCtx   context.Context // cancelled by Close
	closeFunc  context.CancelFunc
	background sync.WaitGroup  // watchdog, listener and release-retry goroutines
	backoff    retry.Backoff   // spaces retries after transient errors
	ev         *events.Emitter // nil without Config.Observer
	hooks      *testHooks      // nil in production

	waiting                                                   atomic.Int64
	nAcquired, nNotAcquired, nReleased, nLost, nRenewFailures atomic.Uint64

	renewRTT atomic.Int64 // see fastestRenewal

	mu               sync.Mutex
	closed           bool
	leases           map[*Lease]struct{} // held leases, renewed by the watchdog
	held             map[string]*Lease   // the same, by name
	watchdogRunning  bool
	watchdogWake     chan struct{}      // buffered(1): a lease was added
	listener         *notifier.Notifier // the LISTEN loop, once started
	waiters          map[string]map[*waiter]struct{}
	notifyKey        notifier.Key            // checks notifications (see notify)
	tagNames         map[string]string       // a listened-for name by its notification tag
	watched          map[string]*watch       // the names waiters are registered for (see addWaiter, notify)
	interests        map[string]*interest    // the names whose interest key waiters need (see interest.go)
	waiterSeq        uint64                  // the seq of the last waiter added
	listenWants      int                     // waiters that wait for notifications (see wantListen)
	listenIdleSince  time.Time               // when listenWants last fell to 0
	listenAnswer     bool                    // wantListen's last answer to the notifier
	lingerTimer      *time.Timer             // asks the notifier again once listenLinger has passed
	attempts         map[string]*attempt     // attempts in flight, by name (see try)
	lines            *waitline.Lines[string] // the waiting Acquire calls by name (see waitAcquire)
	interestRefusals int                     // consecutive refused interest keys; applyInterests only
	lineIdle         []idleLineConn          // line connections kept for reuse (see line.go)
	claims           map[string]*permitClaim // the claims of this Locker's heads of lines, by semaphoreKey (see handover.go)
	grantChannel     string                  // the channel its claims' grants are notified on (see handover.go)

	acquires batcher[*acquireReq] // combines concurrent acquires
	granting sync.WaitGroup       // grants handed to callers, not yet adopted or given back
	releases batcher[*releaseReq] // combines concurrent releases
}

var _ pgfence.Locker = (*Locker)(nil)

// testHooks are the switches and callbacks tests set (export_test.go).
type testHooks struct {
	noRetry      bool                 // transient errors are not retried
	keepStale    bool                 // connections to a read-only server are kept
	noShare      bool                 // waiters do not share attempts (see try)
	noListenWake bool                 // the LISTEN connection's subscribing wakes no waiter
	noArmWake    bool                 // taking a name's interest key wakes none of its waiters
	noInterest   bool                 // waiters take no interest key
	noDBLine     bool                 // waiting permit calls do not wait in the database's line
	noDBLinePing bool                 // a line's holder does not ping its connection
	onDBLineWait func(sem string)     // a waiting permit call is about to wait in the database's line
	onArm        func(names []string) // the LISTEN connection is about to take the interest keys of names
	noGrantWait  bool                 // Close cuts acquire statements in flight and does not wait for grants
	lateRenewals bool                 // a renewal is sent however little time is left (see fastestRenewal)
	onRound      func()               // a waiting Acquire goes round its loop again
	onListen     func()               // a waiter first waits for notifications (see listenFor)
	lateWatch    bool                 // a waiter's name is watched from listenFor on, not from addWaiter
	onNotify     func()               // a notification reached the LISTEN connection (see notify)
	noClaim      bool                 // the head of a semaphore's line registers no claim (see handover.go)
	onHanded     func(token int64)    // a permit granted to a claim by notification was adopted
	listenAsked  int64                // wantListen's answers so far; guarded by Locker.mu
}

// New returns a Locker that runs its statements on pool; cfg may be nil for
// the defaults. It checks once, within ctx, that pgfence's schema is
// installed at the version this code needs. The pool stays the caller's:
// it must stay open until [Locker.Close] returns, and needs MaxConns of at
// least 2 (New logs a Warn otherwise).
//
// New returns an error for an invalid cfg or a nil pool (nothing sent), one
// matching [pgfence.ErrUnsafeServer] for a standby, YugabyteDB or
// CockroachDB, one matching [pgfence.ErrNotInstalled] that says how to
// install the schema, and database errors wrapped. Asynchronous standbys
// of the server are reported by a Warn and a [pgfence.ServerWarning].
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
	warnings, err := engine.Gate(ctx, pool)
	if err != nil {
		return nil, fmt.Errorf("pgfence: leasetable: %w", err)
	}
	if _, err := install.Check(ctx, pool, schema, quoted); err != nil {
		return nil, fmt.Errorf("pgfence: leasetable: %w", err)
	}
	key, err := notifier.LoadKey(ctx, pool, quoted)
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
		interests:    make(map[string]*interest),
		attempts:     make(map[string]*attempt),
		claims:       make(map[string]*permitClaim),
		grantChannel: grantChannel(),
		lines:        waitline.New[string](false),
		backoff:      retry.Default,
		ev:           events.New(resolved.Observer),
	}
	k.acquires.exec, k.acquires.fail = k.execAcquires, k.failAcquire
	k.releases.exec, k.releases.fail = k.execReleases, failRelease
	k.warnSmallPool(ctx)
	for _, w := range warnings {
		k.cfg.Logger.WarnContext(ctx, "pgfence: leasetable: "+w.Detail, "reason", w.Reason)
		k.ev.Async(ctx, pgfence.ServerWarning{Kind: pgfence.StrategyLeaseTable, Reason: w.Reason, Detail: w.Detail})
	}
	return k, nil
}

// Owner returns the owner id this Locker writes into the leases it takes.
func (k *Locker) Owner() string { return k.cfg.Owner }

// Schema returns the schema the Locker's statements use.
func (k *Locker) Schema() string { return k.cfg.Schema }

// Close releases every lease the Locker holds, each then lost with a cause
// matching [pgfence.ErrLeaseLost] and [pgfence.ErrClosed], and waits for the
// grants of acquires in flight, so that no lease of the Locker stays held
// unless the database stopped answering (each wait bounded by
// [Config].QueryTimeout). Waiting Acquire calls return [pgfence.ErrClosed];
// background work, release retries included, stops, and the Observer's
// queued events are delivered. It does not close the pool. Close is
// idempotent; later calls of the Locker's methods return [pgfence.ErrClosed].
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
	// Together: one batch, and one QueryTimeout in an outage.
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
	if k.hooks == nil || !k.hooks.noGrantWait {
		k.granting.Wait() // grants handed to callers as Close began: adopted (and released above) or given back
	}
	k.releases.close()
	k.background.Wait()
	k.closeLineConns()
	k.ev.Close() // delivers the queued events
}

// Stats returns a snapshot of the Locker's state and counters (see
// [pgfence.Stats]). It sends no statement, and works after Close.
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

func (k *Locker) checkOpen() error {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.closed {
		return pgfence.ErrClosed
	}
	return nil
}

// statements is the Locker's SQL, with its schema filled in.
type statements struct {
	acquire, release, renew, list, get, forceRelease, listForced string
	pruneScan, pruneDelete                                       string
	permit, claim, leaveClaim, set, semaphores                   string
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
		permit:       f(permitSQL),
		claim:        f(claimSQL),
		leaveClaim:   f(leaveClaimSQL),
		set:          f(setSQL),
		semaphores:   f(semaphoresSQL),
	}
}
