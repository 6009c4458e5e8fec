package leasetable

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"

	"github.com/pgfence/pgfence"
)

// DefaultTTL is the lease time-to-live used when [Config].TTL is zero.
const DefaultTTL = 30 * time.Second

// MinTTL is the smallest TTL a lease may have. Shorter leases cannot be
// renewed reliably across a network round trip and a scheduling delay.
const MinTTL = 100 * time.Millisecond

// MaxTTL is the longest TTL, and the longest [AcquireOpts].AtLeast, a lease
// may have; pgfence's functions refuse longer ones too, so no expiry in the
// table lies further ahead.
const MaxTTL = 7 * 24 * time.Hour

// DefaultQueryTimeout bounds each statement the Locker runs on its own
// (a renewal attempt, a release) when [Config].QueryTimeout is zero.
const DefaultQueryTimeout = 5 * time.Second

// MaxNameLength is the longest lease name, in bytes, that the lease table
// accepts. Names must be valid UTF-8 without control characters
// (U+0000-U+001F, U+007F): they would forge lines and escape sequences in
// operators' terminals and logs. The same limit applies to owner ids.
const MaxNameLength = 512

// DefaultListenCheckInterval is how long the LISTEN connection may stay
// silent before it is checked, when [Config].ListenCheckInterval is zero.
const DefaultListenCheckInterval = 15 * time.Second

// minListenCheckInterval is the shortest [Config].ListenCheckInterval
// accepted: shorter ones would spend the connection on checks.
const minListenCheckInterval = 100 * time.Millisecond

// maxListenCheckTimeout bounds the health check of the LISTEN connection
// when [Config].ListenCheckInterval is longer.
const maxListenCheckTimeout = 5 * time.Second

// NotifyChannel is the LISTEN/NOTIFY channel on which a release is announced;
// the payload is the lease name. Waiters in [Locker.Acquire] wake on it.
const NotifyChannel = "pgfence_lease_released"

// Config configures a [Locker]. A nil *Config, and every zero field, means the
// documented default. [New] validates it and returns an error naming the bad
// field; the caller's Config is never modified.
type Config struct {
	// Schema is the schema pgfence's migrations were applied to. Empty
	// means [pgfence.DefaultSchema]. Every statement names it.
	Schema string

	// TTL is how long a lease stays held in the database after it was
	// acquired or last renewed, judged on the database clock. Zero means
	// [DefaultTTL]; it must be at least [MinTTL]. [AcquireOpts].TTL overrides
	// it for one lease.
	TTL time.Duration

	// RenewInterval is how often the watchdog renews a lease of length TTL.
	// Zero means TTL/3. Leases whose TTL differs from TTL (through
	// [AcquireOpts]) are renewed at the same fraction of their own TTL.
	RenewInterval time.Duration

	// SafetyMargin is how much earlier than the database the holder gives a
	// lease up: a lease whose renewals fail is considered lost at
	// (time the last successful acquire or renew request was sent) + TTL -
	// SafetyMargin, measured on the local monotonic clock. It absorbs clock
	// rate differences between the client and the server and the delay
	// between noticing the loss and stopping work. Zero means TTL/10. It
	// scales with the lease's TTL like RenewInterval.
	//
	// TTL must leave room for two renewal attempts before that deadline:
	// 2*RenewInterval + SafetyMargin <= TTL.
	SafetyMargin time.Duration

	// Owner identifies this Locker in the owner column, for operators (see
	// [Locker.List]), and is checked on release together with the token.
	// Zero means "hostname/pid/random", unique per Locker. Lockers sharing
	// an Owner are still safe (tokens are unique), but operators cannot
	// tell their leases apart. At most [MaxNameLength] bytes of valid UTF-8
	// without control characters (U+0000-U+001F, U+007F), the same rule
	// as for lease names.
	Owner string

	// Logger receives renewal failures, retries, losses and listener
	// reconnects. Nil means silent. Every record is logged with a context:
	// the caller's for what a call does, the acquiring ctx's values for a
	// lease's background work (renewal, loss, a release retried later),
	// context.Background() for the LISTEN connection's.
	Logger *slog.Logger

	// Observer, when not nil, receives the Locker's typed events
	// ([pgfence.Acquired], [pgfence.NotAcquired], [pgfence.Released] on the
	// caller's goroutine; [pgfence.Renewed], [pgfence.RenewalFailed],
	// [pgfence.Lost], [pgfence.ListenLost], [pgfence.ListenRestored] from
	// one delivery goroutine, so that a slow Observer never delays a
	// renewal); see [pgfence.Observer]. When it also implements
	// [pgfence.OpObserver], acquires, releases and renewal round trips are
	// bracketed by StartOp and EndOp. Nil costs a nil check per event.
	Observer pgfence.Observer

	// QueryTimeout bounds each statement the Locker runs on its own behalf
	// rather than within a caller's context: each renewal attempt (also
	// never past the lease's local deadline), each release (also from
	// [Locker.Close] and [Locker.Do]), the give-back of a lease whose
	// acquirer stopped waiting, and how long an acquire statement runs on
	// after its last caller stopped waiting; and how long TryAcquire and a
	// release retry transient database errors (see "Failover" in the
	// package documentation). It also bounds each wait for a
	// connection from the pool, by any statement of the Locker's (an
	// acquire too, whatever its caller's context): a pool that gives none
	// in time (exhausted) fails the statement with an error saying so, with
	// the pool's MaxConns and acquired connections. A renewal attempt that
	// times out is retried like a failed one. Zero means
	// [DefaultQueryTimeout].
	QueryTimeout time.Duration

	// DisableListen turns off the LISTEN connection. Waiters in
	// [Locker.Acquire] are then still woken at once by releases (and losses)
	// of leases held by the same Locker, but a release by another Locker
	// reaches them only at the holder's expiry time: a hand-over across
	// Lockers after an early release waits until the released lease's
	// original expiry. Use it when no direct (session) connection to the
	// server is available, for example behind a transaction-pooling
	// PgBouncer without a ListenConnConfig.
	DisableListen bool

	// ListenConnConfig, when not nil, is used to open the LISTEN connection
	// instead of the pool's connection configuration. Point it at the server
	// directly when the pool goes through a transaction-pooling PgBouncer,
	// where LISTEN does not work (the Locker detects that at connect, logs
	// a Warn once and falls back to timed retries). It is copied; the caller's value is not
	// modified. Whichever configuration is used, the LISTEN connection
	// handles a context that ends by setting a deadline on the network
	// connection (pgconn's DeadlineContextWatcherHandler, pgx's default),
	// never by sending a cancel request: see ListenCheckInterval. Its
	// OnNotification callback, if any, is not called: the Locker reads the
	// connection's notifications itself.
	ListenConnConfig *pgx.ConnConfig

	// ListenCheckInterval is how long the LISTEN connection may go without
	// receiving a notification before the Locker checks it with a round
	// trip (it repeats the LISTEN statement, a no-op on a listening
	// session). The check must be answered within ListenCheckInterval or 5
	// seconds, whichever is shorter; otherwise the connection is closed,
	// re-opened with backoff, and every waiter retries once it is back (a
	// Warn is logged). This notices a connection that died silently
	// (firewall or NAT state dropped, a partition without a reset, a proxy
	// that stopped forwarding), which would otherwise delay every hand-over
	// until the holder's expiry for as long as it lingers: waiters now
	// retry within about ListenCheckInterval plus the check's timeout (and
	// the reconnect) of the connection's last sign of life. The cost is one
	// round trip per ListenCheckInterval on a quiet channel, once the
	// Locker has waited (the LISTEN connection opens on the first wait).
	//
	// Zero means [DefaultListenCheckInterval]; otherwise it must be at
	// least 100ms. A negative value turns the check off: a dead connection
	// is then replaced only when the operating system reports it broken
	// (through TCP keepalive, if the dialer enables it, as Go's default
	// dialer does; never while a proxy in between keeps the TCP connection
	// alive). It has no effect with DisableListen.
	ListenCheckInterval time.Duration
}

// The lease table honours these fields of [pgfence.AcquireOpts]:
//
//   - TTL overrides the Locker's TTL for this lease. Zero means the
//     Locker's TTL; otherwise it must be at least [MinTTL]. The lease is
//     renewed at the same fraction of this TTL as configured for the
//     Locker's TTL.
//   - WaitTimeout bounds how long [Locker.Acquire] and [Locker.Do] wait.
//   - AtLeast keeps the lease held for at least this long after it was
//     acquired (on the database clock), even when it is released earlier:
//     Release then leaves expires_at at acquired_at + AtLeast. This is
//     ShedLock's lockAtLeastFor: a short scheduled job does not run a
//     second time on a node whose schedule fires slightly later.
//
// Shared is rejected: a lease has one holder.
type AcquireOpts = pgfence.AcquireOpts

// resolve returns a copy of c with defaults filled in, or an error naming
// the first invalid field. ListenConnConfig, when set, is copied too, so
// later changes by the caller do not reach the Locker.
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

// leaseTiming is the timing of one lease: its TTL and the renewal interval
// and safety margin scaled to it.
type leaseTiming struct {
	ttl, renewEvery, margin, atLeast, maxHold time.Duration
}

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

// checkText rejects values the lease table's CHECK constraints or the text
// type would reject, before anything is sent.
func checkText(what, v string) error {
	switch {
	case v == "":
		return fmt.Errorf("pgfence: leasetable: %s is empty", what)
	case len(v) > MaxNameLength:
		return fmt.Errorf("pgfence: leasetable: %s is %d bytes long; at most %d are allowed", what, len(v), MaxNameLength)
	case !utf8.ValidString(v):
		return fmt.Errorf("pgfence: leasetable: %s is not valid UTF-8", what)
	case strings.IndexByte(v, 0) >= 0:
		return fmt.Errorf("pgfence: leasetable: %s contains a NUL byte", what)
	}
	// Control characters would forge lines and escape sequences in
	// operators' terminals and logs (pgfence ls, psql).
	if i := strings.IndexFunc(v, func(r rune) bool { return r < 0x20 || r == 0x7f }); i >= 0 {
		return fmt.Errorf("pgfence: leasetable: %s contains the control character %U at byte %d", what, v[i], i)
	}
	return nil
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
