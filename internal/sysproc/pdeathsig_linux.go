package sysproc

import "syscall"

// SetParentDeathSignal makes the kernel send sig to the child when the
// thread that started it exits (Linux's parent-death signal). The Go
// runtime ends a thread only when a goroutine locked to it exits, so unless
// the caller starts the child from such a goroutine: when this process dies.
func SetParentDeathSignal(attr *syscall.SysProcAttr, sig syscall.Signal) { attr.Pdeathsig = sig }
