package advisory

import (
	"context"
	"math/rand/v2"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
)

// listenSQL subscribes the Locker's LISTEN connection to NotifyChannel (a
// fixed, lower-case identifier that needs no quoting); it takes no lock.
const listenSQL = "LISTEN " + NotifyChannel

// listenAppSuffix is appended to Config.ApplicationName for the LISTEN
// connection, which holds no lock.
const listenAppSuffix = "-listen"

// Backoff between attempts to (re)open the LISTEN connection, and the bound
// on opening it.
const (
	minListenBackoff = 50 * time.Millisecond
	maxListenBackoff = 5 * time.Second
	listenDialBound  = 10 * time.Second
)

// waiter is a Lock call waiting for a key held by another process.
type waiter struct {
	ch chan struct{} // one slot: a pending wake-up
}

func (w *waiter) wake() {
	select {
	case w.ch <- struct{}{}:
	default:
	}
}

// addWaiter registers a waiter for releases of key id announced on
// NotifyChannel, starting the Locker's listener on first use.
func (l *Locker) addWaiter(id int64) *waiter {
	w := &waiter{ch: make(chan struct{}, 1)}
	l.mu.Lock()
	defer l.mu.Unlock()
	set := l.waiters[id]
	if set == nil {
		set = make(map[*waiter]struct{})
		l.waiters[id] = set
	}
	set[w] = struct{}{}
	if !l.listening && !l.closed {
		l.listening = true
		l.wg.Add(1)
		go l.listen()
	}
	return w
}

func (l *Locker) removeWaiter(id int64, w *waiter) {
	l.mu.Lock()
	defer l.mu.Unlock()
	set := l.waiters[id]
	delete(set, w)
	if len(set) == 0 {
		delete(l.waiters, id)
	}
}

// wakeAll wakes every waiter so each retries at once: it runs when the
// listener has (re)connected, as a release may have gone unheard meanwhile.
func (l *Locker) wakeAll() {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, set := range l.waiters {
		for w := range set {
			w.wake()
		}
	}
}

// notified wakes the waiters of the key in an announcement's payload.
func (l *Locker) notified(payload string) {
	id, err := strconv.ParseInt(payload, 10, 64)
	if err != nil {
		l.log.Debug("advisory: ignored a notification with a payload that is no key", "payload", payload)
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	for w := range l.waiters[id] {
		w.wake()
	}
}

// listen keeps the Locker's LISTEN connection open until Close, reopening
// it with capped, jittered exponential backoff when it fails. Meanwhile
// waiters fall back to polling. The connection is the Locker's own, dialed
// like the lock sessions; it holds no lock.
func (l *Locker) listen() {
	defer l.wg.Done()
	backoff := minListenBackoff
	t := time.NewTimer(time.Hour)
	defer t.Stop()
	for {
		connected, err := l.listenOnce()
		if l.closeCtx.Err() != nil {
			return
		}
		if connected {
			backoff = minListenBackoff
		}
		l.log.Warn("advisory: LISTEN connection failed; waiters poll until it is back", "error", err, "retry_in", backoff)
		t.Reset(backoff + rand.N(backoff/2))
		select {
		case <-t.C:
		case <-l.closeCtx.Done():
			return
		}
		backoff = min(2*backoff, maxListenBackoff)
	}
}

// listenOnce opens the LISTEN connection and delivers announcements until
// it fails or the Locker is closed. connected reports whether LISTEN
// succeeded.
func (l *Locker) listenOnce() (connected bool, err error) {
	dialCtx, cancel := context.WithTimeout(l.closeCtx, listenDialBound)
	conn, err := pgx.ConnectConfig(dialCtx, l.listenCfg)
	if err == nil {
		_, err = conn.Exec(dialCtx, listenSQL)
	}
	cancel()
	if conn != nil {
		defer func() {
			ctx, cancel := context.WithTimeout(context.Background(), l.cfg.QueryTimeout)
			defer cancel()
			_ = conn.Close(ctx)
		}()
	}
	if err != nil {
		return false, err
	}
	l.log.Debug("advisory: LISTEN connection ready", "channel", NotifyChannel, "pid", conn.PgConn().PID())
	l.wakeAll()
	for {
		n, err := conn.WaitForNotification(l.closeCtx)
		if err != nil {
			return true, err
		}
		l.notified(n.Payload)
	}
}
