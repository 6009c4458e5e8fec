//go:build !linux

package pgtest

import "syscall"

// setParentDeathSignal does nothing where the kernel has no parent-death
// signal: a child outlives its parent if the parent is killed.
func setParentDeathSignal(*syscall.SysProcAttr, syscall.Signal) {}
