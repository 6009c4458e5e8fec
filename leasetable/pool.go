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

// conn takes a connection for the Locker's statement what, waiting at most
// wait and while ctx lasts. When the pool is exhausted, the error says so
// with its figures (logged as a Warn with warn set, for background work).
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
		// Not exhausted: the server or network did not answer.
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

// noAnswerError is a wait for a connection that ended without the pool
// being exhausted. It is transient (see retryable).
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

// discardStale closes c's connection when err says its server is read-only
// (a demoted primary), so that the pool dials the writable server; call it
// before c.Release.
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

// retryable reports whether err of a statement is transient.
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
