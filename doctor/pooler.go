package doctor

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// pidSQL reads the server process serving the statement. No lock.
const pidSQL = `SELECT pg_catalog.pg_backend_pid()`

// poolerWait is how long the pooler check lets the second connection's
// first statement wait while the first holds a transaction open: with a
// one-connection pool it waits for that transaction.
const poolerWait = 2 * time.Second

// pooler looks for a pooler between this host and the server. A pooler
// answers the startup with a process id of its own, which
// pg_backend_pid() contradicts. Transaction pooling shows as a connection
// whose statements run on different server processes: while a first
// connection (a) holds a transaction open, a second (b) runs a statement,
// then a commits and b runs another; PgBouncer then gives b the server
// process a freed (it reuses the most recently freed), or gave b a's own
// after its commit when its pool had one server connection. A direct
// connection, or a session-pooled one, keeps its process.
func (d *doctor) pooler() {
	var pid uint32
	if err := d.conn.QueryRow(d.ctx, pidSQL).Scan(&pid); err != nil {
		d.cannot("pooler", err)
		return
	}
	viaPooler := pid != d.conn.PgConn().PID()
	transaction, err := d.transactionPooling()
	if err != nil {
		d.cannot("pooler", err)
		return
	}
	switch {
	case transaction:
		d.add("pooler", Warn, "a transaction pooler (PgBouncer pool_mode=transaction or statement, or alike) is in the path: "+
			"session advisory locks and LISTEN do not survive it; advisory.Locker must not run through it, and leasetable's "+
			"LISTEN falls back to waiting for expiries",
			"connect advisory.Locker, and leasetable's ListenConnConfig, to the server directly or through session pooling")
	case viaPooler:
		d.add("pooler", OK, fmt.Sprintf("a session pooler is in the path (startup process id %d, server process %d): "+
			"each connection keeps its server session", d.conn.PgConn().PID(), pid), "")
	default:
		d.add("pooler", OK, "no pooler detected: the connection reaches the server directly", "")
	}
}

// transactionPooling runs the two-connection check described at pooler.
func (d *doctor) transactionPooling() (bool, error) {
	ctx, cancel := context.WithTimeout(d.ctx, 4*poolerWait)
	defer cancel()
	tx, err := d.conn.Begin(ctx)
	if err != nil {
		return false, err
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	var pidA uint32
	if err := tx.QueryRow(ctx, pidSQL).Scan(&pidA); err != nil {
		return false, err
	}
	b, err := pgx.ConnectConfig(ctx, d.cc.Copy())
	if err != nil {
		return false, fmt.Errorf("open a second connection: %w", err)
	}
	defer closeConn(b)
	type answer struct {
		pid uint32
		err error
	}
	first := make(chan answer, 1)
	go func() {
		var a answer
		a.err = b.QueryRow(ctx, pidSQL).Scan(&a.pid)
		first <- a
	}()
	var b1 answer
	waited := false
	select {
	case b1 = <-first:
	case <-time.After(poolerWait):
		waited = true
	}
	if err := tx.Commit(ctx); err != nil {
		return false, err
	}
	if waited {
		select {
		case b1 = <-first:
		case <-time.After(poolerWait):
			// Still waiting after the commit: a session pooler whose one
			// server connection stays with the first client.
			cancel()
			<-first
			return false, nil
		}
	}
	if b1.err != nil {
		return false, b1.err
	}
	var b2 uint32
	if err := b.QueryRow(ctx, pidSQL).Scan(&b2); err != nil {
		return false, err
	}
	return b1.pid == pidA || b2 != b1.pid, nil
}
