package advisory

import (
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/pgfence/pgfence"
)

// Defaults used for the zero fields of a [Config].
const (
	DefaultMaxSessions           = 4
	DefaultSessionCheckInterval  = time.Second
	DefaultListenCheckInterval   = 15 * time.Second
	DefaultQueryTimeout          = 3 * time.Second
	DefaultMaxPollInterval       = 200 * time.Millisecond
	DefaultTCPKeepalivesIdle     = 5 * time.Second
	DefaultTCPKeepalivesInterval = 2 * time.Second
	DefaultTCPKeepalivesCount    = 3
	DefaultTCPUserTimeout        = 10 * time.Second
	DefaultSessionIdleTimeout    = time.Minute
	DefaultApplicationName       = "pgfence-advisory"
)

// minPollInterval is the first pause of a polling wait; it doubles up to
// MaxPollInterval.
const minPollInterval = 5 * time.Millisecond

// minWakeGap is the least time between two attempts of a waiting call woken
// by notifications: the bound on what forged notifications can cost.
const minWakeGap = 25 * time.Millisecond

// Config configures a [Locker]. A nil *Config, and every zero field, means
// the default. [New] returns an error for negative or inconsistent values.
type Config struct {
	// Schema is the schema pgfence is installed in. Default
	// [pgfence.DefaultSchema].
	Schema string

	// MaxSessions bounds the connections the Locker opens to hold session
	// locks; every lock shares one of them, and waits may park on all but
	// one. Set it to 1 where connections are scarce.
	MaxSessions int

	// SessionCheckInterval is how often the watchdog checks each idle lock
	// session. A dead or hung session is noticed at most
	// SessionCheckInterval + QueryTimeout after it stopped answering.
	SessionCheckInterval time.Duration

	// ListenCheckInterval is how long the LISTEN connection may stay silent
	// before it is checked; negative turns the check off.
	ListenCheckInterval time.Duration

	// QueryTimeout bounds each statement on a lock session and each dial.
	// A statement that times out fails its session, losing its locks.
	QueryTimeout time.Duration

	// MaxPollInterval is the longest pause of a polling wait between two
	// attempts; notifications usually end a pause sooner.
	MaxPollInterval time.Duration

	// TCPKeepalivesIdle, TCPKeepalivesInterval (whole seconds) and
	// TCPKeepalivesCount set the server's keepalives on every lock
	// session, so the server drops the session of a vanished client and
	// releases its locks.
	TCPKeepalivesIdle     time.Duration
	TCPKeepalivesInterval time.Duration
	TCPKeepalivesCount    int

	// TCPUserTimeout (whole milliseconds) sets the server's
	// tcp_user_timeout on every lock session.
	TCPUserTimeout time.Duration

	// SessionIdleTimeout is how long a lock session may hold no lock before
	// it is closed.
	SessionIdleTimeout time.Duration

	// ApplicationName is the application_name of lock sessions; the LISTEN
	// connection's has "-listen" appended.
	ApplicationName string

	// DisableListen turns off wake-ups by NOTIFY, and with them the LISTEN
	// connection: polling waits then retry only at their pace.
	DisableListen bool

	// Logger receives diagnostics: sessions opened and retired (Debug),
	// sessions that failed or were lost (Warn). Records carry the context
	// of the call they concern. Default: discard.
	Logger *slog.Logger

	// Observer receives the Locker's typed events (see [pgfence.Observer]).
	// Nil sends nothing.
	Observer pgfence.Observer
}

// resolve returns a copy of c with defaults filled in, or an error naming the
// first invalid field.
func (c *Config) resolve() (Config, error) {
	var r Config
	if c != nil {
		r = *c
	}
	if r.MaxSessions < 0 {
		return r, fmt.Errorf("pgfence: advisory: Config.MaxSessions is negative (%d)", r.MaxSessions)
	}
	if r.TCPKeepalivesCount < 0 {
		return r, fmt.Errorf("pgfence: advisory: Config.TCPKeepalivesCount is negative (%d)", r.TCPKeepalivesCount)
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{
		{"SessionCheckInterval", r.SessionCheckInterval},
		{"QueryTimeout", r.QueryTimeout},
		{"MaxPollInterval", r.MaxPollInterval},
		{"TCPKeepalivesIdle", r.TCPKeepalivesIdle},
		{"TCPKeepalivesInterval", r.TCPKeepalivesInterval},
		{"TCPUserTimeout", r.TCPUserTimeout},
		{"SessionIdleTimeout", r.SessionIdleTimeout},
	} {
		if d.v < 0 {
			return r, fmt.Errorf("pgfence: advisory: Config.%s is negative (%v)", d.name, d.v)
		}
	}
	setDefault(&r.MaxSessions, DefaultMaxSessions)
	setDefault(&r.SessionCheckInterval, DefaultSessionCheckInterval)
	setDefault(&r.ListenCheckInterval, DefaultListenCheckInterval)
	setDefault(&r.QueryTimeout, DefaultQueryTimeout)
	setDefault(&r.MaxPollInterval, DefaultMaxPollInterval)
	setDefault(&r.TCPKeepalivesIdle, DefaultTCPKeepalivesIdle)
	setDefault(&r.TCPKeepalivesInterval, DefaultTCPKeepalivesInterval)
	setDefault(&r.TCPKeepalivesCount, DefaultTCPKeepalivesCount)
	setDefault(&r.TCPUserTimeout, DefaultTCPUserTimeout)
	setDefault(&r.SessionIdleTimeout, DefaultSessionIdleTimeout)
	setDefault(&r.ApplicationName, DefaultApplicationName)
	if r.Logger == nil {
		r.Logger = slog.New(slog.DiscardHandler)
	}
	if r.TCPKeepalivesIdle%time.Second != 0 || r.TCPKeepalivesInterval%time.Second != 0 {
		return r, errors.New("pgfence: advisory: Config.TCPKeepalivesIdle and TCPKeepalivesInterval must be whole seconds")
	}
	if r.TCPUserTimeout%time.Millisecond != 0 {
		return r, errors.New("pgfence: advisory: Config.TCPUserTimeout must be whole milliseconds")
	}
	// A partitioned holder must learn of the loss before the server drops
	// its session (docs/advisory.md, Loss detection).
	notice := r.SessionCheckInterval + r.QueryTimeout
	keepalive := r.TCPKeepalivesIdle + time.Duration(r.TCPKeepalivesCount)*r.TCPKeepalivesInterval - r.SessionCheckInterval
	if notice >= r.TCPUserTimeout || notice >= keepalive {
		return r, fmt.Errorf("pgfence: advisory: Config: SessionCheckInterval + QueryTimeout (%v) must be shorter than TCPUserTimeout (%v) "+
			"and than TCPKeepalivesIdle + TCPKeepalivesInterval × TCPKeepalivesCount − SessionCheckInterval (%v), "+
			"so a partitioned holder learns of the loss before the server releases its locks",
			notice, r.TCPUserTimeout, keepalive)
	}
	return r, nil
}

func setDefault[T comparable](p *T, def T) {
	var zero T
	if *p == zero {
		*p = def
	}
}
