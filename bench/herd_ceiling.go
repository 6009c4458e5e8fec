package main

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgfence/pgfence/bench/internal/stats"
)

// The raw NOTIFY chain: scenario 11's ceiling for the lease table's
// one-waiter hand-over. Two goroutines of the benchmark's own process hand
// one lease back and forth with the fewest statements the lease table's
// protocol allows and no pgfence code: an UPDATE that takes the free row
// with a durable token from a sequence (its commit waits for the WAL
// flush), an UPDATE that frees it and sends pg_notify in the same
// statement, naming the releaser (its commit does not wait for the
// flush), and a LISTEN connection per goroutine that wakes it. Plain SQL
// on a table of the benchmark's, no function, no owner check beyond the
// WHERE clause, no renewal. One more session listens on the channel, as the benchmark's
// counting connection does in the pgfence points, since each listening
// session makes a NOTIFY's commit signal one more backend. A hand-over is
// timed as in the pgfence points: from the holder starting its release to
// the waiter's acquire returning, the holder releasing only once its hold
// has passed and the waiter has queued again.
const (
	rawChainSetup = `CREATE TABLE IF NOT EXISTS bench_raw_chain (name text PRIMARY KEY, owner text NOT NULL, fence bigint NOT NULL, expires_at timestamptz NOT NULL);
CREATE SEQUENCE IF NOT EXISTS bench_raw_chain_seq;
INSERT INTO bench_raw_chain VALUES ('x', '', 0, '-infinity') ON CONFLICT (name) DO UPDATE SET owner = '', expires_at = '-infinity'`
	rawChainAcquire = `UPDATE bench_raw_chain SET owner = $1, fence = nextval('bench_raw_chain_seq'), expires_at = clock_timestamp() + interval '10 seconds'
WHERE name = 'x' AND expires_at <= clock_timestamp() RETURNING fence`
	rawChainRelease = `WITH r AS (UPDATE bench_raw_chain SET expires_at = now() WHERE name = 'x' AND owner = $1 AND fence = $2 RETURNING name)
SELECT pg_notify('bench_raw_chain', $1), set_config('synchronous_commit', 'off', true) FROM r`
	rawChainChannel = "bench_raw_chain"
)

// rawChainResult is the raw NOTIFY chain's measurement.
type rawChainResult struct {
	Latency  stats.Summary
	Release  stats.Summary // the release statement's round trip, in measured hand-overs
	Acquire  stats.Summary // the granting acquire statement's round trip, in measured hand-overs
	Attempts int64         // acquire statements over the measured hand-overs' run (refused ones included)
	Err      string
}

// rawNotifyChain runs the raw NOTIFY chain against url: warmup, then
// duration of measured hand-overs with hold-long holds.
func rawNotifyChain(ctx context.Context, url string, hold, warmup, duration time.Duration) rawChainResult {
	var res rawChainResult
	if err := withConn(ctx, url, func(c *pgx.Conn) error { _, err := c.Exec(ctx, rawChainSetup); return err }); err != nil {
		res.Err = err.Error()
		return res
	}
	extra, err := rawChainListener(ctx, url)
	if err != nil {
		res.Err = err.Error()
		return res
	}
	defer extra.Close(context.WithoutCancel(ctx))

	type player struct{ work, listen *pgx.Conn }
	var players [2]player
	for i := range players {
		w, err := pgx.Connect(ctx, url)
		if err != nil {
			res.Err = err.Error()
			return res
		}
		defer w.Close(context.WithoutCancel(ctx))
		l, err := rawChainListener(ctx, url)
		if err != nil {
			res.Err = err.Error()
			return res
		}
		defer l.Close(context.WithoutCancel(ctx))
		players[i] = player{w, l}
	}

	runCtx, stop := context.WithTimeout(ctx, warmup+duration)
	defer stop()
	measureFrom := time.Now().Add(warmup)
	var (
		releasedAt atomic.Int64 // unix ns the holder started its release; 0: not measured
		turns      = newChainTurns(runCtx)
		attempts   atomic.Int64
		mu         sync.Mutex
		samples    []time.Duration
		releases   []time.Duration
		acquires   []time.Duration
		firstErr   error
		wg         sync.WaitGroup
	)
	fail := func(err error) {
		mu.Lock()
		defer mu.Unlock()
		if firstErr == nil && runCtx.Err() == nil {
			firstErr = err
		}
		stop()
	}
	for i := range players {
		wg.Add(1)
		go func() {
			defer wg.Done()
			me, other := fmt.Sprintf("raw-%d", i), 1-i
			pl := players[i]
			for runCtx.Err() == nil {
				turns.queue(i)
				var fence int64
				var sent time.Time
				for {
					sent = time.Now()
					err := pl.work.QueryRow(runCtx, rawChainAcquire, me).Scan(&fence)
					if time.Now().After(measureFrom) {
						attempts.Add(1)
					}
					if err == nil {
						break
					}
					if !errors.Is(err, pgx.ErrNoRows) {
						fail(err)
						return
					}
					// Refused: wait for the other's release (or 20ms,
					// should its notification have come before the
					// LISTEN). The notifications of its own releases,
					// which name it, are skipped, as a Locker's own
					// releases wake none of its calls that are not
					// waiting.
					wctx, cancel := context.WithTimeout(runCtx, 20*time.Millisecond)
					for {
						var n *pgconn.Notification
						n, err = pl.listen.WaitForNotification(wctx)
						if err != nil || n.Payload != me {
							break
						}
					}
					cancel()
					if err != nil && runCtx.Err() == nil && !pgconn.Timeout(err) && !errors.Is(err, context.DeadlineExceeded) {
						fail(err)
						return
					}
					if runCtx.Err() != nil {
						return
					}
				}
				now := time.Now()
				n := turns.take(i)
				if at := releasedAt.Swap(0); at != 0 && now.After(measureFrom) {
					mu.Lock()
					samples = append(samples, now.Sub(time.Unix(0, at)))
					acquires = append(acquires, now.Sub(sent))
					mu.Unlock()
				}
				// Hold, then wait for the other to queue again.
				time.Sleep(hold)
				turns.waitQueued(other)
				start := time.Now()
				releasedAt.Store(start.UnixNano())
				if _, err := pl.work.Exec(context.WithoutCancel(runCtx), rawChainRelease, me, fence); err != nil {
					fail(err)
					return
				}
				if start.After(measureFrom) {
					mu.Lock()
					releases = append(releases, time.Since(start))
					mu.Unlock()
				}
				// Queue again once the other took the lease.
				turns.waitTaken(n)
			}
		}()
	}
	wg.Wait()
	if firstErr != nil {
		res.Err = firstErr.Error()
	}
	res.Latency = stats.Summarize(samples)
	res.Release, res.Acquire = stats.Summarize(releases), stats.Summarize(acquires)
	res.Attempts = attempts.Load()
	return res
}

// chainTurns is what the raw chain's two players tell each other: who
// waits in its acquire, and how many acquisitions there were. Waits sleep
// on a condition variable (no polling, which would take CPU from the chain
// it times) and end when ctx does.
type chainTurns struct {
	ctx    context.Context
	mu     sync.Mutex
	cond   *sync.Cond
	takes  int64
	queued [2]bool
}

func newChainTurns(ctx context.Context) *chainTurns {
	t := &chainTurns{ctx: ctx}
	t.cond = sync.NewCond(&t.mu)
	context.AfterFunc(ctx, func() {
		t.mu.Lock()
		defer t.mu.Unlock()
		t.cond.Broadcast()
	})
	return t
}

// queue records that player i waits in its acquire.
func (t *chainTurns) queue(i int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.queued[i] = true
	t.cond.Broadcast()
}

// take records player i's acquisition and returns the acquisitions so far.
func (t *chainTurns) take(i int) int64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.queued[i] = false
	t.takes++
	t.cond.Broadcast()
	return t.takes
}

// waitQueued waits until player i waits in its acquire.
func (t *chainTurns) waitQueued(i int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for !t.queued[i] && t.ctx.Err() == nil {
		t.cond.Wait()
	}
}

// waitTaken waits until there were more than n acquisitions.
func (t *chainTurns) waitTaken(n int64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for t.takes == n && t.ctx.Err() == nil {
		t.cond.Wait()
	}
}

// rawChainListener connects to url and listens on the raw chain's channel.
func rawChainListener(ctx context.Context, url string) (*pgx.Conn, error) {
	c, err := pgx.Connect(ctx, url)
	if err != nil {
		return nil, err
	}
	if _, err := c.Exec(ctx, "LISTEN "+rawChainChannel); err != nil {
		c.Close(context.WithoutCancel(ctx))
		return nil, err
	}
	return c, nil
}

// ok reports whether the chain was measured.
func (r *rawChainResult) ok() bool { return r != nil && r.Err == "" && r.Latency.N > 0 }

// perHandover is the acquire statements per measured hand-over.
func (r *rawChainResult) perHandover() float64 {
	return float64(r.Attempts) / float64(max(r.Latency.N, 1))
}
