// Package sysproc holds the process-attribute settings shared by the code
// that spawns child processes (internal/supervise, internal/demo, internal/pgtest).
//
// # Parent-death signal
//
// [SetParentDeathSignal] asks the kernel to signal a child when its parent
// dies, on Linux; elsewhere it does nothing.
package sysproc
