//go:build !linux

package supervise

import "syscall"

// setParentDeathSignal does nothing where the kernel has no parent-death
// signal: the command outlives this process if it is killed.
func setParentDeathSignal(*syscall.SysProcAttr, syscall.Signal) {}
