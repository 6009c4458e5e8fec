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
	"github.com/pgfence/pgfence/leasetable"
)

// NotifyChannel announces a new term's proclamation (payload tag:token:mac,
// as on [leasetable.NotifyChannel], which announces resignations).
const NotifyChannel = "pgfence_leader"

// MaxValueLength is the longest value, in bytes of UTF-8, a leader may
// proclaim.
const MaxValueLength = 4096

// DefaultObserveInterval is the default [Config].ObserveInterval.
const DefaultObserveInterval = 5 * time.Second

// DefaultRetryInterval is the default [Config].RetryInterval.
const DefaultRetryInterval = time.Second

// DefaultHandoverTimeout is [Config].HandoverTimeout when it is zero.
const DefaultHandoverTimeout = 500 * time.Millisecond

// queryTimeout bounds the statements the Elector runs on its own behalf.
const queryTimeout = 5 * time.Second

// Config configures an [Elector]; [New] validates it and never modifies it.
type Config struct {
	// Locker takes the election's lease. Required; it stays the caller's and
	// must stay open until Close returns. Electors may share it.
	Locker *leasetable.Locker

	// Election is the name of the election's lease, the same for every
	// candidate, with the rules of lease names. Required.
	Election string

	// Value is what this candidate proclaims when it leads, such as an address;
	// at most [MaxValueLength] bytes, possibly empty.
	Value string

	// TTL is each term's lease TTL; zero means the Locker's. A crashed leader
	// is replaced about TTL after its last renewal.
	TTL time.Duration

	// ObserveInterval bounds how long an observer waits for a notification
	// before it reads again (it also reads at the term's expiry). Zero means
	// [DefaultObserveInterval]; otherwise at least 10ms.
	ObserveInterval time.Duration

	// RetryInterval is [Elector.Run]'s first pause after a failed campaign,
	// doubled per failure up to 30 times. Zero means [DefaultRetryInterval].
	RetryInterval time.Duration

	// HandoverTimeout bounds how long a campaign after a resignation leaves the
	// election to other candidates (see [Term.Resign]). Zero means
	// [DefaultHandoverTimeout].
	HandoverTimeout time.Duration

	// Logger receives failures (Warn) and term changes (Debug); nil is silent.
	Logger *slog.Logger

	// DisableListen turns off the observers' LISTEN connection: they re-read at
	// the term's expiry or after ObserveInterval (behind a transaction pooler).
	DisableListen bool

	// ListenConnConfig, when set, opens the observers' LISTEN connection
	// instead of the pool's configuration (point it at the server behind a
	// transaction pooler). It is copied.
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

// Elector campaigns in one election and observes who leads it. It is safe
// for concurrent use.
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
	notifyKey notifier.Key   // checks notifications (see notify)
	notifyTag string         // the election's tag in notifications

	mu           sync.Mutex
	closed       bool
	term         *Term                      // the term held, if any
	running      bool                       // Run is running
	listener     *notifier.Notifier         // the observers' LISTEN connection, once started
	interestHeld bool                       // the LISTEN connection holds the election's interest key
	watchers     map[chan struct{}]struct{} // buffered(1): wake an observer
	notifiedTerm int64                      // the newest term a notification announced (see notify)
	aside        time.Time                  // StepAside: no campaign before then
	handover     handover                   // the last resignation's, until it ends
}

// testHooks change an Elector's behaviour for tests (export_handover_test.go).
type testHooks struct {
	noHandover bool // a campaign after a resignation does not wait
	noInterest bool // observers take no interest key
}

// New returns an Elector for cfg.Election that campaigns with cfg.Locker
// and reads through pool. It returns an error naming the field for an
// invalid cfg, and one matching [pgfence.ErrNotInstalled] when the schema
// is not as this code needs. ctx bounds only New. Close does not close the
// pool.
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
	key, err := notifier.LoadKey(ctx, pool, quoted)
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

// Close resigns the term held, makes a Campaign in progress return
// [pgfence.ErrClosed], closes every Observe channel, and returns once its
// goroutines stopped. It closes neither the Locker nor the pool. It is
// idempotent; the Elector's methods then return [pgfence.ErrClosed].
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

// ErrAlreadyLeading is returned by [Elector.Campaign] while the Elector
// holds a term. It matches [pgfence.ErrAlreadyHeld].
var ErrAlreadyLeading error = alreadyLeadingError{}

type alreadyLeadingError struct{}

func (alreadyLeadingError) Error() string { return "pgfence: leader: this Elector already leads" }

func (alreadyLeadingError) Is(target error) bool {
	return target == pgfence.ErrAlreadyHeld || target == pgfence.ErrNotAcquired
}

// Campaign waits until this Elector leads, acquiring the election's lease
// and proclaiming [Config].Value, and returns the term once both committed.
// After a resignation it first leaves the election to others (see
// [Term.Resign], [Elector.StepAside]). ctx bounds the wait, not the term.
//
// It returns an error wrapping ctx's cause (a lease taken meanwhile is given
// back), [ErrAlreadyLeading], [pgfence.ErrClosed], or a database error,
// without retrying: [Elector.Run] retries.
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
		// The proclamation outlives ctx, so that the lease can be given back.
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
		// The lease was lost before the proclamation: campaign again.
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

// Term returns the term held, or nil; it may have ended since.
func (e *Elector) Term() *Term {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.term != nil && e.term.Err() != nil {
		return nil
	}
	return e.term
}

// Resign is [Term.Resign] for the term held; nil when it does not lead.
func (e *Elector) Resign(ctx context.Context) error {
	e.mu.Lock()
	t := e.term
	e.mu.Unlock()
	if t == nil {
		return nil
	}
	return t.Resign(ctx)
}

// StepAside resigns and keeps the Elector from campaigning for d; a later
// call replaces the period, d <= 0 ends it. It returns Resign's error, or
// [pgfence.ErrClosed].
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

// beginHandover makes the next campaigns wait for a hand-over of t, before
// t's release is sent.
func (e *Elector) beginHandover(t *Term) {
	if t.Err() != nil || (e.hooks != nil && e.hooks.noHandover) {
		return // lost, or already being resigned
	}
	e.mu.Lock()
	e.handover = handover{token: t.Token(), until: time.Now().Add(e.cfg.HandoverTimeout)}
	e.mu.Unlock()
}

// grantedSQL reads the token of the election lease's latest grant (%[1]s is
// the schema); no row when never granted.
const grantedSQL = `SELECT l.fence FROM %[1]s.pgfence_leases l WHERE l.name OPERATOR(pg_catalog.=) $1`

// awaitTurn returns once StepAside's period is over and, after a
// resignation, once another candidate was granted the lease (learnt from
// notifications) or the hand-over's bound passed; or ctx's cause.
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

// proclaimSQL records a term's value through pgfence_leader_proclaim
// (%[1]s is the schema), only while the lease is held with its secret; it
// notifies [NotifyChannel] at commit and returns whether the lease was held.
const proclaimSQL = `SELECT %[1]s.pgfence_leader_proclaim($1, $2, $3, $4)`

func (e *Elector) proclaim(ctx context.Context, l *leasetable.Lease, value string) (held bool, err error) {
	err = e.pool.QueryRow(ctx, e.sql.proclaim, l.Name(), l.Token(), l.Secret(), value).Scan(&held)
	return held, err
}

// Term is one term of leadership, from Campaign's return until it ends. Its
// methods are safe for concurrent use.
type Term struct {
	e     *Elector
	lease *leasetable.Lease

	mu    sync.Mutex
	value string
}

// Election returns the election's name.
func (t *Term) Election() string { return t.lease.Name() }

// Token returns the term's fencing token, larger for every later term.
func (t *Term) Token() int64 { return t.lease.Token() }

// Value returns the value the term proclaimed last.
func (t *Term) Value() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.value
}

// BeganAt returns when the lease was granted, on the database clock.
func (t *Term) BeganAt() time.Time { return t.lease.AcquiredAt() }

// Expiry returns the term's local deadline ([leasetable.Lease.Expiry]).
func (t *Term) Expiry() time.Time { return t.lease.Expiry() }

// Context is cancelled when the term ends, with a cause matching
// [pgfence.ErrLeaseLost] on loss or [pgfence.ErrNotHeld] after a
// resignation.
func (t *Term) Context() context.Context { return t.lease.Context() }

// Done returns t.Context().Done().
func (t *Term) Done() <-chan struct{} { return t.lease.Done() }

// Err returns nil while the term lasts, then the cause of its end.
func (t *Term) Err() error { return t.lease.Err() }

// Lease returns the term's lease, for lease-checked writes (its Secret).
func (t *Term) Lease() *leasetable.Lease { return t.lease }

// Proclaim replaces the term's value and notifies observers. It returns an
// error matching [pgfence.ErrLeaseLost] when the lease is no longer held,
// [pgfence.ErrClosed], an invalid value's error, or a database error.
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

// Resign ends the term, cancelling its context (cause [pgfence.ErrNotHeld]),
// and releases the lease, waking the other candidates. The Elector's next
// Campaign waits until another candidate was granted the lease or
// [Config].HandoverTimeout passed. It returns an error matching
// [pgfence.ErrNotHeld] when the term was already lost; later calls return
// nil. It runs under context.WithoutCancel(ctx), so it works from a defer.
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
