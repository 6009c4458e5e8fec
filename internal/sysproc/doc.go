// Package sysproc holds the process-attribute settings shared by the code
// that spawns child processes (internal/pgserver, internal/pgtest, and the
// pgfence binary's supervise and demo).
//
// # Parent-death signal
//
// [SetParentDeathSignal] asks the kernel to signal a child when its parent
// dies, on Linux; elsewhere it does nothing.
//
// # Child subreaper
//
// [SetChildSubreaper] makes orphaned descendants of this process (including
// those that called setsid()) its children instead of init's, on Linux;
// elsewhere it fails with errors.ErrUnsupported.
package sysproc
