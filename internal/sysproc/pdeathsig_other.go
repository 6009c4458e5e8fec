//go:build !linux

package sysproc

import "syscall"

// SetParentDeathSignal does nothing where the kernel has no parent-death
// signal: a child outlives its parent if the parent is killed.
func SetParentDeathSignal(*syscall.SysProcAttr, syscall.Signal) {}
