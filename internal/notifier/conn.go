package notifier

import (
	"context"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgconn/ctxwatch"
)

// connConfig returns a copy of cc for a LISTEN connection the library owns.
// It drops an OnNotification callback, which would take every notification
// from WaitForNotification. It always uses pgconn's deadline context
// watcher, with which a wait ended by its context (a health check, a
// statement to run) leaves the connection usable; a cancel-request watcher
// would open a connection at every interruption, and its late cancel could
// hit the next statement.
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

// open connects with connConfig(cc) and subscribes the connection to
// channels, both within setupTimeout (and ctx). The caller closes the
// connection with closeConn.
func open(ctx context.Context, cc *pgx.ConnConfig, channels []string) (*pgx.Conn, error) {
	ctx, cancel := context.WithTimeout(ctx, setupTimeout)
	defer cancel()
	conn, err := pgx.ConnectConfig(ctx, connConfig(cc))
	if err != nil {
		return nil, err
	}
	if err := setListen(ctx, conn, channels, true); err != nil {
		closeConn(conn)
		return nil, err
	}
	return conn, nil
}

// setListen runs LISTEN on conn for each of channels, in one round trip,
// or UNLISTEN when listen is false; unchanged state makes it the idle
// connection's health check.
func setListen(ctx context.Context, conn *pgx.Conn, channels []string, listen bool) error {
	verb := "LISTEN "
	if !listen {
		verb = "UNLISTEN "
	}
	stmts := make([]string, len(channels))
	for i, c := range channels {
		stmts[i] = verb + pgx.Identifier{c}.Sanitize()
	}
	_, err := conn.Exec(ctx, strings.Join(stmts, "; "))
	return err
}

// closeTimeout bounds closeConn.
const closeTimeout = time.Second

// closeConn closes conn and waits, at most closeTimeout, until pgconn's
// asynchronous close has finished, as pgxpool does, so that it cannot
// outlive the owner's Close; after half the bound it closes the network
// connection under it.
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
