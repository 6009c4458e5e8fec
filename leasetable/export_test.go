package leasetable

import (
	"time"

	"github.com/pgfence/pgfence/internal/waitline"
)

// hooksOf returns k's test hooks, creating them: call it before using k.
func hooksOf(k *Locker) *testHooks {
	if k.hooks == nil {
		k.hooks = &testHooks{}
	}
	return k.hooks
}

// SetNoRetry turns off the retries of transient database errors, for the
// negative controls of the failover tests. Call it before using k.
func SetNoRetry(k *Locker) { hooksOf(k).noRetry = true }

// SetKeepStale keeps the connections on which a statement failed because
// the server is read-only, for a negative control. Call it before using k.
func SetKeepStale(k *Locker) { hooksOf(k).keepStale = true }

// SetNoShareAttempts makes every waiting Acquire of k send its own attempt
// rather than wait for one in flight, for the negative control of the
// herd test. Call it before using k.
func SetNoShareAttempts(k *Locker) { hooksOf(k).noShare = true }

// SetNoLine makes every waiting Acquire of k the head of its name's line,
// so that each is woken by every release (the negative control of the
// line's tests). Call it before using k.
func SetNoLine(k *Locker) { k.lines = waitline.New[string](true) }

// SetOnRound sets a function run each time one of k's waiting Acquire
// calls goes round its loop again (woken, or at its retry time), as
// advisory.SetOnRound does. Call it before using k.
func SetOnRound(k *Locker, f func()) { hooksOf(k).onRound = f }

// SetOnListen sets a function run when one of k's waiting Acquire calls
// first waits for notifications, before it has the LISTEN connection
// subscribe. Call it before using k.
func SetOnListen(k *Locker, f func()) { hooksOf(k).onListen = f }

// SetNoListenWake keeps k's LISTEN connection from waking the waiters when
// it connects or subscribes, for a negative control. Call it before using
// k.
func SetNoListenWake(k *Locker) { hooksOf(k).noListenWake = true }

// TrackListenAsks has k count the times its LISTEN connection asks whether
// to listen (see ListenAsked). Call it before using k.
func TrackListenAsks(k *Locker) { hooksOf(k) }

// KickListen has k's LISTEN connection, once started, ask again whether to
// listen (as a waiter's arrival or the linger's end does).
func KickListen(k *Locker) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.listener.Kick()
}

// ListenAsked returns how many times k's LISTEN connection asked whether
// to listen since TrackListenAsks, and the last answer.
func ListenAsked(k *Locker) (int64, bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.hooks.listenAsked, k.listenAnswer
}

// Waiters returns the number of k's Acquire calls in name's line.
func Waiters(k *Locker, name string) int { return k.lines.Members(name) }

// SetFastestRenewal sets the shortest renewal round trip k has seen (a
// renewal with less time left before its deadline is not sent); answered
// renewals may lower it. Call it before using k.
func SetFastestRenewal(k *Locker, d time.Duration) { k.renewRTT.Store(int64(d)) }

// FastestRenewal returns the shortest renewal round trip k has seen.
func FastestRenewal(k *Locker) time.Duration { return k.fastestRenewal() }

// SetSendLateRenewals has k send a renewal however little time is left
// before its deadline, for a negative control. Call it before using k.
func SetSendLateRenewals(k *Locker) { hooksOf(k).lateRenewals = true }

// SetNoGrantWait has Close return without waiting for grants in flight
// (the negative control of TestCloseRacingAcquire). Call it before using k.
func SetNoGrantWait(k *Locker) { hooksOf(k).noGrantWait = true }

// SetOnArm sets a function run on k's LISTEN connection just before it
// takes the interest keys of names. Call it before using k.
func SetOnArm(k *Locker, f func(names []string)) { hooksOf(k).onArm = f }

// SetNoArmWake keeps k from waking a name's waiters when its LISTEN
// connection took the name's interest key, for a negative control. Call it
// before using k.
func SetNoArmWake(k *Locker) { hooksOf(k).noArmWake = true }

// SetNoInterest keeps k's waiters from taking interest keys, so that no
// release notifies them, for a negative control. Call it before using k.
func SetNoInterest(k *Locker) { hooksOf(k).noInterest = true }

// Notified returns the newest released token whose notification k acted
// on for name, and whether k watches name (a waiter for it is registered).
func Notified(k *Locker, name string) (int64, bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	wa := k.watched[name]
	if wa == nil {
		return 0, false
	}
	return wa.notified, true
}

// InterestHeld reports whether k's LISTEN connection holds name's interest
// key.
func InterestHeld(k *Locker, name string) bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	in := k.interests[name]
	return in != nil && in.held
}
