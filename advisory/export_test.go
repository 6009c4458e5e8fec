package advisory

import (
	"time"

	"github.com/pgfence/pgfence/internal/waitline"
)

// SetFirstPause sets the first pause of k's waiting Acquire calls (normally
// 5ms), so that tests can make a waiter's next poll later than its
// WaitTimeout.
func SetFirstPause(k *Locker, d time.Duration) { k.firstPause = d }

// Waiters returns the number of k's Acquire calls waiting for key: those
// in its line (refused once at least), the head that listens for wake-ups
// and the calls queued behind it.
func Waiters(k *Locker, key Key) int { return k.lines.Members(key.id) }

// Registered reports whether k has registered for wake-ups on key (its
// line holds a registration).
func Registered(k *Locker, key Key) bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	in := k.interests[key.id]
	return in != nil && in.waiters > 0
}

// SetNotifyAfterHeld sets how long k's locks must have been held for their
// Release to look for waiters to notify (normally 0: every Release looks),
// so that tests can build a holder that never notifies.
func SetNotifyAfterHeld(k *Locker, d time.Duration) { k.notifyHeld = d }

// SetNoRetry turns off k's retries of transient errors (the negative
// control of the resilience tests): an attempt's transient error is
// returned at once, matching pgfence.ErrUnavailable.
func SetNoRetry(k *Locker) { k.noRetry = true }

// SetNoPeek turns off the watchdog's look at idle sessions' sockets
// between checks (the negative control of the prompt-loss tests): a
// session the server ended is then noticed at the next check only.
func SetNoPeek(k *Locker) { k.peek = 0 }

// SetOnRound sets a function run each time one of k's waiting Acquire
// calls goes round its loop again (woken, or at the end of a pause).
func SetOnRound(k *Locker, f func()) { k.onRound = f }

// SetNoLine makes every waiting Acquire call of k the head of its key's
// line, so that each is woken by every release and notification (the
// negative control of the line's tests).
func SetNoLine(k *Locker) { k.lines = waitline.New[int64](true) }

// SetOnRefused sets a function run each time the server refuses an attempt
// of one of k's acquires (another session holds the key).
func SetOnRefused(k *Locker, f func()) { k.onRefused = f }

// SetNoPark keeps k's waiting Acquire calls from parking on a session
// (park.go): they poll and listen for wake-ups instead, as they do when no
// session can be parked. The tests of that path use it.
func SetNoPark(k *Locker) { k.noPark = true }

// SetCloseNoWait makes k's Close return at once, closing its sessions and
// releasing their locks in the background (the negative control of the
// Close race tests).
func SetCloseNoWait(k *Locker) { k.closeNoWait = true }

// SetWakeGap sets the least time between two attempts of k's waiting
// Acquire calls woken by notifications (normally 25ms); 0 turns the bound
// off (the negative control of the forged-notification tests).
func SetWakeGap(k *Locker, d time.Duration) { k.wakeGap = d }

// SetOnWake sets a function run each time a notification wakes one of k's
// waiting Acquire calls, with the time it then waits before its attempt.
func SetOnWake(k *Locker, f func(wait time.Duration)) { k.onWake = f }
