//go:build !unix

package advisory

import "net"

// readable cannot tell on this platform: the watchdog's periodic checks
// alone notice a session the server ended.
func readable(net.Conn) (ready, ok bool) { return false, false }
