package leasetable

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgfence/pgfence"
)

// addWaiter registers a waiter for name's release notifications, starting
// the Locker's listener on first use.
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
		k.background.Add(1)
		go k.listen()
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
// listener has (re)connected, as a release may have been missed meanwhile.
func (k *Locker) wakeAll() {
	k.mu.Lock()
	defer k.mu.Unlock()
	for _, set := range k.waiters {
		for w := range set {
			w.wake()
		}
	}
}

func (k *Locker) notify(name string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	for w := range k.waiters[name] {
		w.wake()
	}
}

// listen keeps one LISTEN connection open until the Locker is closed,
// reconnecting with capped exponential backoff when it fails. The
// connection is the Locker's own, opened from the listen configuration; it
// never goes back to a pool.
func (k *Locker) listen() {
	defer k.background.Done()
	const minBackoff, maxBackoff = 50 * time.Millisecond, 5 * time.Second
	backoff := minBackoff
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		connected, err := k.listenOnce()
		if k.closeCtx.Err() != nil {
			return
		}
		if connected {
			backoff = minBackoff
		}
		k.cfg.Logger.Warn("pgfence: leasetable: LISTEN connection failed; waiters fall back to timed retries until it is back",
			"error", err, "retry_in", backoff)
		timer.Reset(jitter(backoff, backoff*3/2))
		select {
		case <-timer.C:
		case <-k.closeCtx.Done():
			return
		}
		backoff = min(2*backoff, maxBackoff)
	}
}

// listenOnce connects, listens and delivers notifications until the
// connection fails or the Locker is closed. connected reports whether LISTEN
// succeeded.
func (k *Locker) listenOnce() (connected bool, err error) {
	connectCtx, cancel := context.WithTimeout(k.closeCtx, 10*time.Second)
	conn, err := pgx.ConnectConfig(connectCtx, k.cfg.ListenConnConfig.Copy())
	cancel()
	if err != nil {
		return false, err
	}
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_ = conn.Close(ctx)
	}()
	if _, err := conn.Exec(k.closeCtx, "LISTEN "+pgx.Identifier{NotifyChannel}.Sanitize()); err != nil {
		return false, err
	}
	k.cfg.Logger.Debug("pgfence: leasetable: LISTEN connection ready", "channel", NotifyChannel)
	k.wakeAll()
	for {
		n, err := conn.WaitForNotification(k.closeCtx)
		if err != nil {
			return true, err
		}
		k.notify(n.Payload)
	}
}
