//go:build unix

package advisory

import (
	"net"
	"syscall"

	"golang.org/x/sys/unix"
)

// readable reports, without reading anything, whether conn's socket has
// bytes or its end waiting to be read (poll(2) with a zero timeout). ok is
// false when the connection does not expose its socket (a custom
// DialFunc's net.Conn), and nothing can be told. A TLS connection is
// looked through to its network connection.
func readable(conn net.Conn) (ready, ok bool) {
	if c, isTLS := conn.(interface{ NetConn() net.Conn }); isTLS {
		conn = c.NetConn()
	}
	sc, isSyscall := conn.(syscall.Conn)
	if !isSyscall {
		return false, false
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return false, false
	}
	var n int
	var perr error
	if err := raw.Control(func(fd uintptr) {
		fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		for {
			n, perr = unix.Poll(fds, 0)
			if perr != unix.EINTR {
				break
			}
		}
		if n > 0 && fds[0].Revents == 0 {
			n = 0
		}
	}); err != nil || perr != nil {
		return false, false
	}
	return n > 0, true
}
