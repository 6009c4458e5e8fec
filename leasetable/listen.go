package leasetable

import (
	"context"
	"time"

	"github.com/pgfence/pgfence"
	"github.com/pgfence/pgfence/internal/notifier"
)

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

// watch is what a Locker knows of a name its waiters listen for: the tag
// its notifications carry, and the newest released token acted on, so that
// a replayed notification is dropped.
type watch struct {
	tag      string
	notified int64
}

// addWaiter registers a waiter for name's release notifications, starting
// the Locker's LISTEN connection on first use. The connection listens only
// while a waiter of the Locker waits for notifications (see listenFor).
func (k *Locker) addWaiter(name string) (*waiter, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.closed {
		return nil, pgfence.ErrClosed
	}
	k.waiterSeq++
	w := &waiter{ch: make(chan struct{}, 1), seq: k.waiterSeq, name: name}
	set := k.waiters[name]
	if set == nil {
		set = make(map[*waiter]struct{})
		k.waiters[name] = set
	}
	set[w] = struct{}{}
	if k.listener == nil && !k.cfg.DisableListen {
		k.listener = notifier.Start(k.closeCtx, notifier.Config{
			ConnConfig:    k.cfg.ListenConnConfig,
			Channel:       NotifyChannel,
			CheckInterval: k.cfg.ListenCheckInterval,
			CheckTimeout:  min(k.cfg.ListenCheckInterval, maxListenCheckTimeout),
			Logger:        k.cfg.Logger,
			LogPrefix:     "pgfence: leasetable",
			Notify:        k.notify,
			Listening:     k.listening,
			Probe:         k.probeListen,
			ProbeTimeout:  probeTimeout(k.cfg.ListenCheckInterval),
			Lost:          k.listenLost,
			Restored:      k.listenRestored,
			Wanted:        k.wantListen,
		}, &k.background)
	}
	return w, nil
}

func (k *Locker) removeWaiter(name string, w *waiter) {
	k.mu.Lock()
	defer k.mu.Unlock()
	set := k.waiters[name]
	delete(set, w)
	if len(set) == 0 {
		delete(k.waiters, name)
		if wa := k.watched[name]; wa != nil {
			delete(k.tagNames, wa.tag)
			delete(k.watched, name)
		}
	}
	if w.listens {
		k.listenWants--
		if k.listenWants == 0 && k.listener != nil && !k.closed {
			// Unsubscribe once the linger has passed, unless a waiter
			// came back: one timer per Locker, pushed back by each
			// waiter that leaves (and stopped by Close, after which no
			// waiter re-arms it).
			k.listenIdleSince = time.Now()
			if k.lingerTimer == nil {
				n := k.listener
				k.lingerTimer = time.AfterFunc(listenLinger, n.Kick)
			} else {
				k.lingerTimer.Reset(listenLinger)
			}
		}
	}
}

// listenLinger is how long the LISTEN connection stays subscribed after the
// last waiter for notifications left: a Locker that waits again within it
// (a busy one waits every few milliseconds) keeps listening rather than
// paying a LISTEN, an UNLISTEN and a retry of its waiter each time, while
// a Locker that no longer waits stops being signalled within a second.
const listenLinger = time.Second

// listenFor marks w, a waiter about to block until a release (it was
// refused), as one that waits for notifications: the first such waiter of
// the Locker has the LISTEN connection subscribe, and once it has, every
// waiter is woken to try again (the notifier's Listening hook, wakeAll),
// as a release committed before then was not announced. Waiters whose
// first attempt succeeds never make the connection listen. When the
// notifier's last answer from wantListen was yes, it is subscribed (or
// subscribing) and will not unsubscribe without asking again, which now
// answers yes: no Kick, so a busy Locker's waits do not interrupt it.
func (k *Locker) listenFor(w *waiter) {
	if k.hooks != nil && k.hooks.onListen != nil && !w.listens {
		k.hooks.onListen()
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	if w.listens {
		return
	}
	w.listens = true
	k.watchLocked(w.name)
	k.listenWants++
	if k.listenWants == 1 && k.listener != nil && !k.listenAnswer {
		k.listener.Kick() // subscribe
	}
}

// wantListen is the notifier's Wanted hook: the LISTEN connection is
// subscribed only while a call of the Locker waits for a release (see
// listenFor), and for listenLinger after the last one left. A session
// that listens is signalled, and its backend woken, by every NOTIFY
// committed in the database (PostgreSQL signals each listening backend,
// whatever the channel), and each signal makes the NOTIFY's commit take
// longer: an idle Locker that kept listening would slow every release of
// every Locker on the database, and take a share of the server's CPU, for
// nothing. The answer is recorded for listenFor.
func (k *Locker) wantListen() bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.listenAnswer = k.listenWants > 0 || time.Since(k.listenIdleSince) < listenLinger
	if k.hooks != nil {
		k.hooks.listenAsked++
	}
	return k.listenAnswer
}

// listening is the notifier's Listening hook: the LISTEN connection
// listens (again), having connected or subscribed, so every waiter tries
// again (wakeAll), as a release may have been missed meanwhile.
func (k *Locker) listening() {
	if k.hooks == nil || !k.hooks.noListenWake {
		k.wakeAll()
	}
}

// wakeAll wakes every waiter, so each retries at once.
func (k *Locker) wakeAll() {
	k.mu.Lock()
	defer k.mu.Unlock()
	for _, set := range k.waiters {
		for w := range set {
			w.wake()
		}
	}
}

// watchLocked returns the watch of name, a name waiters wait for, creating
// it: from then on its notifications are known by their tag. k.mu is held.
func (k *Locker) watchLocked(name string) *watch {
	wa := k.watched[name]
	if wa == nil {
		wa = &watch{tag: k.notifyKey.Tag(name)}
		k.watched[name] = wa
		k.tagNames[wa.tag] = name
	}
	return wa
}

// noteHolder records, while waiters wait for name, that an attempt found it
// held with token: a release notification of an older token (an earlier
// grant's, or a replay) is then dropped.
func (k *Locker) noteHolder(name string, token int64) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if _, waiting := k.waiters[name]; waiting {
		wa := k.watchLocked(name)
		wa.notified = max(wa.notified, token-1)
	}
}

// notify wakes the waiters for the lease a notification announces, once per
// released token. A payload that does not verify under the install's key
// (forged by a role without pgfence's grant), that names no lease waited
// for, or whose token is older than the holder an attempt found or not
// newer than one already acted on (replayed) is dropped without a
// statement.
func (k *Locker) notify(payload string) {
	tag, token, ok := k.notifyKey.Verify(payload)
	if !ok {
		return
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	name, ok := k.tagNames[tag]
	if !ok || token <= k.watched[name].notified {
		return
	}
	k.watched[name].notified = token
	for w := range k.waiters[name] {
		w.wake()
	}
}

// probeSQL sends a probe notification on [NotifyChannel] through the pool,
// as a release would; it locks nothing.
const probeSQL = `SELECT pg_catalog.pg_notify($1, $2)`

// probeListen is the notifier's probe: it sends payload through the pool,
// from another session than the LISTEN connection's, so it arrives only
// where a release would (a session's own notification arrives even
// through a transaction pooler, on the server connection it happens to
// get back, and proves nothing).
func (k *Locker) probeListen(ctx context.Context, payload string) error {
	_, err := k.pool.Exec(ctx, probeSQL, NotifyChannel, payload)
	return err
}

// probeTimeout is how long the LISTEN connection waits for its probe after
// each connect: the health check's timeout, or its cap when the check is
// off.
func probeTimeout(checkInterval time.Duration) time.Duration {
	if checkInterval < 0 {
		return maxListenCheckTimeout
	}
	return min(checkInterval, maxListenCheckTimeout)
}

// listenLost reports that the LISTEN connection stopped listening.
func (k *Locker) listenLost(err error) {
	if k.ev.Enabled() {
		k.ev.Async(context.Background(), pgfence.ListenLost{Kind: pgfence.StrategyLeaseTable, Err: err})
	}
}

// listenRestored reports that the LISTEN connection listens again.
func (k *Locker) listenRestored(down time.Duration) {
	k.cfg.Logger.InfoContext(context.Background(), "pgfence: leasetable: LISTEN connection restored", "down", down)
	if k.ev.Enabled() {
		k.ev.Async(context.Background(), pgfence.ListenRestored{Kind: pgfence.StrategyLeaseTable, Down: down})
	}
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
