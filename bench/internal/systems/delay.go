package systems

import (
	"context"
	"net"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// delayedConn sleeps d before every Write: a statement (one write of its
// messages, then the server's answer) waits d once, as it would for a
// network round trip. Reads are not delayed. Writes that follow each other
// without an answer between them (a pipeline) would each wait, where a
// network delays them together; pgfence and the compared systems send a
// statement and read its answer before the next.
type delayedConn struct {
	net.Conn
	d time.Duration
}

// Write sleeps d, then writes b.
func (c *delayedConn) Write(b []byte) (int, error) {
	time.Sleep(c.d)
	return c.Conn.Write(b)
}

// delayedDial wraps dial (a pgx DialFunc, such as the one ParseConfig
// sets) so that every write on the connections it opens is delayed by d.
func delayedDial(dial pgconn.DialFunc, d time.Duration) pgconn.DialFunc {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return &delayedConn{Conn: c, d: d}, nil
	}
}
