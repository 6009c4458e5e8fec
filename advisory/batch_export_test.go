package advisory

// HoldTurn takes the turn of k's only session, which must be open, so that
// the lock requests routed to it queue up until the returned function gives
// the turn back; they then run in one statement.
func HoldTurn(k *Locker) (giveBack func()) {
	k.mu.Lock()
	if len(k.sessions) != 1 {
		k.mu.Unlock()
		panic("HoldTurn: the Locker has no single session")
	}
	s := k.sessions[0]
	k.mu.Unlock()
	s.sem <- struct{}{}
	return func() { <-s.sem }
}

// Pending returns the number of lock requests queued on k's sessions.
func Pending(k *Locker) int {
	k.mu.Lock()
	sessions := append([]*session(nil), k.sessions...)
	k.mu.Unlock()
	n := 0
	for _, s := range sessions {
		s.qmu.Lock()
		n += len(s.pending)
		s.qmu.Unlock()
	}
	return n
}

// SetOnBatch has k call f with the numbers of lock requests and unlocks
// each turn of a session answers.
func SetOnBatch(k *Locker, f func(locks, unlocks int)) { hooksOf(k).onBatch = f }

// SessionPID returns the backend pid of k's only session.
func SessionPID(k *Locker) int32 {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.sessions[0].pid
}

// SetAfterUnlocks has k call f in a session's turn once its unlocks are
// answered, before it takes the lock requests queued meanwhile.
func SetAfterUnlocks(k *Locker, f func()) { hooksOf(k).afterUnlocks = f }

// SetNoRecollect has k's turns leave the lock requests queued while their
// unlocks ran to the next turn (the negative control of the recollection).
func SetNoRecollect(k *Locker) { hooksOf(k).noRecollect = true }

// SetSessionFill sets the acquisitions in flight on a session from which
// k routes new keys to another session.
func SetSessionFill(k *Locker, n int) { hooksOf(k).fill = n }

// Sessions returns the number of k's live or opening sessions.
func Sessions(k *Locker) int {
	k.mu.Lock()
	defer k.mu.Unlock()
	return len(k.sessions)
}

// SetMaxLockBatch sets the most lock requests one statement of k carries,
// and has k call f with the number of requests of each lock statement.
func SetMaxLockBatch(k *Locker, n int, f func(requests int)) {
	h := hooksOf(k)
	h.maxLockBatch, h.onLockStatement = n, f
}
