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
	// DefaultMaxSessions is the default number of database sessions a
	// Locker may open to hold its session locks (any number of locks fit
	// on one session). A session runs one statement at a time, and the
	// lock requests (and unlocks) that queue on it meanwhile are combined
	// into the next one: one round trip, and at most one WAL flush, for
	// all their tokens. So a Locker fills one session first and opens
	// another only when 32 acquisitions are in flight on every open one:
	// a busy Locker is faster on few sessions, each combining many grants
	// per statement, than on many, each waiting for statements and
	// flushes of its own (bench/results, scenarios 10 and 12, has the
	// figures). A waiting Acquire may also park on an idle session, or
	// open one, to wait in the server (see Waiting in the package
	// documentation); at most MaxSessions-1 are parked. Set MaxSessions
	// to 1 where connections are scarce (nothing parks then).
	DefaultMaxSessions = 4
	// DefaultSessionCheckInterval is the default interval between two
	// liveness checks of an idle lock session.
	DefaultSessionCheckInterval = time.Second
	// DefaultListenCheckInterval is the default time the LISTEN connection
	// may stay silent before it is checked.
	DefaultListenCheckInterval = 15 * time.Second
	// DefaultQueryTimeout is the default bound on each round trip on a lock
	// session (liveness check, lock, unlock) and on opening one.
	DefaultQueryTimeout = 3 * time.Second
	// DefaultMaxPollInterval is the default longest pause of a waiting Lock
	// between two attempts.
	DefaultMaxPollInterval = 200 * time.Millisecond
	// DefaultTCPKeepalivesIdle is the default tcp_keepalives_idle of a lock
	// session: the server sends its first keepalive probe after this long
	// without traffic.
	DefaultTCPKeepalivesIdle = 5 * time.Second
	// DefaultTCPKeepalivesInterval is the default tcp_keepalives_interval
	// of a lock session: the pause between unanswered keepalive probes.
	DefaultTCPKeepalivesInterval = 2 * time.Second
	// DefaultTCPKeepalivesCount is the default tcp_keepalives_count of a
	// lock session: the server drops the connection after this many
	// unanswered probes.
	DefaultTCPKeepalivesCount = 3
	// DefaultTCPUserTimeout is the default tcp_user_timeout of a lock
	// session: the server drops the connection when data it sent stays
	// unacknowledged this long.
	DefaultTCPUserTimeout = 10 * time.Second
	// DefaultSessionIdleTimeout is the default time after which a lock
	// session that holds no lock is closed.
	DefaultSessionIdleTimeout = time.Minute
	// DefaultApplicationName is the default application_name of lock
	// sessions, as shown in pg_stat_activity.
	DefaultApplicationName = "pgfence-advisory"
)

// minPollInterval is the first pause of a waiting Lock; it doubles up to
// MaxPollInterval.
const minPollInterval = 5 * time.Millisecond

// minWakeGap is the least time between two attempts of a waiting Acquire
// woken by notifications for its key: the bound on what forged
// notifications can make a Locker send (see Waiting in the package
// documentation).
const minWakeGap = 25 * time.Millisecond

// Config configures a [Locker]. A nil *Config, and every zero field, means
// the default. [New] validates it and returns an error for negative or
// inconsistent values.
type Config struct {
	// Schema is the schema pgfence's migrations were applied to (tokens are
	// drawn from its sequence). Empty means [pgfence.DefaultSchema].
	Schema string

	// MaxSessions bounds the database sessions (connections) the Locker
	// opens to hold session locks; every lock shares one of them. Sessions
	// are opened on demand, when every open one has 32 acquisitions in
	// flight (see Sessions in the package documentation) or for a waiting
	// Acquire to park on (see Waiting; at most MaxSessions-1 sessions are
	// parked), and are dialed with the pool's connection settings but are
	// not part of the pool.
	// Default [DefaultMaxSessions].
	MaxSessions int

	// SessionCheckInterval is how often the watchdog checks each idle lock
	// session with a round trip. Together with QueryTimeout it bounds how
	// late the holders of a dead or hung session learn that their locks
	// are lost: at most SessionCheckInterval + QueryTimeout after the
	// session stopped answering. A session that the server ended (shutdown,
	// restart, pg_terminate_backend) is noticed sooner, within about 50ms,
	// by a look at its socket between checks (see Loss detection in the
	// package documentation). It has no counterpart in package
	// leasetable, whose leases do not live on a session of their own.
	// Default [DefaultSessionCheckInterval].
	SessionCheckInterval time.Duration

	// ListenCheckInterval is how long the LISTEN connection may go without
	// receiving a notification before it is checked with a round trip
	// (bounded by the shorter of it and QueryTimeout), and replaced when
	// that fails, as in package leasetable. Default
	// [DefaultListenCheckInterval]; a negative value turns the check off.
	ListenCheckInterval time.Duration

	// QueryTimeout bounds each statement the Locker runs on its own
	// behalf: every round trip on a lock session and the dial of a new one. A round trip that does not finish in time marks the
	// session dead: all its locks are lost. Default [DefaultQueryTimeout].
	QueryTimeout time.Duration

	// MaxPollInterval is the longest pause of a waiting Lock between two
	// attempts; pauses start at 5ms and double up to it. Unless
	// DisableListen is set, a Lock waiting for a key held by another
	// session is also woken by NOTIFY when it is released, so
	// MaxPollInterval then only bounds the wait when a notification is
	// missed (the LISTEN connection was down, or the lock was released
	// without Unlock: by a session's end or by a client other than
	// pgfence). Default [DefaultMaxPollInterval].
	MaxPollInterval time.Duration

	// TCPKeepalivesIdle, TCPKeepalivesInterval and TCPKeepalivesCount set
	// the server's tcp_keepalives_idle, tcp_keepalives_interval and
	// tcp_keepalives_count on every lock session (whole seconds), so the
	// server drops the session of a client that vanished (partition, power
	// loss) and releases its locks: after about Idle + Interval × Count
	// without traffic. Defaults [DefaultTCPKeepalivesIdle],
	// [DefaultTCPKeepalivesInterval], [DefaultTCPKeepalivesCount].
	// They have no effect on Unix-domain socket connections.
	TCPKeepalivesIdle     time.Duration
	TCPKeepalivesInterval time.Duration
	TCPKeepalivesCount    int

	// TCPUserTimeout sets the server's tcp_user_timeout on every lock
	// session (whole milliseconds): the server drops the session when data
	// it sent stays unacknowledged this long. Default [DefaultTCPUserTimeout].
	TCPUserTimeout time.Duration

	// SessionIdleTimeout is how long a lock session may hold no lock
	// before the watchdog closes it (checked every SessionCheckInterval); the next
	// lock dials a new one. Default [DefaultSessionIdleTimeout].
	SessionIdleTimeout time.Duration

	// ApplicationName is the application_name of lock sessions, to find
	// them in pg_stat_activity. Default [DefaultApplicationName].
	ApplicationName string

	// DisableListen turns off wake-ups across sessions: a Lock waiting for
	// a key held by another session then retries only at its polling pace
	// (up to MaxPollInterval after the release). By default a Lock waiting
	// for a key held by another session asks to be woken by NOTIFY (see
	// the package documentation), which opens one more connection per
	// Locker, the LISTEN connection, while some Lock waits.
	DisableListen bool

	// Logger receives the Locker's diagnostics: lock sessions opened and
	// closed when idle (Debug), sessions that failed to open or were lost,
	// with the cause and the number of locks lost (Warn). Every record is
	// logged with a context (the *Context methods of slog) that carries the
	// values of the caller it concerns: the acquiring or releasing call, or
	// for a lost session the ctx that acquired one of its locks. Default:
	// discard everything.
	Logger *slog.Logger

	// Observer receives the Locker's typed events (see [pgfence.Observer]
	// for the delivery rules, and the package documentation, Events, for
	// what package advisory sends and when). When it also implements
	// [pgfence.OpObserver], every acquire, release and session check is
	// bracketed by StartOp and EndOp. Nil (the default) sends nothing and
	// costs a nil check per call.
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
	// The holder must learn of a loss before the server, seeing a silent
	// client, releases the lock to someone else. The client notices within
	// CheckInterval + QueryTimeout of its last answered check; the server
	// drops the session no sooner than TCPUserTimeout after the partition,
	// or Idle + Interval×Count after the last check it received (up to one
	// CheckInterval before the partition).
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
