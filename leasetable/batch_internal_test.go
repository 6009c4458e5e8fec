package leasetable

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence"
	"github.com/pgfence/pgfence/internal/pgtest"
)

// gate holds every acquire statement at its start until opened, and
// reports each one's names.
type gate struct {
	started chan []string
	open    chan struct{}
}

func (g *gate) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	if strings.Contains(d.SQL, "pgfence_acquire(") {
		names, _ := d.Args[0].([]string)
		g.started <- names
		<-g.open
	}
	return ctx
}

func (g *gate) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// waitQueued waits until n acquire requests are queued behind the
// statements in flight. The queue is internal state with no signal of its
// own, so it is polled.
func waitQueued(t *testing.T, k *Locker, n int) {
	t.Helper()
	for i := 0; ; i++ {
		k.acquires.mu.Lock()
		queued := len(k.acquires.queue)
		k.acquires.mu.Unlock()
		if queued == n {
			return
		}
		require.Less(t, i, 30000, "requests were not queued")
		time.Sleep(time.Millisecond)
	}
}

// TestConcurrentAcquiresShareOneStatement holds one statement in flight,
// queues acquires of one name from many goroutines together with acquires
// of distinct names, and checks that they go out as one statement in which
// exactly one of the duplicates wins.
func TestConcurrentAcquiresShareOneStatement(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.NewDB(t)
	g := &gate{started: make(chan []string, 10), open: make(chan struct{})}
	pool := db.NewPool(t, func(c *pgxpool.Config) { c.ConnConfig.Tracer = g })
	k, err := New(ctx, pool, nil)
	require.NoError(t, err)
	t.Cleanup(k.Close)

	type result struct {
		name string
		l    pgfence.Lease
		err  error
	}
	results := make(chan result, 100)
	try := func(name string) {
		l, err := k.TryAcquire(ctx, name, nil)
		results <- result{name, l, err}
	}
	go try("in-flight")
	require.Len(t, <-g.started, 1)
	const dups, distinct = 10, 5
	for range dups {
		go try("dup")
	}
	for i := range distinct {
		go try(fmt.Sprintf("distinct-%d", i))
	}
	waitQueued(t, k, dups+distinct)
	close(g.open)
	names := <-g.started
	require.Len(t, names, 1+distinct, "one statement, one entry per distinct name")

	won := map[string]int{}
	tokens := map[int64]bool{}
	for range 1 + dups + distinct {
		r := <-results
		if errors.Is(r.err, pgfence.ErrNotAcquired) {
			continue
		}
		require.NoError(t, r.err)
		won[r.name]++
		require.False(t, tokens[r.l.Token()], "tokens are unique")
		tokens[r.l.Token()] = true
		require.NoError(t, r.l.Release(ctx))
	}
	require.Equal(t, 1, won["dup"], "exactly one duplicate acquires")
	for i := range distinct {
		require.Equal(t, 1, won[fmt.Sprintf("distinct-%d", i)])
	}
}

// TestAbandonedAcquireIsGivenBack checks that a lease taken by a batch for a
// caller that stopped waiting is released at once, while the batch still
// serves the other callers.
func TestAbandonedAcquireIsGivenBack(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.NewDB(t)
	g := &gate{started: make(chan []string, 10), open: make(chan struct{})}
	pool := db.NewPool(t, func(c *pgxpool.Config) { c.ConnConfig.Tracer = g })
	k, err := New(ctx, pool, nil)
	require.NoError(t, err)

	inFlight := make(chan error, 1)
	go func() {
		l, err := k.TryAcquire(ctx, "in-flight", nil)
		if err == nil {
			err = l.Release(ctx)
		}
		inFlight <- err
	}()
	<-g.started
	abandonCtx, abandon := context.WithCancel(ctx)
	abandoned := make(chan error, 1)
	go func() {
		_, err := k.TryAcquire(abandonCtx, "abandoned", nil)
		abandoned <- err
	}()
	type result struct {
		l   pgfence.Lease
		err error
	}
	kept := make(chan result, 1)
	go func() {
		l, err := k.TryAcquire(ctx, "kept", nil)
		kept <- result{l, err}
	}()
	waitQueued(t, k, 2)
	abandon()
	require.ErrorIs(t, <-abandoned, context.Canceled)
	close(g.open)
	r := <-kept
	require.NoError(t, r.err)
	require.Equal(t, "kept", r.l.Name())
	require.NoError(t, <-inFlight)
	k.Close() // waits for the batch, and so for the give-back

	var held bool
	require.NoError(t, db.Pool.QueryRow(ctx,
		"SELECT expires_at > now() FROM pgfence.pgfence_leases WHERE name = 'abandoned'").Scan(&held))
	require.False(t, held, "the abandoned lease was taken and given back")
}

// TestReleaseDurability checks the durability the release statement
// chooses: not waiting for the WAL flush when every lease it releases
// becomes free at once, durable when AtLeast keeps one held. (The setting
// only takes effect because the statement selects it: the planner would
// otherwise remove the join that sets it.)
func TestReleaseDurability(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.NewDB(t)
	k, err := New(ctx, db.Pool, &Config{Owner: "me"})
	require.NoError(t, err)
	t.Cleanup(k.Close)
	tests := []struct {
		name     string
		atLeast  []int64 // per lease, microseconds
		want     *string
		held     int
		released int
	}{
		{"all freed", []int64{0, 0}, ptr("off"), 0, 2},
		{"one kept held", []int64{0, time.Hour.Microseconds()}, nil, 1, 2},
	}
	timing, err := k.cfg.timing(nil)
	require.NoError(t, err)
	for i, tt := range tests {
		names := make([]string, len(tt.atLeast))
		tokens := make([]int64, len(tt.atLeast))
		secrets := make([]string, len(tt.atLeast))
		for j := range tt.atLeast {
			names[j] = fmt.Sprintf("durability-%d-%d", i, j)
			rep, err := k.submitAcquire(ctx, names[j], timing)
			require.NoError(t, err)
			require.NoError(t, rep.err)
			require.True(t, rep.acquired)
			k.granting.Done() // not adopted: released below, by hand
			tokens[j], secrets[j] = rep.token, rep.secret
		}
		tx, err := db.Pool.Begin(ctx)
		require.NoError(t, err)
		rows, err := tx.Query(ctx, k.sql.release, names, tokens, secrets, tt.atLeast)
		require.NoError(t, err)
		n := 0
		for rows.Next() {
			var token int64
			var durability *string
			require.NoError(t, rows.Scan(&token, &durability))
			require.Equal(t, tt.want, durability, tt.name)
			n++
		}
		require.NoError(t, rows.Err())
		require.Equal(t, tt.released, n, tt.name)
		var setting string
		require.NoError(t, tx.QueryRow(ctx, "SHOW synchronous_commit").Scan(&setting))
		if tt.want != nil {
			require.Equal(t, "off", setting, tt.name)
		} else {
			require.NotEqual(t, "off", setting, tt.name)
		}
		require.NoError(t, tx.Commit(ctx))
		var held int
		require.NoError(t, db.Pool.QueryRow(ctx,
			"SELECT count(*) FROM pgfence.pgfence_leases WHERE name = ANY($1) AND expires_at > now()", names).Scan(&held))
		require.Equal(t, tt.held, held, tt.name)
	}
}

func ptr[T any](v T) *T { return &v }

// TestBatcherGoroutineLingers checks the drain goroutine's life: once its
// queue is empty it lingers (idle) and the next request wakes it rather
// than starting another; with no request for drainLinger it exits; close
// ends a lingering one at once, after which requests run in the caller.
func TestBatcherGoroutineLingers(t *testing.T) {
	t.Parallel()
	type req struct{ done chan struct{} }
	var (
		mu    sync.Mutex
		execs int
	)
	b := &batcher[*req]{
		exec: func(batch []*req) error {
			mu.Lock()
			execs++
			mu.Unlock()
			for _, r := range batch {
				close(r.done)
			}
			return nil
		},
		fail: func(*req, error) { t.Error("no request may fail") },
	}
	state := func() (running, idle bool) {
		b.mu.Lock()
		defer b.mu.Unlock()
		return b.draining, b.idle
	}
	waitState := func(running, idle bool) {
		t.Helper()
		for i := 0; ; i++ {
			r, d := state()
			if r == running && d == idle {
				return
			}
			require.Less(t, i, 10000, "batcher did not reach running %t, idle %t (at %t, %t)", running, idle, r, d)
			time.Sleep(time.Millisecond)
		}
	}
	submit := func() {
		t.Helper()
		r := &req{done: make(chan struct{})}
		b.submit(r)
		<-r.done
	}

	submit()
	waitState(true, true) // lingering, not exited
	for range 5 {
		submit() // wakes the lingering goroutine, which lingers again
		waitState(true, true)
	}
	// Control: left alone past drainLinger, it exits.
	waitState(false, false)
	submit()
	waitState(true, true)
	b.close()
	r, d := state()
	require.False(t, r, "close must end the lingering goroutine")
	require.False(t, d)
	submit() // after close: run in the caller
	r, _ = state()
	require.False(t, r)
	mu.Lock()
	defer mu.Unlock()
	require.Equal(t, 8, execs)
}

// TestBatcherRunNow checks runNow: a lone request runs in the caller, with
// no drain goroutine; requests that arrive while it runs queue and go out
// together in one batch once it is answered; and while a batch is in
// flight (control), runNow declines, so the request waits its turn.
func TestBatcherRunNow(t *testing.T) {
	t.Parallel()
	type req struct {
		id   int
		done chan struct{}
	}
	var (
		mu      sync.Mutex
		batches [][]int
		hold    = make(chan struct{})
		entered = make(chan struct{}, 10)
	)
	b := &batcher[*req]{
		exec: func(batch []*req) error {
			ids := make([]int, 0, len(batch))
			for _, r := range batch {
				ids = append(ids, r.id)
			}
			mu.Lock()
			batches = append(batches, ids)
			mu.Unlock()
			if ids[0] == 1 {
				entered <- struct{}{}
				<-hold
			}
			for _, r := range batch {
				close(r.done)
			}
			return nil
		},
		fail: func(*req, error) { t.Error("no request may fail") },
	}
	t.Cleanup(b.close)
	newReq := func(id int) *req { return &req{id: id, done: make(chan struct{})} }

	r0 := newReq(0)
	require.True(t, b.runNow(r0), "a lone request runs at once")
	<-r0.done
	b.mu.Lock()
	require.False(t, b.draining, "runNow must not start the drain goroutine")
	b.mu.Unlock()

	// Request 1 runs in this test's goroutine and blocks in exec; 2 and 3
	// come meanwhile: runNow declines them (control) and they queue.
	r1 := newReq(1)
	ran := make(chan bool)
	go func() { ran <- b.runNow(r1) }()
	<-entered
	r2, r3 := newReq(2), newReq(3)
	require.False(t, b.runNow(r2), "runNow must decline while a batch is in flight")
	b.submit(r2)
	b.submit(r3)
	b.mu.Lock()
	require.Len(t, b.queue, 2, "requests must wait for the batch in flight")
	b.mu.Unlock()
	close(hold)
	require.True(t, <-ran)
	<-r2.done
	<-r3.done
	mu.Lock()
	defer mu.Unlock()
	require.Equal(t, [][]int{{0}, {1}, {2, 3}}, batches, "the queued requests go out together after the one in flight")
}

// TestBatcherRunNowAcrossClose: a request queued behind a runNow still
// running when close is called is run by that runNow's caller, since no
// drain goroutine is left to take it.
func TestBatcherRunNowAcrossClose(t *testing.T) {
	t.Parallel()
	type req struct {
		id   int
		done chan struct{}
	}
	hold, entered := make(chan struct{}), make(chan struct{})
	drainingAt2 := true
	var b *batcher[*req]
	b = &batcher[*req]{
		exec: func(batch []*req) error {
			if batch[0].id == 1 {
				close(entered)
				<-hold
			}
			if batch[0].id == 2 {
				b.mu.Lock()
				drainingAt2 = b.draining
				b.mu.Unlock()
			}
			for _, r := range batch {
				close(r.done)
			}
			return nil
		},
		fail: func(*req, error) { t.Error("no request may fail") },
	}
	r1, r2 := &req{1, make(chan struct{})}, &req{2, make(chan struct{})}
	ran := make(chan bool)
	go func() { ran <- b.runNow(r1) }()
	<-entered
	b.submit(r2) // queued: the batch in flight is r1's
	b.close()    // no drain goroutine to wait for
	select {
	case <-r2.done:
		t.Fatal("r2 ran before r1's statement was answered")
	default:
	}
	close(hold)
	require.True(t, <-ran)
	<-r2.done
	b.mu.Lock()
	defer b.mu.Unlock()
	require.Empty(t, b.queue)
	require.False(t, drainingAt2, "r2 must run in runNow's caller, not in a drain goroutine started after close")
}
