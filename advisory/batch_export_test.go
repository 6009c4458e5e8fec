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
func SetOnBatch(k *Locker, f func(locks, unlocks int)) { k.onBatch = f }

// SessionPID returns the backend pid of k's only session.
func SessionPID(k *Locker) int32 {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.sessions[0].pid
}
