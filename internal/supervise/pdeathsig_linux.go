package supervise

import "syscall"

// setParentDeathSignal makes the kernel send sig to the child when the
// thread that started it exits (Linux's parent-death signal). The Go
// runtime ends a thread only when a goroutine locked to it exits, which
// Start's callers do not do, so in practice: when this process dies.
func setParentDeathSignal(attr *syscall.SysProcAttr, sig syscall.Signal) { attr.Pdeathsig = sig }
