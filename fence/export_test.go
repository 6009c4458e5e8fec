package fence

// WithAfterFast returns a copy of s that calls f after its fast statement
// wrote nothing, before the full statement is sent; noRerun turns off the
// rerun of a lost race.
func WithAfterFast(s *UpsertStmt, f func(), noRerun bool) *UpsertStmt {
	c := *s
	c.g.testAfterFast, c.g.testNoRerun = f, noRerun
	return &c
}
