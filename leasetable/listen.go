package leasetable

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgfence/pgfence"
	"github.com/pgfence/pgfence/internal/listenconn"
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
	// The connection is the Locker's own, its notifications buffered for
	// WaitForNotification; the health check in nextNotification ends a
	// wait by letting its context time out, which leaves it usable (see
	// listenconn.Config).
	conn, err := listenconn.Open(k.closeCtx, k.cfg.ListenConnConfig, NotifyChannel)
	if err != nil {
		return false, err
	}
	defer listenconn.Close(conn)
	k.cfg.Logger.Debug("pgfence: leasetable: LISTEN connection ready", "channel", NotifyChannel)
	k.wakeAll()
	for {
		n, err := k.nextNotification(conn)
		if err != nil {
			return true, err
		}
		k.notify(n.Payload)
	}
}

// nextNotification waits for the next notification on conn. Whenever none
// has arrived for ListenCheckInterval, it checks the connection with a round
// trip bounded by the shorter of that interval and maxListenCheckTimeout,
// and returns an error if the check fails. Notifications that arrive during
// a check are buffered by pgx and returned next.
//
// A connection that died silently would otherwise block WaitForNotification
// until the kernel gives up on it, while every hand-over falls back to the
// holder's expiry: with pgx's default dialer (a zero net.Dialer, hence Go's
// keepalive defaults of 15s idle, 15s between probes and 9 probes) about
// 2.5 minutes after the path went dead on Linux; longer with a dialer that
// turns keepalive off or slows it; and never while a proxy or pooler in
// between still acknowledges at the TCP level but no longer forwards.
func (k *Locker) nextNotification(conn *pgx.Conn) (*pgconn.Notification, error) {
	interval := k.cfg.ListenCheckInterval
	if interval < 0 {
		return conn.WaitForNotification(k.closeCtx)
	}
	for {
		ctx, cancel := context.WithTimeout(k.closeCtx, interval)
		n, err := conn.WaitForNotification(ctx)
		cancel()
		if err == nil || k.closeCtx.Err() != nil || !pgconn.Timeout(err) || conn.IsClosed() {
			return n, err
		}
		// Nothing arrived for an interval, and the connection is still
		// usable (see listenconn.Config): check it. If the check times out,
		// pgconn closes the connection (a timeout during a query is
		// fatal) in a goroutine of its own, which the caller's deferred
		// listenconn.Close waits for.
		timeout := min(interval, maxListenCheckTimeout)
		ctx, cancel = context.WithTimeout(k.closeCtx, timeout)
		err = listenconn.Check(ctx, conn, NotifyChannel)
		cancel()
		if err != nil {
			if k.closeCtx.Err() != nil {
				return nil, err
			}
			return nil, fmt.Errorf("pgfence: leasetable: health check of the LISTEN connection, "+
				"silent for %v, failed (timeout %v): %w", interval, timeout, err)
		}
	}
}
