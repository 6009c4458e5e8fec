package leader

import (
	"context"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgfence/pgfence"
	"github.com/pgfence/pgfence/internal/notifier"
	"github.com/pgfence/pgfence/leasetable"
)

// TermInfo describes a term of an election as the database records it,
// for followers and operators. Times are the database's.
type TermInfo struct {
	// Election is the election's name.
	Election string
	// Leading reports whether the lease was held when read; when false, the
	// other fields but Election are zero.
	Leading bool
	// Token is the term's fencing token.
	Token int64
	// Owner is the leader's owner id (its Locker's [leasetable.Config].Owner).
	Owner string
	// Proclaimed is false between the grant and the proclamation, or for a
	// lease of that name taken without this package.
	Proclaimed bool
	// Value is the value proclaimed; empty when not Proclaimed.
	Value string
	// BeganAt is when the term began (its lease was granted).
	BeganAt time.Time
	// ExpiresAt is the lease's expiry (zero for an ended term of [Terms]).
	ExpiresAt time.Time
}

// same reports whether a and b describe the same leadership for
// observers: the same term (or none), proclaiming the same value.
func (a TermInfo) same(b TermInfo) bool {
	return a.Leading == b.Leading && a.Token == b.Token && a.Proclaimed == b.Proclaimed && a.Value == b.Value
}

// currentSQL reads the election's held lease, its proclaimed value and now()
// (%[1]s is the schema): one row, NULLs when nobody leads. No locks.
const currentSQL = `
SELECT l.owner, l.fence, l.acquired_at, l.expires_at, d.value, d.token IS NOT NULL, pg_catalog.now()
FROM (SELECT) AS one
LEFT JOIN %[1]s.pgfence_leases l
    ON l.name OPERATOR(pg_catalog.=) $1 AND l.expires_at OPERATOR(pg_catalog.>) pg_catalog.now()
LEFT JOIN %[1]s.pgfence_leaders d
    ON d.name OPERATOR(pg_catalog.=) l.name AND d.token OPERATOR(pg_catalog.=) l.fence`

// Leader returns who leads the election now; info.Leading is false when
// nobody does. It returns database errors wrapped, or [pgfence.ErrClosed].
func (e *Elector) Leader(ctx context.Context) (TermInfo, error) {
	if err := e.checkOpen(); err != nil {
		return TermInfo{}, err
	}
	info, _, err := e.read(ctx)
	if err != nil {
		return TermInfo{}, fmt.Errorf("pgfence: leader: read the leader of %q: %w", e.cfg.Election, err)
	}
	return info, nil
}

// read reads the current term and how long until its lease expires (zero
// when nobody leads), judged on the database clock.
func (e *Elector) read(ctx context.Context) (TermInfo, time.Duration, error) {
	var (
		owner          *string
		token          *int64
		began, expires *time.Time
		value          *string
		proclaimed     bool
		dbNow          time.Time
		info           = TermInfo{Election: e.cfg.Election}
		untilExpiry    time.Duration
		err            error
	)
	err = e.pool.QueryRow(ctx, e.sql.current, e.cfg.Election).Scan(&owner, &token, &began, &expires, &value, &proclaimed, &dbNow)
	if err != nil {
		return info, 0, err
	}
	if token == nil {
		return info, 0, nil
	}
	info.Leading, info.Token, info.Owner, info.BeganAt, info.ExpiresAt = true, *token, *owner, *began, *expires
	info.Proclaimed = proclaimed
	if value != nil {
		info.Value = *value
	}
	// Clamped: an expiry beyond what pgfence writes (set by hand) must not
	// overflow the observer's waits into a busy loop.
	untilExpiry = min(max(expires.Sub(dbNow), 0), leasetable.MaxTTL)
	return info, untilExpiry, nil
}

// Observe returns a channel that receives who leads: the current state, then
// each change, until ctx ends or the Elector is closed, when it is closed.
// Changes are read on a notification, at the term's expiry, and every
// [Config].ObserveInterval. A new term is reported with its value (waiting
// up to a second for its proclamation). A slow receiver gets the latest
// state, not every state in between.
func (e *Elector) Observe(ctx context.Context) <-chan TermInfo {
	out := make(chan TermInfo)
	wake, err := e.addWatcher()
	if err != nil {
		close(out)
		return out
	}
	e.wg.Add(1)
	go func() {
		defer e.wg.Done()
		defer close(out)
		defer e.removeWatcher(wake)
		e.observe(ctx, wake, out)
	}()
	return out
}

func (e *Elector) observe(ctx context.Context, wake chan struct{}, out chan<- TermInfo) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := context.AfterFunc(e.closeCtx, cancel)
	defer stop()
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	var last TermInfo
	sent := false
	failures := 0
	var unproclaimed int64          // a term seen before its proclamation
	var unproclaimedUntil time.Time // the end of its wait for one
	for {
		info, untilExpiry, err := e.read(ctx)
		wait := e.cfg.ObserveInterval
		switch {
		case ctx.Err() != nil:
			return
		case err != nil:
			failures++
			wait = min(wait, time.Duration(failures)*100*time.Millisecond)
			e.cfg.Logger.WarnContext(ctx, "pgfence: leader: reading the leader failed; retrying",
				"election", e.cfg.Election, "error", err, "retry_in", wait)
		case info.Leading && !info.Proclaimed && (!sent || last.Token != info.Token) &&
			(info.Token != unproclaimed || time.Now().Before(unproclaimedUntil)):
			// A new term not yet proclaimed: wait up to unproclaimedGrace for the
			// proclamation rather than report it without its value.
			if info.Token != unproclaimed {
				unproclaimed, unproclaimedUntil = info.Token, time.Now().Add(unproclaimedGrace)
			}
			wait = min(wait, time.Until(unproclaimedUntil), untilExpiry+time.Millisecond)
		default:
			failures = 0
			if !sent || !info.same(last) {
				select {
				case out <- info:
				case <-ctx.Done():
					return
				}
				last, sent = info, true
				// Read again at once: the state may have changed while
				// the receiver was busy.
				continue
			}
			if info.Leading {
				// Re-read when the lease is due to expire: unless renewed
				// meanwhile, the term has ended then.
				wait = min(wait, untilExpiry+time.Millisecond+rand.N(4*time.Millisecond))
			}
		}
		timer.Reset(wait)
		select {
		case <-wake:
		case <-timer.C:
		case <-ctx.Done():
			return
		}
	}
}

// unproclaimedGrace is how long an observer waits for a new term's
// proclamation before it reports the term without a value.
const unproclaimedGrace = time.Second

// addWatcher registers an observer's wake channel, starting the LISTEN
// connection on first use.
func (e *Elector) addWatcher() (chan struct{}, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return nil, pgfence.ErrClosed
	}
	w := make(chan struct{}, 1)
	e.watchers[w] = struct{}{}
	if e.listener != nil && !e.interestHeld {
		e.listener.Kick() // take the interest key
	}
	if e.listener == nil && !e.cfg.DisableListen {
		checkInterval := leasetable.DefaultListenCheckInterval
		e.listener = notifier.Start(e.closeCtx, notifier.Config{
			ConnConfig:    e.cfg.ListenConnConfig,
			Channel:       NotifyChannel,
			CheckInterval: checkInterval,
			CheckTimeout:  min(checkInterval, 5*time.Second),
			Logger:        e.cfg.Logger,
			LogPrefix:     "pgfence: leader",
			Notify:        e.notify,
			Listening:     e.wakeAll,
			Apply:         e.applyListen,
			Ended:         e.listenEnded,
			Probe:         e.probe,
			ProbeTimeout:  5 * time.Second,
		}, &e.wg)
	}
	return w, nil
}

func (e *Elector) removeWatcher(w chan struct{}) {
	e.mu.Lock()
	defer e.mu.Unlock()
	delete(e.watchers, w)
	if len(e.watchers) == 0 && e.listener != nil && e.interestHeld {
		e.listener.Kick() // release the interest key
	}
}

// notify wakes the observers when a notification names the election: its
// payload (tag:token:mac) carries the election's tag under the install's
// key and a valid MAC, and a term no older than the newest one notified (a
// replay of an older term's notification is dropped).
func (e *Elector) notify(payload string) {
	tag, token, ok := e.notifyKey.Verify(payload)
	if !ok || tag != e.notifyTag {
		return
	}
	e.mu.Lock()
	stale := token < e.notifiedTerm
	e.notifiedTerm = max(e.notifiedTerm, token)
	e.mu.Unlock()
	if !stale {
		e.wakeAll()
	}
}

// wakeAll wakes every observer: after a notification, and whenever the
// LISTEN connection is (again) listening, as a change may have been
// missed meanwhile.
func (e *Elector) wakeAll() {
	e.mu.Lock()
	defer e.mu.Unlock()
	for w := range e.watchers {
		select {
		case w <- struct{}{}:
		default:
		}
	}
}

// listenReleasesSQL subscribes the observers' LISTEN connection to the
// lease table's releases too (a resignation is a release).
var listenReleasesSQL = "LISTEN " + pgx.Identifier{leasetable.NotifyChannel}.Sanitize()

// takeInterestSQL takes the interest key ($1, $2) shared, without waiting,
// so that a release of the election's lease notifies (see
// leasetable.InterestClassID); dropInterestSQL releases it.
const (
	takeInterestSQL = `SELECT pg_catalog.pg_try_advisory_lock_shared($1::pg_catalog.int4, $2::pg_catalog.int4)`
	dropInterestSQL = `SELECT pg_catalog.pg_advisory_unlock_shared($1::pg_catalog.int4, $2::pg_catalog.int4)`
)

// interestRetry is how soon the LISTEN connection tries the interest key
// again when a release held it.
const interestRetry = 20 * time.Millisecond

// applyListen is the notifier's Apply hook: it subscribes to the lease
// table's releases (a no-op on a session that listens) and holds the
// election's interest key while an observer watches, waking the observers
// once it took it (a resignation just before went unannounced).
func (e *Elector) applyListen(ctx context.Context, conn *pgx.Conn) (time.Duration, error) {
	if _, err := conn.Exec(ctx, listenReleasesSQL); err != nil {
		return 0, err
	}
	e.mu.Lock()
	want, held := len(e.watchers) > 0 && (e.hooks == nil || !e.hooks.noInterest), e.interestHeld
	e.mu.Unlock()
	id := e.notifyKey.InterestID(e.cfg.Election)
	switch {
	case want && !held:
		var ok bool
		if err := conn.QueryRow(ctx, takeInterestSQL, leasetable.InterestClassID, id).Scan(&ok); err != nil {
			return 0, fmt.Errorf("pgfence: leader: take the interest key: %w", err)
		}
		if !ok {
			return interestRetry, nil
		}
		e.mu.Lock()
		e.interestHeld = true
		e.mu.Unlock()
		e.wakeAll()
	case !want && held:
		var ok bool
		if err := conn.QueryRow(ctx, dropInterestSQL, leasetable.InterestClassID, id).Scan(&ok); err != nil {
			return 0, fmt.Errorf("pgfence: leader: release the interest key: %w", err)
		}
		e.mu.Lock()
		e.interestHeld = false
		e.mu.Unlock()
	}
	return 0, nil
}

// listenEnded is the notifier's Ended hook: the interest key went with the
// connection.
func (e *Elector) listenEnded(bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.interestHeld = false
}

// probeSQL sends a probe notification on [NotifyChannel] through the pool;
// it locks nothing.
const probeSQL = `SELECT pg_catalog.pg_notify($1, $2)`

// probe is the notifier's probe: see leasetable's, which this mirrors.
func (e *Elector) probe(ctx context.Context, payload string) error {
	_, err := e.pool.Exec(ctx, probeSQL, NotifyChannel, payload)
	return err
}
