package leasetable

import (
	"context"
	"time"

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
	k.waiterSeq++
	w := &waiter{ch: make(chan struct{}, 1), seq: k.waiterSeq}
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
			Listening:     k.wakeAll,
			Probe:         k.probeListen,
			ProbeTimeout:  probeTimeout(k.cfg.ListenCheckInterval),
			Lost:          k.listenLost,
			Restored:      k.listenRestored,
		}, &k.background)
	}
	return w, nil
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
