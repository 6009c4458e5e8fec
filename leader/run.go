package leader

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/pgfence/pgfence"
)

// Callbacks are what [Elector.Run] calls. OnStartedLeading is required.
type Callbacks struct {
	// OnStartedLeading runs the work of one term; its ctx ends with the term or
	// Run's ctx, and it must then return. Run resigns the term when it returns.
	OnStartedLeading func(ctx context.Context, t *Term)
	// OnStoppedLeading, when set, is called after each term ended and
	// OnStartedLeading returned; t.Err() says why it ended.
	OnStoppedLeading func(t *Term)
	// OnNewLeader, when set, gets each change [Elector.Observe] reports, one
	// call at a time, in order, from a goroutine of its own.
	OnNewLeader func(info TermInfo)
}

// errRunning is returned by a second concurrent Run.
var errRunning = errors.New("pgfence: leader: Run is already running on this Elector")

// Run campaigns, calls OnStartedLeading and waits for it, resigns the term,
// calls OnStoppedLeading and campaigns again (see [Term.Resign]), until ctx
// ends or the Elector is closed. It never campaigns while OnStartedLeading
// runs. (Another process may lead once a term ended: fencing, not Run,
// protects its work.)
//
// A failed campaign is logged and retried after [Config].RetryInterval.
// Run returns an error wrapping ctx's cause, or matching
// [pgfence.ErrClosed], once its callbacks have returned. One Run at a time
// per Elector.
func (e *Elector) Run(ctx context.Context, cb Callbacks) error {
	if cb.OnStartedLeading == nil {
		return errors.New("pgfence: leader: Run: Callbacks.OnStartedLeading is nil")
	}
	e.mu.Lock()
	switch {
	case e.closed:
		e.mu.Unlock()
		return pgfence.ErrClosed
	case e.running:
		e.mu.Unlock()
		return errRunning
	}
	e.running = true
	e.mu.Unlock()
	defer func() {
		e.mu.Lock()
		e.running = false
		e.mu.Unlock()
	}()
	if cb.OnNewLeader != nil {
		octx, stop := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() {
			defer close(done)
			for info := range e.Observe(octx) {
				cb.OnNewLeader(info)
			}
		}()
		defer func() { stop(); <-done }()
	}
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	failures := 0
	for {
		t, err := e.Campaign(ctx)
		switch {
		case err == nil:
			failures = 0
			e.lead(ctx, t, cb)
			if ctx.Err() != nil {
				return fmt.Errorf("pgfence: leader: run %q: %w", e.cfg.Election, context.Cause(ctx))
			}
			if err := e.checkOpen(); err != nil {
				return fmt.Errorf("pgfence: leader: run %q: %w", e.cfg.Election, err)
			}
			continue
		case ctx.Err() != nil:
			return fmt.Errorf("pgfence: leader: run %q: %w", e.cfg.Election, context.Cause(ctx))
		case errors.Is(err, pgfence.ErrClosed):
			return err
		}
		failures++
		wait := retryWait(e.cfg.RetryInterval, failures)
		e.cfg.Logger.WarnContext(ctx, "pgfence: leader: campaign failed; retrying", "election", e.cfg.Election,
			"error", err, "failures", failures, "retry_in", wait)
		timer.Reset(wait)
		select {
		case <-timer.C:
		case <-ctx.Done():
			return fmt.Errorf("pgfence: leader: run %q: %w", e.cfg.Election, context.Cause(ctx))
		case <-e.closeCtx.Done():
			return fmt.Errorf("pgfence: leader: run %q: %w", e.cfg.Election, pgfence.ErrClosed)
		}
	}
}

// lead runs one term's callbacks and resigns it.
func (e *Elector) lead(ctx context.Context, t *Term, cb Callbacks) {
	tctx, cancel := context.WithCancelCause(t.Context())
	stop := context.AfterFunc(ctx, func() { cancel(context.Cause(ctx)) })
	cb.OnStartedLeading(tctx, t)
	stop()
	cancel(nil)
	e.beginHandover(t)
	if err := t.resign(ctx); err != nil && !errors.Is(err, pgfence.ErrNotHeld) {
		e.cfg.Logger.WarnContext(ctx, "pgfence: leader: resigning failed; the term ends at its lease's expiry",
			"election", e.cfg.Election, "token", t.Token(), "error", err)
	}
	e.cfg.Logger.DebugContext(ctx, "pgfence: leader: term ended", "election", e.cfg.Election, "token", t.Token(), "cause", t.Err())
	if cb.OnStoppedLeading != nil {
		cb.OnStoppedLeading(t)
	}
}

// retryWait is the pause after the n-th consecutive failure: base doubled
// n-1 times, at most 30*base, with up to a fifth of it in random jitter.
func retryWait(base time.Duration, n int) time.Duration {
	d := base
	for i := 1; i < n && d < 30*base; i++ {
		d *= 2
	}
	d = min(d, 30*base)
	return d - d/10 + rand.N(d/5+1)
}
