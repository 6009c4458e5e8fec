// Package retry classifies database errors as transient (worth retrying,
// as during a failover) and spaces the retries with capped, jittered
// backoff. Both strategies use it, so they agree on what "the database is
// unavailable" means.
package retry

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgfence/pgfence"
)

// Transient reports whether err is one a later attempt may not get: the
// connection could not be made or was lost, the server is shutting down or
// starting, it is a read-only standby (a demoted primary), or the
// transaction lost a serialization race. Context errors are not transient
// here: the caller decides whether its own deadline or a per-attempt one
// ended.
func Transient(err error) bool {
	if err == nil || errors.Is(err, context.Canceled) {
		return false
	}
	// context.DeadlineExceeded is a net.Error (Timeout() is true), so it
	// would match below: a bare context deadline is the caller's to judge.
	// A deadline that pgconn reports as a timeout of an attempt (a read or
	// a dial cut short) is still transient.
	if errors.Is(err, context.DeadlineExceeded) && !pgconn.Timeout(err) && !isConnectError(err) {
		return false
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		if len(pgErr.Code) == 5 && pgErr.Code[:2] == "08" { // connection_exception
			return true
		}
		switch pgErr.Code {
		case "57P01", // admin_shutdown
			"57P02", // crash_shutdown
			"57P03", // cannot_connect_now (starting up, recovering)
			"25006", // read_only_sql_transaction (a standby, or a demoted primary)
			"40001", // serialization_failure
			"40P01", // deadlock_detected
			"53300": // too_many_connections
			return true
		}
		return false
	}
	var connectErr *pgconn.ConnectError
	if errors.As(err, &connectErr) {
		return true
	}
	if pgconn.SafeToRetry(err) || pgconn.Timeout(err) {
		return true
	}
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ECONNRESET) ||
		errors.Is(err, syscall.EPIPE) || errors.Is(err, net.ErrClosed) {
		return true
	}
	var netErr net.Error
	if errors.As(err, &netErr) {
		return true
	}
	var opErr *net.OpError
	return errors.As(err, &opErr)
}

func isConnectError(err error) bool {
	var connectErr *pgconn.ConnectError
	return errors.As(err, &connectErr)
}

// Unavailable wraps last, the error of the final attempt, so that the
// result matches both pgfence.ErrUnavailable and last.
func Unavailable(prefix string, last error) error {
	return fmt.Errorf("%s%w: %w", prefix, pgfence.ErrUnavailable, last)
}

// Backoff spaces retries: the n-th wait (from 1) is Min·2^(n-1), capped at
// Max, then jittered to between half and all of that (full jitter's lower
// half cut off, so retries neither hammer nor stall).
type Backoff struct {
	// Min is the first wait.
	Min time.Duration
	// Max caps every wait.
	Max time.Duration
}

// Default is the backoff both strategies use around a failover: from
// 25 ms, capped at 500 ms, so a new primary is found within about half a
// second of becoming writable.
var Default = Backoff{Min: 25 * time.Millisecond, Max: 500 * time.Millisecond}

// Wait returns the n-th wait (n from 1).
func (b Backoff) Wait(n int) time.Duration {
	d := b.Min
	for i := 1; i < n && d < b.Max; i++ {
		d *= 2
	}
	if d > b.Max {
		d = b.Max
	}
	if d <= 0 {
		return 0
	}
	half := d / 2
	return half + rand.N(d-half+1)
}

// Sleep waits for the n-th wait or until ctx ends, whichever is first; it
// returns ctx's error in the latter case.
func (b Backoff) Sleep(ctx context.Context, n int) error {
	t := time.NewTimer(b.Wait(n))
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}
