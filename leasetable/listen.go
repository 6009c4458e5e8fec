package leasetable

import (
	"github.com/pgfence/pgfence"
	"github.com/pgfence/pgfence/internal/notifier"
)

// addWaiter registers a waiter for name's release notifications, starting
// the Locker's LISTEN connection on first use.
func (k *Locker) addWaiter(name string) (*waiter, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.closed {
		return nil, pgfence.ErrClosed
	}
	w := &waiter{ch: make(chan struct{}, 1)}
	set := k.waiters[name]
	if set == nil {
		set = make(map[*waiter]struct{})
		k.waiters[name] = set
	}
	set[w] = struct{}{}
	if !k.listenerStarted && !k.cfg.DisableListen {
		k.listenerStarted = true
		notifier.Start(k.closeCtx, notifier.Config{
			ConnConfig:    k.cfg.ListenConnConfig,
			Channel:       NotifyChannel,
			CheckInterval: k.cfg.ListenCheckInterval,
			CheckTimeout:  min(k.cfg.ListenCheckInterval, maxListenCheckTimeout),
			Logger:        k.cfg.Logger,
			LogPrefix:     "pgfence: leasetable",
			Notify:        k.notify,
			Listening:     k.wakeAll,
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
	}
}

// wakeAll wakes every waiter, so each retries at once: it runs when the
// LISTEN connection is (again) listening, as a release may have been missed
// meanwhile.
func (k *Locker) wakeAll() {
	k.mu.Lock()
	defer k.mu.Unlock()
	for _, set := range k.waiters {
		for w := range set {
			w.wake()
		}
	}
}

// notify wakes the waiters for the lease a notification names.
func (k *Locker) notify(name string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	for w := range k.waiters[name] {
		w.wake()
	}
}
