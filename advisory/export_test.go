package advisory

import "time"

// SetFirstPause sets the first pause of l's waiting Lock calls (normally
// 5ms), so that tests can make a waiter's next poll later than its
// WaitTimeout.
func SetFirstPause(l *Locker, d time.Duration) { l.firstPause = d }

// Waiters returns the number of l's Lock calls registered for wake-ups on
// key.
func Waiters(l *Locker, key Key) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	if in := l.interests[key.id]; in != nil {
		return in.waiters
	}
	return 0
}

// SetNotifyAfterHeld sets how long l's locks must have been held for their
// Unlock to notify waiters (normally 20ms), so that tests can unlock at once.
func SetNotifyAfterHeld(l *Locker, d time.Duration) { l.notifyHeld = d }
