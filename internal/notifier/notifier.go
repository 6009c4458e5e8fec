// Package notifier keeps one LISTEN connection for a Locker of either
// strategy: it connects, subscribes, delivers notifications, health-checks a
// silent or suspect connection, reconnects with capped, jittered backoff,
// and tells its owner when it lost and regained listening, so the owner can
// wake every waiter. The owner's own work on the connection runs through the
// Apply hook, between two waits.
//
// The connection is the notifier's own and never goes back to a pool.
// Nothing depends on it for correctness: while it is down, waiters fall
// back to timed retries.
package notifier

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgfence/pgfence/internal/retry"
)

// Default backoff bounds between two connection attempts (retry.Backoff
// draws each pause from [pause/2, pause]); short, so a Locker listens again
// soon after a new primary accepts connections.
const (
	MinBackoff = 25 * time.Millisecond
	MaxBackoff = 500 * time.Millisecond
)

// DefaultSuspectTimeout bounds the health check that Suspect asks for,
// when Config.SuspectTimeout is zero.
const DefaultSuspectTimeout = time.Second

// Config configures a notifier. ConnConfig, Channel and Logger are
// required; the hooks are optional.
type Config struct {
	// ConnConfig is how to connect; it is copied (see connConfig).
	ConnConfig *pgx.ConnConfig
	// Channel is the channel to LISTEN on, and the probes' (Probe).
	Channel string
	// Also are more channels to LISTEN on, subscribed and unsubscribed
	// with Channel.
	Also []string
	// CheckInterval is how long the connection may go without a
	// notification before it is checked with a round trip; negative turns
	// the check off.
	CheckInterval time.Duration
	// CheckTimeout bounds that round trip and each Apply.
	CheckTimeout time.Duration
	// Logger receives failures (Warn) and state changes (Debug); LogPrefix
	// starts each message ("pgfence: leasetable").
	Logger    *slog.Logger
	LogPrefix string

	// Notify is called with each notification's payload.
	Notify func(payload string)
	// Listening is called each time a connection is listening (after
	// Apply succeeded on it): the owner wakes every waiter.
	Listening func()
	// Ended is called when a connection ended; wasListening tells whether
	// it had been listening (waiters may have missed a notification).
	Ended func(wasListening bool)
	// Lost, when set, is called once per outage with its first error (not
	// when ctx ended or the owner was idle), and for a deaf connection.
	Lost func(err error)
	// Restored, when set, is called when listening again after Lost.
	Restored func(down time.Duration)

	// Backoff spaces reconnects; zero means MinBackoff..MaxBackoff.
	Backoff retry.Backoff
	// SuspectTimeout bounds Suspect's check; zero means DefaultSuspectTimeout,
	// at most CheckTimeout.
	SuspectTimeout time.Duration
	// Apply, when set, runs on the connection once after each connect and
	// again after each Kick, before the next wait. A positive retryIn asks
	// for another run after that long. An error ends the connection.
	Apply func(ctx context.Context, conn *pgx.Conn) (retryIn time.Duration, err error)
	// Probe, when set, is called after each LISTEN with a payload to send on
	// Channel from another connection; if it does not arrive within
	// ProbeTimeout the connection cannot receive (a transaction pooler in
	// front): the notifier logs one Warn and stops for good. A failed Probe
	// proves nothing.
	Probe        func(ctx context.Context, payload string) error
	ProbeTimeout time.Duration

	// Idle, when set, is asked every IdleCheck (connDown false) and after a
	// connection ended (connDown true) whether to stop; on true it must record
	// that it stopped.
	Idle      func(connDown bool) bool
	IdleCheck time.Duration

	// Wanted, when set, tells whether the owner wants notifications now: the
	// connection stays open but listens only while it returns true, since a
	// listening session is signalled by every NOTIFY of its database. It is
	// asked at each turn; the owner calls Kick when its answer may change.
	Wanted func() bool
}

// Notifier is a running LISTEN loop. Create it with Start.
type Notifier struct {
	cfg       Config
	done      chan struct{}
	listening atomic.Bool // a connection is listening (subscribed) now

	mu        sync.Mutex
	dirty     bool               // Kick was called since the last Apply
	suspectAt time.Time          // when to run the check Suspect asked for; zero: none
	suspected time.Time          // when the last such check ran
	interrupt context.CancelFunc // ends the current wait, if any
}

// Start runs the loop in a goroutine until ctx ends or Idle says stop; wg
// (if not nil) counts the goroutine.
func Start(ctx context.Context, cfg Config, wg *sync.WaitGroup) *Notifier {
	if cfg.Backoff == (retry.Backoff{}) {
		cfg.Backoff = retry.Backoff{Min: MinBackoff, Max: MaxBackoff}
	}
	if cfg.SuspectTimeout <= 0 {
		cfg.SuspectTimeout = DefaultSuspectTimeout
	}
	if cfg.CheckTimeout > 0 {
		cfg.SuspectTimeout = min(cfg.SuspectTimeout, cfg.CheckTimeout)
	}
	n := &Notifier{cfg: cfg, done: make(chan struct{}), dirty: true}
	if wg != nil {
		wg.Add(1)
	}
	go func() {
		if wg != nil {
			defer wg.Done()
		}
		defer close(n.done)
		n.run(ctx)
	}()
	return n
}

// Done is closed when the loop has stopped.
func (n *Notifier) Done() <-chan struct{} { return n.done }

// Listening reports whether a connection is listening now (subscribed,
// with Config.Wanted). It is safe on a nil *Notifier (false).
func (n *Notifier) Listening() bool { return n != nil && n.listening.Load() }

// Kick asks the loop to run Apply soon, interrupting its wait.
func (n *Notifier) Kick() {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.dirty = true
	n.interruptLocked()
}

// suspectQuiet is the least time between two checks that Suspect asks
// for: during an outage every failed statement of the owner calls it.
const suspectQuiet = time.Second

// Suspect tells the loop that the owner's statement failed transiently, so
// the connection may be silently dead: the loop checks it within
// SuspectTimeout, at most once a second (calls share a check), and replaces
// it on failure. It never blocks; it is safe on a nil *Notifier.
func (n *Notifier) Suspect() {
	if n == nil {
		return
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if !n.listening.Load() || !n.suspectAt.IsZero() {
		return // not listening, or a check is already due
	}
	n.suspectAt = time.Now()
	if next := n.suspected.Add(suspectQuiet); next.After(n.suspectAt) {
		n.suspectAt = next
	}
	n.interruptLocked()
}

func (n *Notifier) interruptLocked() {
	if n.interrupt != nil {
		n.interrupt()
		n.interrupt = nil
	}
}

// errIdle ends a connection whose owner no longer needs it.
var errIdle = errors.New("LISTEN connection idle")

// errDeaf ends a connection on which the probe notification never arrived.
var errDeaf = errors.New("LISTEN connection receives no notifications")

// ProbePrefix starts a probe's payload: a control character, which no lease
// name or key contains; notifiers drop such payloads.
const ProbePrefix = "\x1fpgfence-listen-probe "

// probe sends a probe through cfg.Probe and waits for it: errDeaf when it
// does not arrive in time, nil when it does or could not be sent, or the
// connection's error.
func (n *Notifier) probe(ctx context.Context, conn *pgx.Conn) error {
	payload := fmt.Sprintf("%s%d-%d", ProbePrefix, conn.PgConn().PID(), rand.Uint64())
	pctx, cancel := context.WithTimeout(ctx, n.cfg.ProbeTimeout)
	defer cancel()
	if err := n.cfg.Probe(pctx, payload); err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		n.cfg.Logger.DebugContext(ctx, n.cfg.LogPrefix+": could not send the LISTEN probe; using the connection unchecked", "error", err)
		return nil
	}
	for {
		msg, err := conn.WaitForNotification(pctx)
		switch {
		case err == nil && msg.Payload == payload:
			return nil
		case err == nil:
			if n.cfg.Notify != nil && !strings.HasPrefix(msg.Payload, ProbePrefix) {
				n.cfg.Notify(msg.Payload)
			}
		case ctx.Err() != nil:
			return ctx.Err()
		case pctx.Err() != nil && !conn.IsClosed():
			return errDeaf
		default:
			return err
		}
	}
}

func (n *Notifier) run(ctx context.Context) {
	failures := 0
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	var down downState
	for {
		listening, err := n.once(ctx, &down)
		n.listening.Store(false)
		if n.cfg.Ended != nil {
			n.cfg.Ended(listening)
		}
		if errors.Is(err, errIdle) {
			n.cfg.Logger.DebugContext(ctx, n.cfg.LogPrefix+": idle LISTEN connection closed")
			return
		}
		if errors.Is(err, errDeaf) {
			n.cfg.Logger.WarnContext(ctx, n.cfg.LogPrefix+": LISTEN does not receive notifications on this connection: is it behind a transaction pooler? "+
				"set ListenConnConfig to a direct connection or DisableListen; waiters fall back to timed retries",
				"channel", n.cfg.Channel, "probe_timeout", n.cfg.ProbeTimeout)
			down.lost(n, err)
			return
		}
		if ctx.Err() != nil || (n.cfg.Idle != nil && n.cfg.Idle(true)) {
			return
		}
		down.lost(n, err)
		if listening {
			failures = 0
		}
		failures++
		wait := n.cfg.Backoff.Wait(failures)
		n.cfg.Logger.WarnContext(ctx, n.cfg.LogPrefix+": LISTEN connection failed; waiters fall back to timed retries until it is back",
			"error", err, "retry_in", wait)
		timer.Reset(wait)
		select {
		case <-timer.C:
		case <-ctx.Done():
			return
		}
	}
}

// downState tracks one outage of the LISTEN connection, for the Lost and
// Restored hooks.
type downState struct {
	down  bool
	since time.Time
}

// lost records a failure: the first of an outage calls Lost.
func (d *downState) lost(n *Notifier, err error) {
	if d.down {
		return
	}
	d.down, d.since = true, time.Now()
	if n.cfg.Lost != nil {
		n.cfg.Lost(err)
	}
}

// restored records that a connection listens: after an outage it calls
// Restored.
func (d *downState) restored(n *Notifier) {
	if !d.down {
		return
	}
	d.down = false
	if n.cfg.Restored != nil {
		n.cfg.Restored(time.Since(d.since))
	}
}

// once connects, listens, applies and delivers notifications until the
// connection fails, ctx ends or the owner is idle. listening reports
// whether LISTEN succeeded.
func (n *Notifier) once(ctx context.Context, down *downState) (listening bool, err error) {
	// A wait ended by its own context (a Kick, a tick, a health check)
	// leaves the connection usable: see connConfig.
	conn, err := open(ctx, n.cfg.ConnConfig, n.channels())
	if err != nil {
		return false, err
	}
	defer closeConn(conn)
	n.mu.Lock()
	n.dirty = true
	n.suspectAt, n.suspected = time.Time{}, time.Time{}
	n.mu.Unlock()
	if n.cfg.Probe != nil {
		if err := n.probe(ctx, conn); err != nil {
			return false, err
		}
	}
	n.cfg.Logger.DebugContext(ctx, n.cfg.LogPrefix+": LISTEN connection ready", "channel", n.cfg.Channel)
	var retryAt time.Time
	first := true
	subscribed := true // open ran LISTEN
	lastHeard := time.Now()
	for {
		n.mu.Lock()
		dirty := n.dirty || (!retryAt.IsZero() && !time.Now().Before(retryAt))
		n.dirty = false
		n.mu.Unlock()
		if dirty && n.cfg.Apply != nil {
			actx, cancel := context.WithTimeout(ctx, n.cfg.CheckTimeout)
			retryIn, err := n.cfg.Apply(actx, conn)
			cancel()
			if err != nil {
				return !first, err
			}
			retryAt = time.Time{}
			if retryIn > 0 {
				retryAt = time.Now().Add(retryIn)
			}
		}
		subscribe := false // the connection subscribed in this turn
		if n.cfg.Wanted != nil {
			if want := n.cfg.Wanted(); want != subscribed {
				sctx, cancel := context.WithTimeout(ctx, n.stmtTimeout())
				err := setListen(sctx, conn, n.channels(), want)
				cancel()
				if err != nil {
					return !first, err
				}
				subscribed, subscribe = want, want
				n.listening.Store(want)
				lastHeard = time.Now()
			}
		}
		if first {
			first = false
			n.listening.Store(subscribed)
			down.restored(n)
			subscribe = subscribed
		}
		if subscribe && n.cfg.Listening != nil {
			n.cfg.Listening()
		}
		msg, err := n.wait(ctx, conn, retryAt)
		switch {
		case err != nil:
			return true, err
		case msg != nil:
			lastHeard = time.Now()
			if n.cfg.Notify != nil && !strings.HasPrefix(msg.Payload, ProbePrefix) {
				n.cfg.Notify(msg.Payload)
			}
			continue
		}
		// The wait ended by itself: a Kick, a Suspect, a retry, or a tick.
		if n.cfg.Idle != nil && n.cfg.Idle(false) {
			return true, errIdle
		}
		n.mu.Lock()
		suspect := !n.suspectAt.IsZero() && !time.Now().Before(n.suspectAt)
		if suspect {
			n.suspectAt, n.suspected = time.Time{}, time.Now()
		}
		n.mu.Unlock()
		timeout := n.cfg.CheckTimeout
		switch {
		case suspect:
			timeout = n.cfg.SuspectTimeout
		case n.cfg.CheckInterval < 0 || time.Since(lastHeard) < n.cfg.CheckInterval:
			continue
		}
		lastHeard = time.Now()
		// Nothing arrived for CheckInterval, or the owner suspects the
		// connection, and it is still usable: check it. If the check times
		// out, pgconn closes the connection (a timeout during a query is
		// fatal) in a goroutine of its own, which the deferred closeConn
		// waits for.
		cctx, cancel := context.WithTimeout(ctx, timeout)
		err = setListen(cctx, conn, n.channels(), subscribed)
		cancel()
		if err != nil {
			if ctx.Err() != nil {
				return true, err
			}
			if suspect {
				return true, fmt.Errorf("health check of the LISTEN connection, after an error of another statement, failed (timeout %v): %w",
					timeout, err)
			}
			return true, fmt.Errorf("health check of the LISTEN connection, silent for %v, failed (timeout %v): %w",
				n.cfg.CheckInterval, timeout, err)
		}
	}
}

// channels are the channels the connection listens on: Channel, then Also.
func (n *Notifier) channels() []string {
	return append([]string{n.cfg.Channel}, n.cfg.Also...)
}

// stmtTimeout bounds a LISTEN or UNLISTEN that Wanted asks for: the
// health check's timeout, or DefaultSuspectTimeout when the check is off.
func (n *Notifier) stmtTimeout() time.Duration {
	if n.cfg.CheckTimeout > 0 {
		return n.cfg.CheckTimeout
	}
	return DefaultSuspectTimeout
}

// wait waits for the next notification. It returns (nil, nil) when the
// wait ended by itself: a Kick, the retry time, or the next tick (the
// shorter of CheckInterval and IdleCheck).
//
// A connection that died silently would otherwise block WaitForNotification
// until the kernel gives up on it, while every hand-over falls back to the
// holder's expiry: with pgx's default dialer (Go's keepalive defaults)
// about 2.5 minutes after the path went dead on Linux; longer with a dialer
// that turns keepalive off; and never while a proxy in between still
// acknowledges at the TCP level but no longer forwards.
func (n *Notifier) wait(ctx context.Context, conn *pgx.Conn, retryAt time.Time) (*pgconn.Notification, error) {
	tick := time.Hour
	if n.cfg.CheckInterval > 0 {
		tick = n.cfg.CheckInterval
	}
	if n.cfg.Idle != nil && n.cfg.IdleCheck > 0 {
		tick = min(tick, n.cfg.IdleCheck)
	}
	if !retryAt.IsZero() {
		tick = min(tick, max(time.Until(retryAt), 0))
	}
	n.mu.Lock()
	if !n.suspectAt.IsZero() {
		d := time.Until(n.suspectAt)
		if d <= 0 {
			n.mu.Unlock()
			return nil, nil
		}
		tick = min(tick, d)
	}
	if n.dirty {
		n.mu.Unlock()
		return nil, nil
	}
	wctx, cancel := context.WithTimeout(ctx, tick)
	defer cancel()
	n.interrupt = cancel
	n.mu.Unlock()
	msg, err := conn.WaitForNotification(wctx)
	n.mu.Lock()
	n.interrupt = nil
	n.mu.Unlock()
	if err == nil {
		return msg, nil
	}
	// A wait ended by its own context fails with a timeout or context
	// error and leaves the connection usable.
	ended := wctx.Err() != nil && ctx.Err() == nil && !conn.IsClosed() &&
		(pgconn.Timeout(err) || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded))
	if ended {
		return nil, nil
	}
	return nil, err
}
