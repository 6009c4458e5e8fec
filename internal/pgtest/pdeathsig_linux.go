package pgtest

import "syscall"

// setParentDeathSignal makes the kernel send sig to the child when the
// thread that started it exits (Linux's parent-death signal).
func setParentDeathSignal(attr *syscall.SysProcAttr, sig syscall.Signal) { attr.Pdeathsig = sig }
