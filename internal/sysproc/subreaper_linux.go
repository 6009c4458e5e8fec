package sysproc

import "syscall"

// prSetChildSubreaper is PR_SET_CHILD_SUBREAPER from <linux/prctl.h>.
const prSetChildSubreaper = 36

// SetChildSubreaper marks this process as a child subreaper (Linux 3.4 and
// later): a process that loses its parent below it, even one that called
// setsid(), is reparented to this process rather than to init, so it stays
// visible (as a descendant in /proc) and can be killed and reaped here.
func SetChildSubreaper() error {
	if _, _, errno := syscall.RawSyscall(syscall.SYS_PRCTL, prSetChildSubreaper, 1, 0); errno != 0 {
		return errno
	}
	return nil
}
