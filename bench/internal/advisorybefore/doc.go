// Package advisory is a frozen copy of pgfence's package advisory as of
// commit 486daa1, before issue 18 combined the lock statements of
// concurrent acquires on a session: every grant there runs its own
// statement (one round trip, one transaction id, one WAL flush). The
// benchmark (scenario 10) runs it beside the current package in the same
// run, so that "before" and "after" share the machine's load. It is not
// maintained: fix nothing here, and do not import it outside bench/.
package advisory
