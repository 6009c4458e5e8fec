package leader

// DisableHandover makes e campaign again at once after a resignation,
// without waiting for a hand-over: the negative control of the hand-over
// tests. Call it before e's first Campaign or Run.
func DisableHandover(e *Elector) { e.hooks = &testHooks{noHandover: true} }

// Listening reports whether e's observers' LISTEN connection is listening.
func Listening(e *Elector) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.listener.Listening()
}

// DisableInterest keeps e's observers from taking the election's interest
// key, so that no release notifies them: a negative control. Call it
// before e's first Observe.
func DisableInterest(e *Elector) { e.hooks = &testHooks{noInterest: true} }
