// Package hold is the behaviour both lock strategies share, written once so
// that they cannot drift apart: Do, the wait timeout, and the marks that let
// a Locker recognise a caller that already holds the lock it asks for.
package hold

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/pgfence/pgfence"
)

// markKey is the context key under which a held Lease of one Locker and
// name is recorded.
type markKey struct {
	locker any
	name   string
}

// Mark returns ctx recording that l, of locker, holds name.
func Mark(ctx context.Context, locker any, name string, l pgfence.Lease) context.Context {
	return context.WithValue(ctx, markKey{locker, name}, l)
}

// Held reports whether ctx records a Lease of locker for name that is
// still held: the caller asking for name already holds it.
func Held(ctx context.Context, locker any, name string) bool {
	l, ok := ctx.Value(markKey{locker, name}).(pgfence.Lease)
	return ok && l.Err() == nil
}

// WaitTimeout returns ctx bounded by d (when positive): when d elapses
// first, ctx's cause matches both pgfence.ErrNotAcquired and
// context.DeadlineExceeded.
func WaitTimeout(ctx context.Context, d time.Duration) (context.Context, context.CancelFunc) {
	if d <= 0 {
		return ctx, func() {}
	}
	return context.WithTimeoutCause(ctx, d, waitTimeoutError{d})
}

// waitTimeoutError is the cause of a wait that ran out of WaitTimeout.
type waitTimeoutError struct{ d time.Duration }

func (e waitTimeoutError) Error() string {
	return fmt.Sprintf("wait timeout of %v elapsed: %v", e.d, pgfence.ErrNotAcquired)
}

func (e waitTimeoutError) Is(target error) bool {
	return target == pgfence.ErrNotAcquired || target == context.DeadlineExceeded
}

// Do is Locker.Do for both strategies: it acquires with acquire, calls fn
// with a context derived from ctx that is also cancelled, with the Lease's
// cause, when the Lease ends, and releases it when fn returns. It returns
// the acquire error (fn not called), or fn's error joined with the loss
// when the lease was lost before fn returned, and with the release error.
// prefix starts the loss's message ("pgfence: leasetable").
func Do(ctx context.Context, locker any, name, prefix string,
	acquire func(context.Context) (pgfence.Lease, error),
	fn func(context.Context, pgfence.Lease) error,
) error {
	if fn == nil {
		return fmt.Errorf("%s: Do: fn is nil", prefix)
	}
	l, err := acquire(ctx)
	if err != nil {
		return err
	}
	fnCtx, cancel := context.WithCancelCause(Mark(ctx, locker, name, l))
	defer cancel(nil)
	stop := context.AfterFunc(l.Context(), func() { cancel(context.Cause(l.Context())) })
	fnErr := fn(fnCtx, l)
	stop()
	var lost error
	if cause := l.Err(); errors.Is(cause, pgfence.ErrLeaseLost) {
		lost = fmt.Errorf("%s: %q (token %d) was lost while fn ran: %w", prefix, name, l.Token(), cause)
	}
	relErr := l.Release(ctx)
	if lost != nil {
		relErr = nil // the release can only repeat the loss
	}
	return Join(fnErr, lost, relErr)
}

// Join joins the non-nil errors of errs as errors.Join does (nil when there
// is none, the error itself when there is one), with "; " between the
// messages instead of newlines, so that a log line stays one line.
func Join(errs ...error) error {
	var parts []error
	for _, err := range errs {
		if err != nil {
			parts = append(parts, err)
		}
	}
	switch len(parts) {
	case 0:
		return nil
	case 1:
		return parts[0]
	}
	msgs := make([]string, len(parts))
	for i, err := range parts {
		msgs[i] = err.Error()
	}
	return &joined{msg: strings.Join(msgs, "; "), errs: parts}
}

// joined is Join's error.
type joined struct {
	msg  string
	errs []error
}

func (e *joined) Error() string   { return e.msg }
func (e *joined) Unwrap() []error { return e.errs }

// TimedOut is the error of a wait that ran out of its WaitTimeout d by
// other means than a context (a lock_timeout): it matches
// pgfence.ErrNotAcquired and context.DeadlineExceeded.
func TimedOut(d time.Duration) error { return waitTimeoutError{d} }
