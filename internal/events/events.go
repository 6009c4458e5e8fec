// Package events delivers a Locker's events to its pgfence.Observer:
// synchronously for events of a caller's call, through one bounded queue
// and goroutine for events of the Locker's own goroutines (so a slow
// Observer never delays a renewal), and counts drops. A nil *Emitter (no
// Observer configured) does nothing and costs a nil check.
package events

import (
	"context"
	"sync"
	"sync/atomic"

	"github.com/pgfence/pgfence"
)

// QueueSize is how many background events wait for a slow Observer before
// further ones are dropped.
const QueueSize = 1024

type queued struct {
	ctx context.Context
	e   pgfence.Event
}

// Emitter delivers events to one Observer.
type Emitter struct {
	obs     pgfence.Observer
	ops     pgfence.OpObserver // nil unless obs implements it
	queue   chan queued
	dropped atomic.Uint64

	closeOnce sync.Once
	stop      chan struct{}
	done      chan struct{}
}

// New returns an Emitter for obs, with its delivery goroutine started, or
// nil when obs is nil. Close stops it.
func New(obs pgfence.Observer) *Emitter {
	if obs == nil {
		return nil
	}
	e := &Emitter{
		obs:   obs,
		queue: make(chan queued, QueueSize),
		stop:  make(chan struct{}),
		done:  make(chan struct{}),
	}
	e.ops, _ = obs.(pgfence.OpObserver)
	go e.deliver()
	return e
}

// Enabled reports whether events are observed; callers skip building an
// event when it is false.
func (e *Emitter) Enabled() bool { return e != nil }

// Sync delivers ev now, on the calling goroutine.
func (e *Emitter) Sync(ctx context.Context, ev pgfence.Event) {
	if e == nil {
		return
	}
	e.obs.Observe(ctx, ev)
}

// Async queues ev for the delivery goroutine, or drops and counts it when
// the queue is full or the Emitter is closed. ctx should carry values
// only (context.WithoutCancel).
func (e *Emitter) Async(ctx context.Context, ev pgfence.Event) {
	if e == nil {
		return
	}
	select {
	case <-e.stop:
		e.dropped.Add(1)
		return
	default:
	}
	select {
	case e.queue <- queued{ctx, ev}:
	default:
		e.dropped.Add(1)
	}
}

// Dropped returns the number of events dropped so far.
func (e *Emitter) Dropped() uint64 {
	if e == nil {
		return 0
	}
	return e.dropped.Load()
}

// StartOp calls the OpObserver's StartOp when there is one and returns the
// ctx to run the operation with.
func (e *Emitter) StartOp(ctx context.Context, op pgfence.Op) context.Context {
	if e == nil || e.ops == nil {
		return ctx
	}
	return e.ops.StartOp(ctx, op)
}

// EndOp calls the OpObserver's EndOp when there is one.
func (e *Emitter) EndOp(ctx context.Context, op pgfence.Op, err error) {
	if e == nil || e.ops == nil {
		return
	}
	e.ops.EndOp(ctx, op, err)
}

// Close delivers what is queued, then stops the delivery goroutine. Later
// Async events are dropped. It is idempotent.
func (e *Emitter) Close() {
	if e == nil {
		return
	}
	e.closeOnce.Do(func() { close(e.stop) })
	<-e.done
}

func (e *Emitter) deliver() {
	defer close(e.done)
	for {
		select {
		case q := <-e.queue:
			e.obs.Observe(q.ctx, q.e)
		case <-e.stop:
			for {
				select {
				case q := <-e.queue:
					e.obs.Observe(q.ctx, q.e)
				default:
					return
				}
			}
		}
	}
}

// Values returns a context with the values of values and the
// cancellation (and cause) of cancel: the ctx a Locker's goroutine runs a
// caller's statements with, so a renewal carries the acquiring ctx's
// values under the Locker's own lifetime. stop releases its resources; call
// it when the work ends.
func Values(values, cancel context.Context) (ctx context.Context, stop func()) {
	if values == nil {
		return cancel, func() {}
	}
	ctx, cancelCause := context.WithCancelCause(context.WithoutCancel(values))
	unhook := context.AfterFunc(cancel, func() { cancelCause(context.Cause(cancel)) })
	if d, ok := cancel.Deadline(); ok {
		var cancelDeadline context.CancelFunc
		ctx, cancelDeadline = context.WithDeadline(ctx, d)
		return ctx, func() { unhook(); cancelDeadline(); cancelCause(context.Canceled) }
	}
	return ctx, func() { unhook(); cancelCause(context.Canceled) }
}
