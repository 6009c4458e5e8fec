package leasetable

import (
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// maxBatch bounds the number of requests in one statement.
const maxBatch = 1000

// drainLinger is how long the drain goroutine waits for a request once its
// queue ran empty before it exits.
const drainLinger = time.Second

// batcher combines concurrent requests of one kind (acquires, or releases)
// into one statement: while a statement is in flight, new requests queue,
// and the next statement carries all of them. One statement runs at a
// time, in the drain goroutine or, through runNow, in the caller's.
type batcher[R any] struct {
	// exec runs one statement for batch and answers every request in it;
	// on a statement error it answers none and returns the error.
	exec func(batch []R) error
	fail func(r R, err error) // answers r with err

	mu       sync.Mutex
	queue    []R
	busy     bool          // a statement runs, in the drain goroutine or a caller
	draining bool          // the drain goroutine exists, lingering or not
	idle     bool          // the drain goroutine lingers, not yet woken
	wake     chan struct{} // buffered(1): wakes the lingering drain goroutine
	closed   bool
	wg       sync.WaitGroup // the drain goroutine
}

// submit queues r and sees that the drain goroutine will take it. After
// close, r runs alone in the calling goroutine.
func (b *batcher[R]) submit(r R) {
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		b.run([]R{r})
		return
	}
	b.queue = append(b.queue, r)
	b.kickLocked()
	b.mu.Unlock()
}

// runNow runs r alone in the calling goroutine, and reports true, when no
// statement is in flight and no request waits; otherwise it reports false
// and the caller submits r. Requests that arrive meanwhile queue and go
// out together once it is answered. Only for requests whose callers wait
// for the answer in any case (a release).
func (b *batcher[R]) runNow(r R) bool {
	b.mu.Lock()
	if b.closed || b.busy || len(b.queue) > 0 {
		b.mu.Unlock()
		return false
	}
	b.busy = true
	b.mu.Unlock()
	b.run([]R{r})
	b.mu.Lock()
	b.busy = false
	if b.closed {
		// The drain goroutine may have exited with requests queued behind
		// this one: run them here.
		for len(b.queue) > 0 {
			batch := b.takeLocked()
			b.mu.Unlock()
			b.run(batch)
			b.mu.Lock()
		}
	} else {
		b.kickLocked()
	}
	b.mu.Unlock()
	return true
}

// kickLocked sees that the drain goroutine takes the queue when no
// statement is in flight: it wakes the lingering goroutine, or starts one.
// A goroutine that runs a statement now takes the queue when it is done.
func (b *batcher[R]) kickLocked() {
	if len(b.queue) == 0 || b.busy {
		return
	}
	if b.idle {
		b.idle = false
		b.wake <- struct{}{} // buffered(1): never blocks
		return
	}
	if b.draining {
		return // between statements: it takes the queue
	}
	if b.wake == nil {
		b.wake = make(chan struct{}, 1)
	}
	b.draining = true
	b.wg.Add(1)
	go b.drain()
}

// takeLocked removes the next batch from the queue.
func (b *batcher[R]) takeLocked() []R {
	n := min(len(b.queue), maxBatch)
	batch := slices.Clone(b.queue[:n])
	b.queue = slices.Delete(b.queue, 0, n)
	return batch
}

// drain runs batches while requests wait and no statement is in flight,
// then lingers for drainLinger (or until close or a kick) and exits unless
// kicked.
func (b *batcher[R]) drain() {
	defer b.wg.Done()
	var linger *time.Timer
	for {
		b.mu.Lock()
		if len(b.queue) > 0 && !b.busy {
			batch := b.takeLocked()
			b.busy = true
			b.mu.Unlock()
			b.run(batch)
			b.mu.Lock()
			b.busy = false
			b.mu.Unlock()
			continue
		}
		if b.closed {
			b.draining = false
			b.mu.Unlock()
			return
		}
		b.idle = true
		b.mu.Unlock()
		if linger == nil {
			linger = time.NewTimer(drainLinger)
		} else {
			linger.Reset(drainLinger)
		}
		select {
		case <-b.wake:
			continue // kicked (or closed): idle was cleared for it
		case <-linger.C:
		}
		b.mu.Lock()
		select {
		case <-b.wake:
			// Kicked as the linger ended: the kick counted on it.
			b.mu.Unlock()
			continue
		default:
		}
		b.idle = false
		b.draining = false
		b.mu.Unlock()
		return
	}
}

// run runs one batch and answers every request in it. When the statement
// fails with a deadlock, the requests are retried one by one, which cannot
// deadlock: acquire batches insert in name order, but an UPDATE joined to
// its input (a release or renewal batch) locks rows in whatever order its
// plan visits them.
func (b *batcher[R]) run(batch []R) {
	err := b.exec(batch)
	if err != nil && isDeadlock(err) && len(batch) > 1 {
		for _, r := range batch {
			if err := b.exec([]R{r}); err != nil {
				b.fail(r, err)
			}
		}
		return
	}
	if err != nil {
		for _, r := range batch {
			b.fail(r, err)
		}
	}
}

// close waits for the drain goroutine, ending it if it lingers; later
// requests run alone in the caller's goroutine (and requests queued behind
// a runNow still running, in its caller's).
func (b *batcher[R]) close() {
	b.mu.Lock()
	b.closed = true
	if b.idle {
		b.idle = false
		b.wake <- struct{}{}
	}
	b.mu.Unlock()
	b.wg.Wait()
}

// batchContext returns a context for a statement run on behalf of the
// requests whose contexts are ctxs: it carries the values of values (the
// first one's, or the ctx of the batch's operation under it, so a pgx
// tracer sees the statement as part of that caller's work), and it is
// cancelled when every one of ctxs has ended (nobody waits for the answer
// any more), or when stop ends.
func batchContext(stop, values context.Context, ctxs []context.Context) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(context.WithoutCancel(values))
	stopStop := context.AfterFunc(stop, cancel)
	remaining := atomic.Int64{}
	remaining.Store(int64(len(ctxs)))
	stops := make([]func() bool, 0, len(ctxs))
	for _, c := range ctxs {
		stops = append(stops, context.AfterFunc(c, func() {
			if remaining.Add(-1) == 0 {
				cancel()
			}
		}))
	}
	return ctx, func() {
		stopStop()
		for _, stop := range stops {
			stop()
		}
		cancel()
	}
}

func isDeadlock(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "40P01"
}
