package leasetable

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgfence/pgfence"
	"github.com/pgfence/pgfence/internal/leasename"
)

// DefaultTTL is the default of [Config].TTL.
const DefaultTTL = 30 * time.Second

// MinTTL is the smallest TTL a lease may have.
const MinTTL = 100 * time.Millisecond

// MaxTTL is the longest TTL, and the longest [AcquireOpts].AtLeast, a lease
// may have; pgfence's functions refuse longer ones too.
const MaxTTL = 7 * 24 * time.Hour

// DefaultQueryTimeout is the default of [Config].QueryTimeout.
const DefaultQueryTimeout = 5 * time.Second

// MaxNameLength is the longest lease name, and owner id, in bytes. Names
// must be valid UTF-8 without control characters (U+0000-U+001F, U+007F).
const MaxNameLength = 512

// DefaultListenCheckInterval is the default of [Config].ListenCheckInterval.
const DefaultListenCheckInterval = 15 * time.Second

// minListenCheckInterval is the shortest [Config].ListenCheckInterval.
const minListenCheckInterval = 100 * time.Millisecond

// maxListenCheckTimeout caps the LISTEN connection's health check.
const maxListenCheckTimeout = 5 * time.Second

// NotifyChannel is the LISTEN/NOTIFY channel on which releases are
// announced, each with a keyed tag of the lease name instead of the name.
const NotifyChannel = "pgfence_lease_released"

// InterestClassID is the first argument of the two-argument advisory locks
// that waiting calls take shared, on their Locker's LISTEN connection, so
// that a release of their lease notifies them (pgfence_notify_waiters): the
// bytes "pgfl". The second is the first 4 bytes of the name's notification
// tag. Other clients of the database should not use it as the first
// argument of such locks: held shared, it makes every release of a name
// notify; held exclusively, it delays waiters' registration.
const InterestClassID int32 = 0x7067666c

// Config configures a [Locker]. A nil *Config, and every zero field, means the
// documented default. [New] validates it and returns an error naming the bad
// field; the caller's Config is never modified.
type Config struct {
	// Schema is the schema pgfence's migrations were installed in. Empty
	// means [pgfence.DefaultSchema].
	Schema string

	// TTL is how long a lease stays held after it was acquired or last
	// renewed, on the database clock. Zero means [DefaultTTL]; it must be at
	// least [MinTTL]. [AcquireOpts].TTL overrides it for one lease.
	TTL time.Duration

	// RenewInterval is how often a lease is renewed. Zero means TTL/3. It
	// scales with a lease's own TTL.
	RenewInterval time.Duration

	// SafetyMargin is how much earlier than the database the holder gives a
	// lease up: its local deadline is the last successful acquire or renewal
	// request's send time + TTL - SafetyMargin, on the monotonic clock. Zero
	// means TTL/10; it scales like RenewInterval. 2*RenewInterval +
	// SafetyMargin must not exceed TTL.
	SafetyMargin time.Duration

	// Owner identifies this Locker in the owner column, for operators. Empty
	// means "hostname/pid/random". It follows the rules of lease names.
	Owner string

	// Logger receives renewal failures, retries, losses and LISTEN
	// reconnects, each with the context of the work it describes. Nil means
	// silent.
	Logger *slog.Logger

	// Observer, when not nil, receives the Locker's typed events, background
	// ones from a delivery goroutine; see "Observing" in the package
	// documentation.
	Observer pgfence.Observer

	// QueryTimeout bounds each statement the Locker runs on its own behalf
	// (a renewal attempt, a release, an acquire statement after its callers
	// left), each wait for a pool connection, and the retries of TryAcquire
	// and Release. Zero means [DefaultQueryTimeout].
	QueryTimeout time.Duration

	// DisableListen turns off the LISTEN connection: a release by another
	// Locker then reaches waiters only at the holder's expiry. Use it when no
	// session connection to the server is available.
	DisableListen bool

	// ListenConnConfig, when not nil, opens the LISTEN connection, and the
	// connections on which waiting permit calls hold their place in a
	// semaphore's line (one per semaphore waited for, kept briefly for
	// reuse), instead of the pool's configuration: point it at the server
	// when the pool goes through a transaction-pooling PgBouncer. It is
	// copied; its OnNotification is not called.
	ListenConnConfig *pgx.ConnConfig

	// ListenCheckInterval is how long the LISTEN connection may receive
	// nothing before a round trip checks it; one not answered within the
	// interval (at most 5s) is replaced. Zero means
	// [DefaultListenCheckInterval]; otherwise it must be at least 100ms. A
	// negative value turns the check off.
	ListenCheckInterval time.Duration
}

// AcquireOpts are an acquire's options. The lease table honours TTL (this
// lease's TTL, at least [MinTTL]; zero means the Locker's), WaitTimeout
// (bounds Acquire's wait), AtLeast (the row stays held until acquired_at +
// AtLeast even when released earlier) and MaxHold (the lease is released
// then, as lost with [pgfence.ErrMaxHold]). Shared is rejected.
type AcquireOpts = pgfence.AcquireOpts

// resolve returns a copy of c, ListenConnConfig included, with defaults
// filled in, or an error naming the first invalid field.
func (c *Config) resolve() (Config, error) {
	var s Config
	if c != nil {
		s = *c
	}
	if s.TTL == 0 {
		s.TTL = DefaultTTL
	}
	if s.TTL < MinTTL || s.TTL > MaxTTL {
		return s, fmt.Errorf("pgfence: leasetable: Config.TTL is %v; it must be between %v and %v (zero means %v)", s.TTL, MinTTL, MaxTTL, DefaultTTL)
	}
	if s.RenewInterval < 0 {
		return s, fmt.Errorf("pgfence: leasetable: Config.RenewInterval is %v; it must not be negative", s.RenewInterval)
	}
	if s.RenewInterval == 0 {
		s.RenewInterval = s.TTL / 3
	}
	if s.SafetyMargin < 0 {
		return s, fmt.Errorf("pgfence: leasetable: Config.SafetyMargin is %v; it must not be negative", s.SafetyMargin)
	}
	if s.SafetyMargin == 0 {
		s.SafetyMargin = s.TTL / 10
	}
	if 2*s.RenewInterval+s.SafetyMargin > s.TTL {
		return s, fmt.Errorf("pgfence: leasetable: Config.TTL %v is too short for RenewInterval %v and SafetyMargin %v: "+
			"it must be at least 2*RenewInterval + SafetyMargin so a failed renewal can be retried before the lease is given up",
			s.TTL, s.RenewInterval, s.SafetyMargin)
	}
	if s.QueryTimeout < 0 {
		return s, fmt.Errorf("pgfence: leasetable: Config.QueryTimeout is %v; it must not be negative", s.QueryTimeout)
	}
	if s.QueryTimeout == 0 {
		s.QueryTimeout = DefaultQueryTimeout
	}
	if s.Owner == "" {
		s.Owner = defaultOwner()
	}
	if err := checkText("Config.Owner", s.Owner); err != nil {
		return s, err
	}
	if s.Logger == nil {
		s.Logger = slog.New(slog.DiscardHandler)
	}
	if s.ListenCheckInterval == 0 {
		s.ListenCheckInterval = DefaultListenCheckInterval
	}
	if s.ListenCheckInterval > 0 && s.ListenCheckInterval < minListenCheckInterval {
		return s, fmt.Errorf("pgfence: leasetable: Config.ListenCheckInterval is %v; it must be at least %v "+
			"(zero means %v, a negative value turns the check off)",
			s.ListenCheckInterval, minListenCheckInterval, DefaultListenCheckInterval)
	}
	if s.ListenConnConfig != nil {
		s.ListenConnConfig = s.ListenConnConfig.Copy()
	}
	return s, nil
}

// leaseTiming is one lease's timing, scaled to its TTL.
type leaseTiming struct {
	ttl, renewEvery, margin, atLeast, maxHold time.Duration
}

// timing returns the timing of a lease acquired with o.
func (c *Config) timing(o *AcquireOpts) (leaseTiming, error) {
	t := leaseTiming{ttl: c.TTL, renewEvery: c.RenewInterval, margin: c.SafetyMargin}
	if o == nil {
		return t, nil
	}
	if o.TTL < 0 {
		return t, fmt.Errorf("pgfence: leasetable: AcquireOpts.TTL is %v; it must not be negative (zero means the Locker's TTL)", o.TTL)
	}
	if o.TTL != 0 && (o.TTL < MinTTL || o.TTL > MaxTTL) {
		return t, fmt.Errorf("pgfence: leasetable: AcquireOpts.TTL is %v; it must be between %v and %v", o.TTL, MinTTL, MaxTTL)
	}
	if o.WaitTimeout < 0 {
		return t, fmt.Errorf("pgfence: leasetable: AcquireOpts.WaitTimeout is %v; it must not be negative", o.WaitTimeout)
	}
	if o.Shared {
		return t, errors.New("pgfence: leasetable: AcquireOpts.Shared is set; a lease has one holder (shared locks are advisory's)")
	}
	if o.AtLeast < 0 || o.AtLeast > MaxTTL {
		return t, fmt.Errorf("pgfence: leasetable: AcquireOpts.AtLeast is %v; it must be between 0 and %v", o.AtLeast, MaxTTL)
	}
	if o.MaxHold < 0 {
		return t, fmt.Errorf("pgfence: leasetable: AcquireOpts.MaxHold is %v; it must not be negative (zero means no bound)", o.MaxHold)
	}
	t.atLeast, t.maxHold = o.AtLeast, o.MaxHold
	if o.TTL != 0 && o.TTL != c.TTL {
		scale := func(d time.Duration) time.Duration {
			return time.Duration(float64(d) * float64(o.TTL) / float64(c.TTL))
		}
		t.ttl, t.renewEvery, t.margin = o.TTL, scale(c.RenewInterval), scale(c.SafetyMargin)
	}
	return t, nil
}

// checkText rejects, before anything is sent, what the table would.
// Control characters would forge lines in operators' terminals.
func checkText(what, v string) error {
	p := leasename.Check(v, MaxNameLength)
	if p == nil {
		return nil
	}
	switch p.Kind {
	case leasename.Empty:
		return fmt.Errorf("pgfence: leasetable: %s is empty", what)
	case leasename.TooLong:
		return fmt.Errorf("pgfence: leasetable: %s is %d bytes long; at most %d are allowed", what, p.Len, p.Max)
	case leasename.NotUTF8:
		return fmt.Errorf("pgfence: leasetable: %s is not valid UTF-8", what)
	case leasename.NUL:
		return fmt.Errorf("pgfence: leasetable: %s contains a NUL byte", what)
	default: // another control character
		return fmt.Errorf("pgfence: leasetable: %s contains the control character %U at byte %d", what, p.Char, p.Index)
	}
}

func defaultOwner() string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "unknown-host"
	}
	var rnd [6]byte
	_, _ = rand.Read(rnd[:])
	owner := fmt.Sprintf("%s/%d/%s", host, os.Getpid(), hex.EncodeToString(rnd[:]))
	if len(owner) > MaxNameLength {
		owner = owner[len(owner)-MaxNameLength:]
	}
	return owner
}

var errNilPool = errors.New("pgfence: leasetable: pool is nil")
