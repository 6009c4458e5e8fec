package leader

// DisableHandover makes e campaign again at once after a resignation,
// without waiting for a hand-over: the negative control of the hand-over
// tests. Call it before e's first Campaign or Run.
func DisableHandover(e *Elector) { e.hooks = &testHooks{noHandover: true} }
