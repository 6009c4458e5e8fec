package leasetable

import (
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/jackc/pgx/v5/pgconn"
)

// Group commit. Concurrent acquires (and concurrent releases) of one Locker
// are combined: while a statement is in flight, new requests queue, and the
// next statement carries all of them, so N requests cost one round trip and
// one WAL flush instead of N. A request that finds no statement in flight
// is sent at once: there is no timer, and a lone request is not delayed.

// maxInflight is how many statements of one kind (acquire or release) a
// Locker runs at once; requests arriving while that many are in flight wait
// for the next batch. One makes the largest batches and the fewest WAL
// flushes; the measurements behind the choice are in bench/results.
const maxInflight = 1

// maxBatch bounds the number of requests in one statement.
const maxBatch = 1000

// batcher runs requests in batches, at most maxInflight batches at a time,
// each in its own goroutine.
type batcher[R any] struct {
	// exec runs one statement for batch and answers every request in it;
	// on a statement error it answers none and returns the error.
	exec func(batch []R) error
	fail func(r R, err error) // answers r with err

	mu      sync.Mutex
	queue   []R
	running int
	closed  bool
	wg      sync.WaitGroup // running batch goroutines
}

// submit queues r, starting a batch goroutine when fewer than maxInflight
// are running. After close, r runs alone in the calling goroutine.
func (b *batcher[R]) submit(r R) {
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		b.run([]R{r})
		return
	}
	b.queue = append(b.queue, r)
	if b.running >= maxInflight {
		b.mu.Unlock()
		return
	}
	b.running++
	b.wg.Add(1)
	b.mu.Unlock()
	go b.drain()
}

// drain runs batches until the queue is empty.
func (b *batcher[R]) drain() {
	defer b.wg.Done()
	for {
		b.mu.Lock()
		n := min(len(b.queue), maxBatch)
		if n == 0 {
			b.running--
			b.mu.Unlock()
			return
		}
		batch := slices.Clone(b.queue[:n])
		b.queue = slices.Delete(b.queue, 0, n)
		b.mu.Unlock()
		b.run(batch)
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

// close waits for the running batches; later requests run alone in the
// caller's goroutine.
func (b *batcher[R]) close() {
	b.mu.Lock()
	b.closed = true
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
