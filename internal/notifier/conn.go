package notifier

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgconn/ctxwatch"
)

// connConfig returns a copy of cc for a LISTEN connection that the library owns.
//
// pgx buffers notifications for WaitForNotification only when the
// configuration has no OnNotification callback of its own; with one (say,
// on the pool the caller uses for its own LISTEN), every notification would
// go to that callback and WaitForNotification would return none. The
// connection is the library's own: the copy drops the callback.
//
// A wait for notifications is ended by its context (for a health check, or
// to run a statement on the connection), and that must leave the connection
// usable. With pgconn's DeadlineContextWatcherHandler (the default that
// ParseConfig installs) the context's end sets a deadline on the net.Conn;
// the read then fails with a timeout error, which pgconn does not treat as
// fatal (peekMessage closes the connection on every other read error), and
// the chunk reader keeps the bytes of a message read only in part, so the
// next read resumes it. Only a timeout during a query (MultiResultReader)
// closes the connection. The pool's configuration may carry another handler,
// such as CancelRequestContextWatcherHandler, which would open a connection
// to send a cancel request at every such interruption, and whose late cancel
// could hit the statement that follows; so the copy always uses the deadline
// handler.
func connConfig(cc *pgx.ConnConfig) *pgx.ConnConfig {
	c := cc.Copy()
	c.OnNotification = nil
	c.BuildContextWatcherHandler = func(pc *pgconn.PgConn) ctxwatch.Handler {
		return &pgconn.DeadlineContextWatcherHandler{Conn: pc.Conn()}
	}
	return c
}

// setupTimeout bounds open: connecting and subscribing.
const setupTimeout = 10 * time.Second

// open connects with connConfig(cc) and subscribes the connection to channel,
// both within setupTimeout (and ctx). The caller closes the connection with
// closeConn.
func open(ctx context.Context, cc *pgx.ConnConfig, channel string) (*pgx.Conn, error) {
	ctx, cancel := context.WithTimeout(ctx, setupTimeout)
	defer cancel()
	conn, err := pgx.ConnectConfig(ctx, connConfig(cc))
	if err != nil {
		return nil, err
	}
	if err := setListen(ctx, conn, channel, true); err != nil {
		closeConn(conn)
		return nil, err
	}
	return conn, nil
}

// setListen runs LISTEN channel on conn, or UNLISTEN channel when listen
// is false. On a session already in that state it changes nothing, so it
// is also the health check of an idle connection: a plain round trip,
// after which a listening session still shows LISTEN in
// pg_stat_activity.
func setListen(ctx context.Context, conn *pgx.Conn, channel string, listen bool) error {
	verb := "LISTEN "
	if !listen {
		verb = "UNLISTEN "
	}
	_, err := conn.Exec(ctx, verb+pgx.Identifier{channel}.Sanitize())
	return err
}

// closeTimeout bounds closeConn.
const closeTimeout = time.Second

// closeConn closes conn and waits, for at most closeTimeout, until pgconn has
// finished with it. A statement interrupted by its context (a health check
// cut short by the owner's Close, or one that timed out) or a failed read
// leaves the connection to pgconn's asynchronous close: a goroutine that
// sends a cancel request and Terminate, then reads until the server closes
// the connection, for up to 15 seconds. Waiting for it, as pgxpool does when
// it destroys a connection, keeps that goroutine from outliving the owner's
// Close. A server that answers ends it within a round trip or two; when it
// has not ended after half the bound, the network connection is closed under
// it, which ends its wait for an unresponsive server at once.
func closeConn(conn *pgx.Conn) {
	ctx, cancel := context.WithTimeout(context.Background(), closeTimeout)
	defer cancel()
	_ = conn.Close(ctx) // returns at once if pgconn already closed it
	pc := conn.PgConn()
	grace := time.NewTimer(closeTimeout / 2)
	defer grace.Stop()
	select {
	case <-pc.CleanupDone():
		return
	case <-grace.C:
	}
	_ = pc.Conn().Close()
	select {
	case <-pc.CleanupDone():
	case <-ctx.Done():
	}
}
