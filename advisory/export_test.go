package advisory

import (
	"time"

	"github.com/pgfence/pgfence/internal/waitline"
)

// hooksOf returns k's test hooks, made with the production values on first
// use.
func hooksOf(k *Locker) *testHooks {
	if k.hooks == nil {
		k.hooks = &testHooks{
			firstPause:   minPollInterval,
			wakeGap:      minWakeGap,
			peek:         sessionPeekInterval,
			fill:         sessionFill,
			maxLockBatch: maxLockBatch,
		}
	}
	return k.hooks
}

// SetFirstPause sets the first pause of k's waiting Acquire calls, so that
// tests can make a waiter's next poll later than its WaitTimeout.
func SetFirstPause(k *Locker, d time.Duration) { hooksOf(k).firstPause = d }

// Waiters returns the number of k's Acquire calls waiting for key: those
// in its line (refused once at least), the head and the calls behind it.
func Waiters(k *Locker, key Key) int { return k.lines.Members(key.id) }

// Registered reports whether k has registered for wake-ups on key.
func Registered(k *Locker, key Key) bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	in := k.interests[key.id]
	return in != nil && in.waiters > 0
}

// SetNotifyAfterHeld sets how long k's locks must have been held for their
// Release to look for waiters to notify (0: every Release looks), so that
// tests can build a holder that never notifies.
func SetNotifyAfterHeld(k *Locker, d time.Duration) { hooksOf(k).notifyHeld = d }

// SetNoRetry turns off k's retries of transient errors (the negative
// control of the resilience tests).
func SetNoRetry(k *Locker) { hooksOf(k).noRetry = true }

// SetNoPeek turns off the watchdog's look at idle sessions' sockets (the
// negative control of the prompt-loss tests).
func SetNoPeek(k *Locker) { hooksOf(k).peek = 0 }

// SetOnRound sets a function run each time one of k's waiting Acquire
// calls goes round its loop again.
func SetOnRound(k *Locker, f func()) { hooksOf(k).onRound = f }

// SetNoLine makes every waiting Acquire call of k the head of its key's
// line (the negative control of the line's tests).
func SetNoLine(k *Locker) { k.lines = waitline.New[int64](true) }

// SetOnRefused sets a function run each time the server refuses an attempt
// of one of k's acquires.
func SetOnRefused(k *Locker, f func()) { hooksOf(k).onRefused = f }

// SetNoPark keeps k's waiting Acquire calls from parking on a session: they
// poll and listen for wake-ups instead.
func SetNoPark(k *Locker) { hooksOf(k).noPark = true }

// SetCloseNoWait makes k's Close return at once, closing its sessions in
// the background (the negative control of the Close race tests).
func SetCloseNoWait(k *Locker) { hooksOf(k).closeNoWait = true }

// SetWakeGap sets the least time between two attempts of k's waiting
// Acquire calls woken by notifications; 0 turns the bound off (the negative
// control of the forged-notification tests).
func SetWakeGap(k *Locker, d time.Duration) { hooksOf(k).wakeGap = d }

// SetOnWake sets a function run each time a notification wakes one of k's
// waiting Acquire calls, with the time it then waits before its attempt.
func SetOnWake(k *Locker, f func(wait time.Duration)) { hooksOf(k).onWake = f }

// SetLateWakeChannel makes k's refused calls sleep on the wake channel they
// take after their attempt: the negative control of the wake-up race.
func SetLateWakeChannel(k *Locker) { hooksOf(k).lateChannels = true }

// SetOnNotified sets a function run each time a notification has woken the
// waiters of one of k's keys.
func SetOnNotified(k *Locker, f func()) { hooksOf(k).onNotified = f }
