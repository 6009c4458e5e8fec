package leader

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence"
	"github.com/pgfence/pgfence/internal/install"
	"github.com/pgfence/pgfence/internal/notifier"
	"github.com/pgfence/pgfence/internal/notifykey"
	"github.com/pgfence/pgfence/leasetable"
)

// NotifyChannel is the LISTEN/NOTIFY channel on which a new term's value
// (a proclamation) is announced; the payload is tag:token:mac, keyed with
// the install's pgfence_notify_key (the tag stands for the election's
// name), as on [leasetable.NotifyChannel].
// Resignations are announced by the lease table's release, on
// [leasetable.NotifyChannel]. Observers listen on both.
const NotifyChannel = "pgfence_leader"

// MaxValueLength is the longest value, in bytes, a leader may proclaim. A
// value must be valid UTF-8.
const MaxValueLength = 4096

// DefaultObserveInterval is how often an observer re-reads the leader when
// no notification arrives, when [Config].ObserveInterval is zero.
const DefaultObserveInterval = 5 * time.Second

// DefaultRetryInterval is the first pause of [Elector.Run] after a failed
// campaign, when [Config].RetryInterval is zero. Each further failure
// doubles it, up to 30 times as long.
const DefaultRetryInterval = time.Second

// DefaultHandoverTimeout is [Config].HandoverTimeout when it is zero.
const DefaultHandoverTimeout = 500 * time.Millisecond

// queryTimeout bounds the statements the Elector runs on its own behalf
// (a proclamation after the caller's ctx ended, a resignation from Close
// or Run).
const queryTimeout = 5 * time.Second

// Config configures an [Elector]. [New] validates it and returns an error
// naming the bad field; the caller's Config is never modified.
type Config struct {
	// Locker takes the election's lease. Required. It stays the caller's:
	// [Elector.Close] does not close it, and it must stay open until Close
	// returns. Its Owner is the leader's owner id; its schema is the one
	// the Elector reads. Several Electors (of different elections, or of
	// the same one) may share a Locker: one Locker never holds a lease
	// twice, so one Locker never holds two terms of an election at once.
	Locker *leasetable.Locker

	// Election names the election: the name of the lease whose holder is
	// the leader (the same rules as for lease names: at most
	// [leasetable.MaxNameLength] bytes of UTF-8 without control
	// characters). Every candidate of one election uses the same name; do
	// not take the lease by that name for anything else. Required.
	Election string

	// Value is what this candidate proclaims when it leads (an address to
	// forward requests to, say): followers read it with [Elector.Leader]
	// and [Elector.Observe]. At most [MaxValueLength] bytes of UTF-8; it
	// may be empty. [Term.Proclaim] changes it for one term.
	Value string

	// TTL is the lease's time-to-live for each term (see
	// [leasetable.Config].TTL); zero means the Locker's. A crashed
	// leader's term ends, and a follower takes over, about TTL after its
	// last renewal.
	TTL time.Duration

	// ObserveInterval is how long an observer ([Elector.Observe], and
	// [Callbacks].OnNewLeader) waits for a notification before it reads
	// the leader again anyway. Observers also re-read at the current term's
	// expiry, so a crashed leader's end is seen within milliseconds of it;
	// this bounds the delay for changes whose notification was missed.
	// Zero means [DefaultObserveInterval]; otherwise at least 10ms.
	ObserveInterval time.Duration

	// RetryInterval is how long [Elector.Run] waits after a campaign
	// failed (a database error) before it campaigns again; it doubles
	// with each further failure, up to 30 times as long. Zero means
	// [DefaultRetryInterval].
	RetryInterval time.Duration

	// HandoverTimeout is how long, after this Elector resigned a term, its
	// next campaign lets the other candidates take the election first: it
	// waits until the election's lease has been granted to another
	// candidate, or this time has passed since the resignation (see
	// [Term.Resign]). Zero means [DefaultHandoverTimeout].
	HandoverTimeout time.Duration

	// Logger receives failed campaigns and observer reads (Warn) and term
	// changes (Debug). Nil means silent.
	Logger *slog.Logger

	// DisableListen turns off the observers' LISTEN connection: they then
	// learn of a change at the current term's expiry or after
	// ObserveInterval. Campaigns are not affected (they wait through the
	// Locker's own LISTEN connection; see [leasetable.Config]). Use it
	// behind a transaction-pooling PgBouncer without a ListenConnConfig.
	DisableListen bool

	// ListenConnConfig, when not nil, opens the observers' LISTEN
	// connection instead of the pool's connection configuration (point it
	// at the server directly when the pool goes through a
	// transaction-pooling PgBouncer). It is copied. As with the Locker's,
	// a LISTEN connection that does not receive notifications is detected
	// at connect, logged once, and replaced by timed re-reads.
	ListenConnConfig *pgx.ConnConfig
}

// minObserveInterval is the shortest ObserveInterval accepted.
const minObserveInterval = 10 * time.Millisecond

func (c *Config) resolve() (Config, error) {
	if c == nil {
		return Config{}, errors.New("pgfence: leader: Config is nil; Locker and Election are required")
	}
	r := *c
	if r.Locker == nil {
		return r, errors.New("pgfence: leader: Config.Locker is nil")
	}
	if err := checkElection(r.Election); err != nil {
		return r, err
	}
	if err := checkValue(r.Value); err != nil {
		return r, fmt.Errorf("pgfence: leader: Config.Value: %w", err)
	}
	switch {
	case r.TTL < 0:
		return r, fmt.Errorf("pgfence: leader: Config.TTL is %v; it must not be negative", r.TTL)
	case r.TTL > 0 && r.TTL < leasetable.MinTTL:
		return r, fmt.Errorf("pgfence: leader: Config.TTL is %v; it must be at least %v", r.TTL, leasetable.MinTTL)
	case r.ObserveInterval < 0 || (r.ObserveInterval > 0 && r.ObserveInterval < minObserveInterval):
		return r, fmt.Errorf("pgfence: leader: Config.ObserveInterval is %v; it must be at least %v (zero means %v)",
			r.ObserveInterval, minObserveInterval, DefaultObserveInterval)
	case r.RetryInterval < 0:
		return r, fmt.Errorf("pgfence: leader: Config.RetryInterval is %v; it must not be negative", r.RetryInterval)
	case r.HandoverTimeout < 0:
		return r, fmt.Errorf("pgfence: leader: Config.HandoverTimeout is %v; it must not be negative", r.HandoverTimeout)
	}
	if r.ObserveInterval == 0 {
		r.ObserveInterval = DefaultObserveInterval
	}
	if r.RetryInterval == 0 {
		r.RetryInterval = DefaultRetryInterval
	}
	if r.HandoverTimeout == 0 {
		r.HandoverTimeout = DefaultHandoverTimeout
	}
	if r.Logger == nil {
		r.Logger = slog.New(slog.DiscardHandler)
	}
	if r.ListenConnConfig != nil {
		r.ListenConnConfig = r.ListenConnConfig.Copy()
	}
	return r, nil
}

// checkElection applies the lease table's rules for names.
func checkElection(name string) error {
	switch {
	case name == "":
		return errors.New("pgfence: leader: Config.Election is empty")
	case len(name) > leasetable.MaxNameLength:
		return fmt.Errorf("pgfence: leader: Config.Election is %d bytes long; at most %d are allowed", len(name), leasetable.MaxNameLength)
	case !utf8.ValidString(name):
		return errors.New("pgfence: leader: Config.Election is not valid UTF-8")
	}
	if i := strings.IndexFunc(name, func(r rune) bool { return r < 0x20 || r == 0x7f }); i >= 0 {
		return fmt.Errorf("pgfence: leader: Config.Election contains the control character %U at byte %d", name[i], i)
	}
	return nil
}

// checkValue rejects values the text type or pgfence_leaders would.
func checkValue(v string) error {
	switch {
	case len(v) > MaxValueLength:
		return fmt.Errorf("value is %d bytes long; at most %d are allowed", len(v), MaxValueLength)
	case !utf8.ValidString(v):
		return errors.New("value is not valid UTF-8")
	case strings.IndexByte(v, 0) >= 0:
		return errors.New("value contains a NUL byte")
	}
	return nil
}

// Elector campaigns in one election, and observes who leads it. It is
// safe for concurrent use. Create it with [New] and stop it with
// [Elector.Close].
type Elector struct {
	pool      *pgxpool.Pool
	locker    *leasetable.Locker
	cfg       Config // resolved
	sql       statements
	opts      *pgfence.AcquireOpts
	closeCtx  context.Context
	closeFunc context.CancelFunc
	wg        sync.WaitGroup // observers, the notifier, Run's observer
	hooks     *testHooks     // nil in production
	notifyKey notifykey.Key  // checks notifications (see notify)
	notifyTag string         // the election's tag in notifications

	mu           sync.Mutex
	closed       bool
	term         *Term                      // the term held, if any
	running      bool                       // Run is running
	listener     *notifier.Notifier         // the observers' LISTEN connection, once started
	watchers     map[chan struct{}]struct{} // buffered(1): wake an observer
	notifiedTerm int64                      // the newest term a notification announced (see notify)
	aside        time.Time                  // StepAside: no campaign before then
	handover     handover                   // the last resignation's, until it ends
}

// testHooks change an Elector's behaviour for tests (export_handover_test.go).
type testHooks struct {
	noHandover bool // a campaign after a resignation does not wait
}

// New returns an Elector for cfg.Election that campaigns with cfg.Locker
// and reads the leader through pool (the Locker's pool, or any pool on the
// same database). It returns an error, naming the field, when cfg is
// invalid or pool is nil; then nothing is sent. Otherwise it checks once,
// in a round trip or two through pool bounded by ctx, that the Locker's
// schema holds pgfence at the version this code needs (with
// pgfence_leaders), and returns an error matching [pgfence.ErrNotInstalled]
// that says how to fix it when not; then it reads the install's
// notification key (SELECT on pgfence_notify_key, granted by
// migrations.Grant). ctx has no effect on the Elector after New returns.
// The pool stays the caller's; Close does not close it.
func New(ctx context.Context, pool *pgxpool.Pool, cfg *Config) (*Elector, error) {
	if pool == nil {
		return nil, errors.New("pgfence: leader: pool is nil")
	}
	r, err := cfg.resolve()
	if err != nil {
		return nil, err
	}
	schema, quoted, err := install.Schema("pgfence: leader: the Locker's schema", r.Locker.Schema())
	if err != nil {
		return nil, err
	}
	if _, err := install.Check(ctx, pool, schema, quoted); err != nil {
		return nil, fmt.Errorf("pgfence: leader: %w", err)
	}
	key, err := notifykey.Load(ctx, pool, quoted)
	if err != nil {
		return nil, fmt.Errorf("pgfence: leader: %w", err)
	}
	if r.ListenConnConfig == nil && !r.DisableListen {
		r.ListenConnConfig = pool.Config().ConnConfig.Copy()
	}
	closeCtx, cancel := context.WithCancel(context.Background())
	e := &Elector{
		pool:      pool,
		locker:    r.Locker,
		cfg:       r,
		sql:       newStatements(quoted),
		closeCtx:  closeCtx,
		closeFunc: cancel,
		watchers:  make(map[chan struct{}]struct{}),
		notifyKey: key,
		notifyTag: key.Tag(r.Election),
	}
	if r.TTL > 0 {
		e.opts = &pgfence.AcquireOpts{TTL: r.TTL}
	}
	return e, nil
}

// Election returns the election's name.
func (e *Elector) Election() string { return e.cfg.Election }

// Close resigns the term this Elector holds, if any (handing over at
// once), makes a Campaign in progress return [pgfence.ErrClosed], ends
// every Observe channel, and stops the LISTEN connection. It returns when
// its goroutines have stopped; a [Elector.Run] returns [pgfence.ErrClosed]
// once its OnStartedLeading callback has returned. It closes neither the
// Locker nor the pool. Close is idempotent; later calls of the Elector's
// methods return [pgfence.ErrClosed].
func (e *Elector) Close() {
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		return
	}
	e.closed = true
	t := e.term
	e.mu.Unlock()
	e.closeFunc()
	if t != nil {
		_ = t.resign(context.Background())
	}
	e.wg.Wait()
}

func (e *Elector) checkOpen() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return pgfence.ErrClosed
	}
	return nil
}

// ErrAlreadyLeading is returned at once by [Elector.Campaign] when the
// Elector already holds a term that has not ended. It matches
// [pgfence.ErrAlreadyHeld] (and so [pgfence.ErrNotAcquired]).
var ErrAlreadyLeading error = alreadyLeadingError{}

type alreadyLeadingError struct{}

func (alreadyLeadingError) Error() string { return "pgfence: leader: this Elector already leads" }

func (alreadyLeadingError) Is(target error) bool {
	return target == pgfence.ErrAlreadyHeld || target == pgfence.ErrNotAcquired
}

// Campaign waits until this Elector leads the election, or ctx ends, and
// returns the term. It acquires the election's lease (waking at once when
// the leader resigns, through the Locker's LISTEN connection or directly
// within one Locker, and otherwise when the leader's lease expires), then
// proclaims [Config].Value for the term, and returns once both are
// committed: by then [Elector.Leader] shows the new term to everyone.
// After this Elector resigned, Campaign first lets the other candidates
// take over (see [Term.Resign]); while it steps aside, it waits for the
// end of that ([Elector.StepAside]).
//
// The term lasts until [Term.Resign], [Elector.Resign] or [Elector.Close],
// or until its lease is lost (see [Term.Context]); ctx does not bound it.
// When ctx ends first, Campaign returns an error wrapping ctx's cause; a
// lease taken meanwhile is given back. It returns [ErrAlreadyLeading] at
// once while the Elector holds a term, [pgfence.ErrClosed] after Close, and
// database errors wrapped (after giving back a lease it took), without
// retrying them: [Elector.Run] retries.
func (e *Elector) Campaign(ctx context.Context) (*Term, error) {
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		return nil, pgfence.ErrClosed
	}
	if e.term != nil && e.term.Err() == nil {
		e.mu.Unlock()
		return nil, ErrAlreadyLeading
	}
	e.mu.Unlock()
	// Close ends the campaign too.
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	stop := context.AfterFunc(e.closeCtx, func() { cancel(pgfence.ErrClosed) })
	defer stop()
	if err := e.awaitTurn(ctx); err != nil {
		if errors.Is(context.Cause(ctx), pgfence.ErrClosed) {
			err = pgfence.ErrClosed
		}
		return nil, fmt.Errorf("pgfence: leader: campaign %q: %w", e.cfg.Election, err)
	}
	for {
		l, err := e.locker.Acquire(ctx, e.cfg.Election, e.opts)
		if err != nil {
			if errors.Is(context.Cause(ctx), pgfence.ErrClosed) {
				return nil, fmt.Errorf("pgfence: leader: campaign %q: %w", e.cfg.Election, pgfence.ErrClosed)
			}
			return nil, fmt.Errorf("pgfence: leader: campaign %q: %w", e.cfg.Election, err)
		}
		lease := l.(*leasetable.Lease)
		t := &Term{e: e, lease: lease, value: e.cfg.Value}
		// The proclamation runs on if ctx ends meanwhile, so that the
		// lease's state is known and it can be given back.
		pctx, pcancel := context.WithTimeout(context.WithoutCancel(ctx), queryTimeout)
		held, err := e.proclaim(pctx, lease, e.cfg.Value)
		pcancel()
		if err == nil && held && ctx.Err() == nil {
			if e.adopt(t) {
				e.cfg.Logger.DebugContext(ctx, "pgfence: leader: leading", "election", e.cfg.Election, "token", t.Token())
				return t, nil
			}
			_ = t.resign(ctx)
			return nil, fmt.Errorf("pgfence: leader: campaign %q: %w", e.cfg.Election, pgfence.ErrClosed)
		}
		_ = t.resign(ctx)
		switch {
		case errors.Is(context.Cause(ctx), pgfence.ErrClosed):
			return nil, fmt.Errorf("pgfence: leader: campaign %q: %w", e.cfg.Election, pgfence.ErrClosed)
		case err != nil:
			return nil, fmt.Errorf("pgfence: leader: campaign %q: proclaim: %w", e.cfg.Election, err)
		case ctx.Err() != nil:
			return nil, fmt.Errorf("pgfence: leader: campaign %q: %w", e.cfg.Election, context.Cause(ctx))
		}
		// The lease was lost between its grant and the proclamation (a
		// pause longer than its TTL): campaign again.
		e.cfg.Logger.WarnContext(ctx, "pgfence: leader: the lease was lost before the term was proclaimed; campaigning again",
			"election", e.cfg.Election, "token", t.Token())
	}
}

// adopt records t as the Elector's term; false when it was closed.
func (e *Elector) adopt(t *Term) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return false
	}
	e.term = t
	return true
}

// Term returns the term this Elector holds, or nil when it does not lead.
// A term returned may have ended since; see [Term.Err].
func (e *Elector) Term() *Term {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.term != nil && e.term.Err() != nil {
		return nil
	}
	return e.term
}

// Resign ends the term this Elector holds, if any, as [Term.Resign] does;
// it returns nil when the Elector does not lead.
func (e *Elector) Resign(ctx context.Context) error {
	e.mu.Lock()
	t := e.term
	e.mu.Unlock()
	if t == nil {
		return nil
	}
	return t.Resign(ctx)
}

// StepAside resigns the term this Elector holds, if any, and keeps the
// Elector from campaigning for d: until then Campaign, and so [Elector.Run],
// waits, however many terms of other candidates begin and end meanwhile.
// A later call replaces the period; a d of zero or less ends it. It
// returns what Resign returns, and [pgfence.ErrClosed] after Close.
func (e *Elector) StepAside(ctx context.Context, d time.Duration) error {
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		return pgfence.ErrClosed
	}
	e.aside = time.Time{}
	if d > 0 {
		e.aside = time.Now().Add(d)
	}
	e.mu.Unlock()
	e.wakeAll() // a Campaign waiting for an earlier period's end
	return e.Resign(ctx)
}

// handover is what a campaign after a resignation waits for: a grant of
// the election's lease newer than token, or until.
type handover struct {
	token int64
	until time.Time
}

// beginHandover makes the next campaigns wait for a hand-over of t: called
// before t's release is sent, so that a campaign cannot slip in between.
func (e *Elector) beginHandover(t *Term) {
	if t.Err() != nil || (e.hooks != nil && e.hooks.noHandover) {
		return // lost, or already being resigned
	}
	e.mu.Lock()
	e.handover = handover{token: t.Token(), until: time.Now().Add(e.cfg.HandoverTimeout)}
	e.mu.Unlock()
}

// grantedSQL reads the token of the election lease's latest grant (%[1]s
// is the schema), held or released: a release keeps the row and its
// token. No row when it was never granted. It takes no locks.
const grantedSQL = `SELECT l.fence FROM %[1]s.pgfence_leases l WHERE l.name OPERATOR(pg_catalog.=) $1`

// awaitTurn returns when this Elector may campaign: once its StepAside
// period is over, and after a resignation once the election's lease has
// been granted since (another candidate took over) or the hand-over's
// bound has passed. It learns of grants from the proclamations' and
// releases' notifications on the observers' LISTEN connection; it returns
// ctx's cause when ctx ends first.
func (e *Elector) awaitTurn(ctx context.Context) error {
	var wake chan struct{}
	defer func() {
		if wake != nil {
			e.removeWatcher(wake)
		}
	}()
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		e.mu.Lock()
		aside, h := e.aside, e.handover
		e.mu.Unlock()
		now := time.Now()
		if !now.Before(aside) && (h.token == 0 || !now.Before(h.until)) {
			return nil
		}
		if wake == nil {
			w, err := e.addWatcher()
			if err != nil {
				return err
			}
			wake = w
		}
		wait := aside.Sub(now)
		if !now.Before(aside) {
			var latest *int64
			err := e.pool.QueryRow(ctx, e.sql.granted, e.cfg.Election).Scan(&latest)
			switch {
			case err == nil && latest != nil && *latest > h.token:
				e.mu.Lock()
				if e.handover == h {
					e.handover = handover{}
				}
				e.mu.Unlock()
				return nil
			case ctx.Err() != nil:
				return context.Cause(ctx)
			case err != nil && !errors.Is(err, pgx.ErrNoRows):
				e.cfg.Logger.WarnContext(ctx, "pgfence: leader: reading the election's last grant failed; waiting out the hand-over",
					"election", e.cfg.Election, "error", err)
			}
			wait = h.until.Sub(now)
		}
		timer.Reset(wait)
		select {
		case <-wake:
		case <-timer.C:
		case <-ctx.Done():
			return context.Cause(ctx)
		}
	}
}

// proclaimSQL records the value of a term through pgfence_leader_proclaim
// (%[1]s is the schema), a SECURITY DEFINER function: only while the term's
// lease is held (name, token, secret, not expired on clock_timestamp()),
// whose row it locks FOR SHARE for the statement; it notifies
// [NotifyChannel] at commit. It returns whether the lease was held.
const proclaimSQL = `SELECT %[1]s.pgfence_leader_proclaim($1, $2, $3, $4)`

func (e *Elector) proclaim(ctx context.Context, l *leasetable.Lease, value string) (held bool, err error) {
	err = e.pool.QueryRow(ctx, e.sql.proclaim, l.Name(), l.Token(), l.Secret(), value).Scan(&held)
	return held, err
}

// Term is one term of leadership: this Elector leads from Campaign's
// return until the term ends. Its methods are safe for concurrent use.
type Term struct {
	e     *Elector
	lease *leasetable.Lease

	mu    sync.Mutex
	value string
}

// Election returns the election's name.
func (t *Term) Election() string { return t.lease.Name() }

// Token returns the term's fencing token: the token of its lease. Every
// later term of the election has a larger one. Present it to guarded
// writes (package fence) so that a leader whose term ended without its
// noticing (a pause) cannot overwrite its successor's work.
func (t *Term) Token() int64 { return t.lease.Token() }

// Value returns the value the term proclaimed last.
func (t *Term) Value() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.value
}

// BeganAt returns when the term began (its lease was granted), on the
// database clock.
func (t *Term) BeganAt() time.Time { return t.lease.AcquiredAt() }

// Expiry returns the term's local deadline, on the local clock: unless its
// lease is renewed first, the term ends then, before the database could
// grant it to another candidate (see [leasetable.Lease.Expiry]).
func (t *Term) Expiry() time.Time { return t.lease.Expiry() }

// Context returns a context cancelled when the term ends: with a cause
// matching [pgfence.ErrLeaseLost] when its lease was lost (not renewed
// before its local deadline, taken over, force-released, or the Locker was
// closed), or [pgfence.ErrNotHeld] after a resignation. Derive the
// leader's work from it. A Campaign of the same election under it returns
// an error matching [pgfence.ErrAlreadyHeld].
func (t *Term) Context() context.Context { return t.lease.Context() }

// Done returns a channel closed when the term ends. It is
// t.Context().Done().
func (t *Term) Done() <-chan struct{} { return t.lease.Done() }

// Err returns nil while the term lasts, and the cause of its end after
// (see [Term.Context]).
func (t *Term) Err() error { return t.lease.Err() }

// Lease returns the term's lease: for lease-checked writes (package
// fence's UnderLease(t.Election())) and [leasetable.Lease.Renew].
func (t *Term) Lease() *leasetable.Lease { return t.lease }

// Proclaim replaces the value the term proclaims, in one statement bounded
// by ctx, and notifies observers. It returns an error matching
// [pgfence.ErrLeaseLost] when the term's lease is no longer held (the term
// has ended or is about to), [pgfence.ErrClosed] after Close, an invalid
// value's error (nothing sent), and database errors wrapped.
func (t *Term) Proclaim(ctx context.Context, value string) error {
	if err := checkValue(value); err != nil {
		return fmt.Errorf("pgfence: leader: proclaim: %w", err)
	}
	if err := t.e.checkOpen(); err != nil {
		return err
	}
	if err := t.Err(); err != nil {
		return fmt.Errorf("pgfence: leader: proclaim in %q: the term has ended: %w", t.Election(), err)
	}
	held, err := t.e.proclaim(ctx, t.lease, value)
	switch {
	case err != nil:
		return fmt.Errorf("pgfence: leader: proclaim in %q (token %d): %w", t.Election(), t.Token(), err)
	case !held:
		return fmt.Errorf("pgfence: leader: proclaim in %q (token %d): the term's lease is not held: %w",
			t.Election(), t.Token(), pgfence.ErrLeaseLost)
	}
	t.mu.Lock()
	t.value = value
	t.mu.Unlock()
	return nil
}

// Resign ends the term and hands the election over at once: it releases
// the term's lease, which wakes the other candidates (within the Locker
// directly, in other Lockers through LISTEN/NOTIFY), and the observers.
// The term's context is cancelled (cause matching [pgfence.ErrNotHeld])
// before the release is sent. The Elector's next Campaign (Run's too)
// leaves the election to them: it waits until the lease has been granted
// to another candidate, or [Config].HandoverTimeout has passed since the
// resignation. Resign returns an error matching [pgfence.ErrNotHeld] when
// the term had already ended by a loss; after one call returned nil or
// that error, later calls return nil. It runs under
// context.WithoutCancel(ctx) bounded by the Locker's QueryTimeout (see
// [leasetable.Lease.Release]), so it works from a defer.
func (t *Term) Resign(ctx context.Context) error {
	t.e.beginHandover(t)
	err := t.resign(ctx)
	if err != nil && !errors.Is(err, pgfence.ErrNotHeld) {
		return fmt.Errorf("pgfence: leader: resign %q (token %d): %w", t.Election(), t.Token(), err)
	}
	return err
}

func (t *Term) resign(ctx context.Context) error {
	err := t.lease.Release(ctx)
	if err == nil || errors.Is(err, pgfence.ErrNotHeld) {
		t.e.mu.Lock()
		if t.e.term == t {
			t.e.term = nil
		}
		t.e.mu.Unlock()
	}
	return err
}

// statements is the Elector's SQL, with its schema filled in.
type statements struct {
	proclaim, current string
	granted           string
}

func newStatements(schema string) statements {
	f := func(tmpl string) string { return fmt.Sprintf(tmpl, schema) }
	s := statements{proclaim: f(proclaimSQL), current: f(currentSQL)}
	s.granted = f(grantedSQL)
	return s
}
