package leasetable

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/pgfence/pgfence"
	"github.com/pgfence/pgfence/internal/hold"
	"github.com/pgfence/pgfence/internal/retry"
	"github.com/pgfence/pgfence/internal/waitline"
)

// waitLoop is what the waiting loops of Acquire, AcquirePermit and
// AcquireSet share: each attempt's outcome (retried, or final), the turn in
// a line, and the wait for a wake-up, the retry time, ctx or Close.
type waitLoop struct {
	k           *Locker
	ctx         context.Context // the call's, bounded by its WaitTimeout
	cancel      context.CancelFunc
	what        string // the call, for errors: `acquire "name"`
	lease       string // what the logs name
	failures    int    // consecutive failed attempts
	unavailable error  // the last attempt's transient error
	timer       *time.Timer
	key         string         // the Locker's line the call joined (headOf)
	ln          *waitline.Line // its place there, nil before it joined
	head        bool           // it is the line's head
}

// newWaitLoop starts a waiting call's loop: the call counts in
// Stats().Waiting, and its context (loop.ctx) ends at opts.WaitTimeout.
// stop ends it, leaving the call's line if it joined one.
func (k *Locker) newWaitLoop(ctx context.Context, opts *AcquireOpts, what, lease string) *waitLoop {
	k.waiting.Add(1)
	w := &waitLoop{k: k, what: what, lease: lease, timer: time.NewTimer(time.Hour)}
	if opts != nil {
		ctx, w.cancel = hold.WaitTimeout(ctx, opts.WaitTimeout)
	}
	w.ctx = ctx
	return w
}

func (w *waitLoop) stop() {
	if w.ln != nil {
		w.k.lines.Leave(w.key, w.ln, w.head)
	}
	w.timer.Stop()
	if w.cancel != nil {
		w.cancel()
	}
	w.k.waiting.Add(-1)
}

// headOf makes the call the head of the Locker's line for key, joining it
// at the end if it has not yet: only the head tries, the others wait their
// turn. It reports whether the call had to wait (it then tries at once:
// the call before got the lease, or left), or the error when ctx ended or
// the Locker closed first.
func (w *waitLoop) headOf(key string) (waited bool, err error) {
	if w.ln == nil {
		w.key, w.ln = key, w.k.lines.Join(key)
	}
	if w.head {
		return false, nil
	}
	if waited, err = w.turn(w.ln); err != nil {
		return false, err
	}
	w.head = true
	return waited, nil
}

// ended is the error of a wait whose ctx ended, with the last transient
// error when there was one.
func (w *waitLoop) ended() error {
	if w.unavailable != nil {
		return fmt.Errorf("pgfence: leasetable: %s: %w; last attempt: %w", w.what, context.Cause(w.ctx), retry.Unavailable("", w.unavailable))
	}
	return fmt.Errorf("pgfence: leasetable: %s: %w", w.what, context.Cause(w.ctx))
}

func (w *waitLoop) closed() error {
	return fmt.Errorf("pgfence: leasetable: %s: %w", w.what, pgfence.ErrClosed)
}

// next judges an attempt's error: after none it keeps retryIn; after a late
// grant or a transient error it counts a failure and backs off; after
// anything else, or once ctx ended, it returns the error to end with
// (final(err), or ended()).
func (w *waitLoop) next(err error, retryIn time.Duration, final func(error) error) (time.Duration, error) {
	switch {
	case err == nil:
		w.failures, w.unavailable = 0, nil
		return retryIn, nil
	case w.ctx.Err() != nil:
		return 0, w.ended()
	case errors.Is(err, errLateGrant):
		w.failures, w.unavailable = w.failures+1, nil
		return w.k.backoff.Wait(w.failures), nil
	case w.k.retryable(err):
		w.failures, w.unavailable = w.failures+1, err
		d := w.k.backoff.Wait(w.failures)
		w.k.suspectListen()
		w.k.cfg.Logger.DebugContext(w.ctx, "pgfence: leasetable: acquire failed; retrying", "lease", w.lease, "error", err, "retry_in", d)
		return d, nil
	}
	return 0, final(err)
}

// turn waits until the call is the head of ln. It reports whether it had
// to wait, or the error when ctx ended or the Locker closed first.
func (w *waitLoop) turn(ln *waitline.Line) (waited bool, err error) {
	waited, stopped := ln.Head(w.ctx, w.k.closeCtx.Done())
	switch {
	case stopped && w.ctx.Err() != nil:
		return false, w.ended()
	case stopped:
		return false, w.closed()
	}
	return waited, nil
}

// sleep waits for wake, retryIn, ctx or Close; it returns an error for the
// last two.
func (w *waitLoop) sleep(wake <-chan struct{}, retryIn time.Duration) error {
	_, _, err := w.sleepOrGrant(wake, nil, retryIn)
	return err
}

// sleepOrGrant is sleep, also woken by a grant to the call's claim
// (handover.go), which it returns with handed true; grants is nil without
// a claim.
func (w *waitLoop) sleepOrGrant(wake <-chan struct{}, grants <-chan handedGrant, retryIn time.Duration) (g handedGrant, handed bool, err error) {
	w.timer.Reset(retryIn)
	select {
	case g = <-grants:
		return g, true, nil
	case <-wake:
	case <-w.timer.C:
	case <-w.ctx.Done():
		return g, false, w.ended()
	case <-w.k.closeCtx.Done():
		return g, false, w.closed()
	}
	return g, false, nil
}

// retrying runs attempt until it answers (nil) or fails for good: a
// transient error is retried with backoff while [Config].QueryTimeout
// lasts, then final(retry.Unavailable) ends it; any other error, or ctx
// ending, ends it with final(err). what names the call in errors, lease in
// logs. It is the try-once calls' loop (TryAcquire, TryAcquirePermit,
// TryAcquireSet).
func (k *Locker) retrying(ctx context.Context, what, lease string, attempt func() error, final func(error) error) error {
	start := time.Now()
	for failures := 1; ; failures++ {
		err := attempt()
		switch {
		case err == nil:
			return nil
		case ctx.Err() != nil || !k.retryable(err):
			return final(err)
		}
		wait := k.backoff.Wait(failures)
		if time.Since(start)+wait >= k.cfg.QueryTimeout {
			return final(retry.Unavailable("", err))
		}
		k.suspectListen()
		k.cfg.Logger.DebugContext(ctx, "pgfence: leasetable: acquire failed; retrying", "lease", lease, "error", err, "retry_in", wait)
		if serr := sleep(ctx, wait); serr != nil {
			return fmt.Errorf("pgfence: leasetable: %s: %w; last attempt: %w", what, serr, retry.Unavailable("", err))
		}
	}
}

// observed runs an acquire (prep validates it, run takes the leases) as one
// operation op for the Observer, and counts and reports its outcome for
// each of names: Acquired per lease taken, NotAcquired per name otherwise.
func (k *Locker) observed(ctx context.Context, op pgfence.Op, names []string, prep func() (leaseTiming, error), run func(context.Context, leaseTiming, *int) ([]*Lease, error)) ([]*Lease, error) {
	start := time.Now()
	t, err := prep()
	if err != nil && !errors.Is(err, pgfence.ErrNotAcquired) && !errors.Is(err, pgfence.ErrClosed) {
		return nil, err // bad input
	}
	ctx = k.ev.StartOp(ctx, op)
	attempts := 0
	var ls []*Lease
	if err == nil {
		ls, err = run(ctx, t, &attempts)
	}
	if err != nil {
		k.nNotAcquired.Add(uint64(len(names)))
		if k.ev.Enabled() {
			for _, n := range names {
				k.ev.Sync(ctx, pgfence.NotAcquired{Lock: pgfence.Lock{Kind: pgfence.StrategyLeaseTable, Name: n},
					Wait: time.Since(start), Attempts: attempts, Err: err})
			}
		}
		k.ev.EndOp(ctx, op, err)
		return nil, err
	}
	k.nAcquired.Add(uint64(len(ls)))
	if k.ev.Enabled() {
		for _, l := range ls {
			k.ev.Sync(ctx, pgfence.Acquired{Lock: l.lock(), Wait: time.Since(start), Attempts: attempts})
		}
	}
	k.ev.EndOp(ctx, op, nil)
	return ls, nil
}

// one adapts a single-lease attempt to observed's run.
func one(l *Lease, err error) ([]*Lease, error) {
	if err != nil {
		return nil, err
	}
	return []*Lease{l}, nil
}
