package leasetable

import (
	"context"
	"strings"
	"time"

	"github.com/pgfence/pgfence"
	"github.com/pgfence/pgfence/internal/notifier"
)

type waiter struct {
	name    string
	ch      chan struct{} // buffered(1)
	seq     uint64        // order of registration (Locker.waiterSeq)
	listens bool          // it waits for notifications (counted in Locker.listenWants)
	armed   bool          // its name's interest key was held, and LISTEN on, when it registered
}

func (w *waiter) wake() {
	select {
	case w.ch <- struct{}{}:
	default:
	}
}

// watch is what a Locker knows of a name while waiters are registered for
// it: the tag of its notifications, and the newest released token acted
// on. It exists from the first waiter's registration (addWaiter), not from
// its first wait: a waiter registered armed is woken by nothing but the
// notifications that come after, and one may come, and must wake it, before
// its attempt is answered and it waits (listenFor).
type watch struct {
	tag      string
	notified int64
}

// addWaiter registers a waiter for name, starting the Locker's LISTEN
// connection on first use.
func (k *Locker) addWaiter(name string) (*waiter, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.closed {
		return nil, pgfence.ErrClosed
	}
	k.waiterSeq++
	w := &waiter{ch: make(chan struct{}, 1), seq: k.waiterSeq, name: name}
	if in := k.interests[name]; in != nil && in.held && k.listener.Listening() {
		w.armed = true
	}
	set := k.waiters[name]
	if set == nil {
		set = make(map[*waiter]struct{})
		k.waiters[name] = set
	}
	set[w] = struct{}{}
	if k.hooks == nil || !k.hooks.lateWatch {
		k.watchLocked(name) // notifications wake w from now on (see watch)
	}
	if k.listener == nil && !k.cfg.DisableListen {
		k.listener = notifier.Start(k.closeCtx, notifier.Config{
			ConnConfig:    k.cfg.ListenConnConfig,
			Channel:       NotifyChannel,
			Also:          []string{k.grantChannel},
			CheckInterval: k.cfg.ListenCheckInterval,
			CheckTimeout:  probeTimeout(k.cfg.ListenCheckInterval), // bounds Apply too, with the check off
			Logger:        k.cfg.Logger,
			LogPrefix:     "pgfence: leasetable",
			Notify:        k.notify,
			Listening:     k.listening,
			Probe:         k.probeListen,
			ProbeTimeout:  probeTimeout(k.cfg.ListenCheckInterval),
			Lost:          k.listenLost,
			Restored:      k.listenRestored,
			Wanted:        k.wantListen,
			Apply:         k.applyInterests,
			Ended:         k.listenEnded,
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
		k.dropInterestLocked(name)
		k.listenWants--
		if k.listenWants == 0 && k.listener != nil && !k.closed {
			// Unsubscribe after the linger unless a waiter came back.
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
// last waiter for notifications left.
const listenLinger = time.Second

// listenFor marks w, refused and about to wait, as waiting for
// notifications: the first such waiter has the LISTEN connection subscribe,
// which then wakes every waiter (see listening). No Kick while the
// notifier's last answer was yes.
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
	if k.hooks != nil && k.hooks.lateWatch {
		k.watchLocked(w.name) // the negative control's order (addWaiter did not)
	}
	arm := k.interestLocked(w)
	k.listenWants++
	if (arm || k.listenWants == 1 && !k.listenAnswer) && k.listener != nil {
		k.listener.Kick() // take the interest key, subscribe
	}
}

// wantListen is the notifier's Wanted hook: subscribed only while a call
// waits for a release, and for listenLinger after (every NOTIFY of the
// database signals each listening session).
func (k *Locker) wantListen() bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.listenAnswer = k.listenWants > 0 || time.Since(k.listenIdleSince) < listenLinger
	if k.hooks != nil {
		k.hooks.listenAsked++
	}
	return k.listenAnswer
}

// listening is the notifier's Listening hook: a release may have been
// missed before, so every waiter tries again.
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

// watchLocked returns name's watch, creating it. k.mu is held.
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
// held with token: older release notifications are then dropped.
func (k *Locker) noteHolder(name string, token int64) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if wa := k.watched[name]; wa != nil {
		wa.notified = max(wa.notified, token-1)
	}
}

// notify wakes the waiters for the lease a notification announces, once per
// released token. A payload that does not verify, names no watched lease, or
// is not newer than the last token noted is dropped.
func (k *Locker) notify(payload string) {
	if k.hooks != nil && k.hooks.onNotify != nil {
		defer k.hooks.onNotify()
	}
	if strings.HasPrefix(payload, grantPrefix) {
		k.notifyGrant(payload)
		return
	}
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

// probeSQL sends a probe notification on [NotifyChannel]; it locks nothing.
const probeSQL = `SELECT pg_catalog.pg_notify($1, $2)`

// probeListen is the notifier's probe: sent through the pool, from another
// session, it arrives only where a release's notification would.
func (k *Locker) probeListen(ctx context.Context, payload string) error {
	_, err := k.pool.Exec(ctx, probeSQL, NotifyChannel, payload)
	return err
}

// probeTimeout is how long the LISTEN connection waits for its probe.
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

// suspectListen has the LISTEN connection, if any, check itself now: a
// statement just failed with a transient error.
func (k *Locker) suspectListen() {
	k.mu.Lock()
	n := k.listener
	k.mu.Unlock()
	n.Suspect()
}
