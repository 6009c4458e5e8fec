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

// maxInflight is how many statements of one kind (acquire or release) a
// Locker runs at once; requests arriving while that many are in flight wait
// for the next batch. One makes the largest batches and the fewest WAL
// flushes; the measurements behind the choice are in bench/results.
const maxInflight = 1

// maxBatch bounds the number of requests in one statement.
const maxBatch = 1000

// drainLinger is how long a batch goroutine whose queue ran empty waits
// for the next request before it exits. A Locker that acquires or releases
// every few milliseconds keeps its goroutine, whose stack has grown to what
// a statement needs, instead of starting a new one for each statement and
// growing its stack again (copying it several times): that was a tenth of
// the client CPU of a hand-over. An idle Locker keeps no goroutine.
const drainLinger = time.Second

// batcher runs requests in batches, at most maxInflight batches at a time:
// in batch goroutines, which linger for drainLinger once the queue is
// empty, or, through runNow, in the caller's goroutine.
type batcher[R any] struct {
	// exec runs one statement for batch and answers every request in it;
	// on a statement error it answers none and returns the error.
	exec func(batch []R) error
	fail func(r R, err error) // answers r with err

	mu         sync.Mutex
	queue      []R
	inflight   int // batches running, in batch goroutines or callers
	goroutines int // batch goroutines, lingering ones included
	idle       int // lingering batch goroutines not yet woken
	wake       chan struct{}
	closed     bool
	wg         sync.WaitGroup // batch goroutines
}

// submit queues r and sees that a batch goroutine will take it. After
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
// batch of this kind is in flight and no request waits; otherwise it does
// nothing and reports false (the caller submits r). A lone request is then
// sent without handing it to a batch goroutine and its answer back, two
// goroutine switches on the way of every uncontended statement. Requests
// that arrive meanwhile queue, and go out together once it is answered, as
// behind a batch goroutine's statement. Only for requests whose callers
// wait for the answer in any case (a release, which runs to its answer or
// its own timeout), since the caller cannot leave before it.
func (b *batcher[R]) runNow(r R) bool {
	b.mu.Lock()
	if b.closed || b.inflight >= maxInflight || len(b.queue) > 0 {
		b.mu.Unlock()
		return false
	}
	b.inflight++
	b.mu.Unlock()
	b.run([]R{r})
	b.mu.Lock()
	b.inflight--
	if b.closed {
		// The batch goroutines may have exited with requests queued
		// behind this one: run them here.
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

// kickLocked sees that a batch goroutine takes the queue when a batch may
// start: it wakes a lingering one, or starts one. A goroutine that runs a
// batch now takes the queue when it is done.
func (b *batcher[R]) kickLocked() {
	if len(b.queue) == 0 || b.inflight >= maxInflight {
		return
	}
	if b.idle > 0 {
		b.idle--
		b.wake <- struct{}{} // buffered for every goroutine: never blocks
		return
	}
	if b.goroutines >= maxInflight {
		return // all of them between batches: they take it
	}
	if b.wake == nil {
		b.wake = make(chan struct{}, maxInflight)
	}
	b.goroutines++
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

// drain runs batches while there are requests and a batch may start, then
// lingers for drainLinger (or until close or a kick) and exits unless
// kicked.
func (b *batcher[R]) drain() {
	defer b.wg.Done()
	var linger *time.Timer
	for {
		b.mu.Lock()
		if len(b.queue) > 0 && b.inflight < maxInflight {
			batch := b.takeLocked()
			b.inflight++
			b.mu.Unlock()
			b.run(batch)
			b.mu.Lock()
			b.inflight--
			b.mu.Unlock()
			continue
		}
		if b.closed {
			b.goroutines--
			b.mu.Unlock()
			return
		}
		b.idle++
		b.mu.Unlock()
		if linger == nil {
			linger = time.NewTimer(drainLinger)
		} else {
			linger.Reset(drainLinger)
		}
		select {
		case <-b.wake:
			continue // kicked (or closed): idle was taken off for it
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
		b.idle--
		b.goroutines--
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

// close waits for the batch goroutines, ending the lingering ones; later
// requests run alone in the caller's goroutine (and requests queued behind
// a runNow still running, in its caller's).
func (b *batcher[R]) close() {
	b.mu.Lock()
	b.closed = true
	for ; b.idle > 0; b.idle-- {
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
