package advisory

import "time"

// SetFirstPause sets the first pause of k's waiting Acquire calls (normally
// 5ms), so that tests can make a waiter's next poll later than its
// WaitTimeout.
func SetFirstPause(k *Locker, d time.Duration) { k.firstPause = d }

// Waiters returns the number of k's Acquire calls registered for wake-ups on
// key.
func Waiters(k *Locker, key Key) int {
	k.mu.Lock()
	defer k.mu.Unlock()
	if in := k.interests[key.id]; in != nil {
		return in.waiters
	}
	return 0
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
