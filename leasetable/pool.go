package leasetable

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence/internal/retry"
)

// conn takes a connection from the pool for the Locker's statement what,
// waiting at most wait and while ctx lasts. When the wait ends with every
// connection of the pool in use, the error (matching the context's error)
// says so, naming what, how long it waited and the pool's MaxConns and
// acquired connections; for the Locker's own work (renewal, release: warn
// set) it is also logged as a Warn, since no caller may be there to see it.
func (k *Locker) conn(ctx context.Context, what string, wait time.Duration, warn bool) (*pgxpool.Conn, error) {
	start := time.Now()
	actx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	c, err := k.pool.Acquire(actx)
	if err == nil {
		return c, nil
	}
	st := k.pool.Stat()
	if actx.Err() == nil || k.closeCtx.Err() != nil {
		return nil, err
	}
	if st.AcquiredConns() < st.MaxConns() {
		if ctx.Err() != nil {
			return nil, err // the caller left
		}
		// Not exhausted, yet no connection in time: dialing, or pgxpool's
		// ping of an idle connection, got no answer (a dead server or
		// network), which a later attempt may not meet.
		return nil, &noAnswerError{what: what, wait: time.Since(start).Round(time.Millisecond), err: err}
	}
	err = fmt.Errorf("%s could not get a connection from the pool within %v (pool exhausted: MaxConns %d, acquired %d): %w",
		what, time.Since(start).Round(time.Millisecond), st.MaxConns(), st.AcquiredConns(), actx.Err())
	if warn {
		k.cfg.Logger.WarnContext(ctx, "pgfence: leasetable: "+what+" could not get a connection from the pool within QueryTimeout",
			"error", err, "max_conns", st.MaxConns(), "acquired_conns", st.AcquiredConns())
	}
	return nil, err
}

// noAnswerError is the error of a wait for a connection that ended
// without the pool being exhausted: the server or the network did not
// answer. It is transient (see Locker.retryable).
type noAnswerError struct {
	what string
	wait time.Duration
	err  error
}

func (e *noAnswerError) Error() string {
	return fmt.Sprintf("%s got no connection within %v although the pool is not exhausted (the server or the network does not answer): %v",
		e.what, e.wait, e.err)
}

func (e *noAnswerError) Unwrap() error { return e.err }

// warnSmallPool logs a Warn at New when the pool has a single connection.
func (k *Locker) warnSmallPool(ctx context.Context) {
	if n := k.pool.Config().MaxConns; n < 2 {
		k.cfg.Logger.WarnContext(ctx, "pgfence: leasetable: the pool has MaxConns 1; the Locker needs at least 2: "+
			"while the caller holds the only connection (a transaction, a long query), every acquire, renewal and release "+
			"waits for it up to QueryTimeout, and leases are lost when renewals cannot run",
			"max_conns", n, "query_timeout", k.cfg.QueryTimeout)
	}
}

// discardStale closes c's connection when err says its server cannot take
// writes (read_only_sql_transaction: a standby, such as a primary demoted
// in a failover), so that the pool replaces it with a connection to the
// writable server instead of handing it out again; call it before
// c.Release. pgx closes the connections that failed at the network level
// itself.
func (k *Locker) discardStale(c *pgxpool.Conn, err error) {
	if k.hooks != nil && k.hooks.keepStale {
		return
	}
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "25006" {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_ = c.Conn().Close(ctx)
}

// retryable reports whether err of one of the Locker's statements is
// retried: a transient database error (retry.Transient).
func (k *Locker) retryable(err error) bool {
	var noAnswer *noAnswerError
	return (k.hooks == nil || !k.hooks.noRetry) && (retry.Transient(err) || errors.As(err, &noAnswer))
}

// sleep waits d or until ctx ends, returning ctx's cause then.
func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}
