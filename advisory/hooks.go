package advisory

import (
	"errors"
	"time"

	"github.com/pgfence/pgfence"
)

// testHooks holds the knobs and callbacks that tests set (export_test.go).
// A Locker's hooks are nil outside tests; the methods below then answer
// with the production values and call nothing.
type testHooks struct {
	firstPause   time.Duration // first pause of a polling wait
	wakeGap      time.Duration // least time between two notified attempts
	peek         time.Duration // the watchdog's look at idle sockets; 0: off
	fill         int           // acquisitions in flight before a new session
	maxLockBatch int           // lock requests per combined statement
	notifyHeld   time.Duration // unlocks of locks held shorter do not notify
	noRetry      bool          // transient errors are returned at once
	noPark       bool          // waiting calls never park
	noRecollect  bool          // a turn leaves requests queued during its unlocks
	closeNoWait  bool          // Close returns before its sessions are closed
	keepWatcher  bool          // sessions keep the pool's context watcher
	keepWarned   bool          // grants of a statement that drew a WARNING are handed out
	lateChannels bool          // a refused call sleeps on the wake channel taken after its attempt

	afterGrant      func(*Lease)             // between a grant and its hand-out
	onRound         func()                   // each further round of a waiting call
	onRefused       func()                   // each refusal by the server
	onWake          func(wait time.Duration) // each notified wake-up
	onNotified      func()                   // each notification that woke a key's waiters
	onBatch         func(locks, unlocks int) // each turn of a session
	afterUnlocks    func()                   // in a turn, after its unlocks
	onLockStatement func(requests int)       // each lock statement
}

// lateWake reports whether a refused call sleeps on the wake channel it
// registers after its attempt, missing a notification that came between:
// the negative control of TestWakeBetweenAttemptAndSleep.
func (h *testHooks) lateWake() bool { return h != nil && h.lateChannels }

func (h *testHooks) pauseStart() time.Duration {
	if h == nil {
		return minPollInterval
	}
	return h.firstPause
}

func (h *testHooks) notifiedGap() time.Duration {
	if h == nil {
		return minWakeGap
	}
	return h.wakeGap
}

func (h *testHooks) peekEvery() time.Duration {
	if h == nil {
		return sessionPeekInterval
	}
	return h.peek
}

func (h *testHooks) fillAt() int {
	if h == nil {
		return sessionFill
	}
	return h.fill
}

func (h *testHooks) lockBatchMax() int {
	if h == nil {
		return maxLockBatch
	}
	return h.maxLockBatch
}

func (h *testHooks) notifyAfter() time.Duration {
	if h == nil {
		return 0
	}
	return h.notifyHeld
}

func (h *testHooks) retries() bool   { return h == nil || !h.noRetry }
func (h *testHooks) parks() bool     { return h == nil || !h.noPark }
func (h *testHooks) recollect() bool { return h == nil || !h.noRecollect }

func (h *testHooks) pinsDeadlineWatcher() bool { return h == nil || !h.keepWatcher }

func (h *testHooks) keepsWarnedGrants() bool { return h != nil && h.keepWarned }

func (h *testHooks) round() {
	if h != nil && h.onRound != nil {
		h.onRound()
	}
}

func (h *testHooks) refused(err error) {
	if h != nil && h.onRefused != nil && errors.Is(err, pgfence.ErrNotAcquired) {
		h.onRefused()
	}
}

func (h *testHooks) woke(wait time.Duration) {
	if h != nil && h.onWake != nil {
		h.onWake(wait)
	}
}

func (h *testHooks) notified() {
	if h != nil && h.onNotified != nil {
		h.onNotified()
	}
}

func (h *testHooks) turn(locks, unlocks int) {
	if h != nil && h.onBatch != nil {
		h.onBatch(locks, unlocks)
	}
}

func (h *testHooks) unlocksAnswered() {
	if h != nil && h.afterUnlocks != nil {
		h.afterUnlocks()
	}
}

func (h *testHooks) lockStatement(requests int) {
	if h != nil && h.onLockStatement != nil {
		h.onLockStatement(requests)
	}
}
