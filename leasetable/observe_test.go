package leasetable_test

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence"
	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/leasetable"
)

// reqKey is the context key of a request id, as a service would set it.
type reqKey struct{}

func withReq(id string) context.Context {
	return context.WithValue(context.Background(), reqKey{}, id)
}

func reqOf(ctx context.Context) string {
	id, _ := ctx.Value(reqKey{}).(string)
	return id
}

// opKey marks the ctx an OpObserver's StartOp returned.
type opKey struct{}

type recorded struct {
	e   pgfence.Event
	req string
}

type recordedOp struct {
	start  bool
	op     pgfence.Op
	req    string
	marked bool // EndOp got the ctx StartOp returned
	links  []string
	err    error
}

// recorder is an Observer and OpObserver that records everything, with
// the request id of each ctx.
type recorder struct {
	mu      sync.Mutex
	events  []recorded
	ops     []recordedOp
	changed chan struct{}
}

func newRecorder() *recorder { return &recorder{changed: make(chan struct{})} }

func (r *recorder) Observe(ctx context.Context, e pgfence.Event) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events = append(r.events, recorded{e, reqOf(ctx)})
	close(r.changed)
	r.changed = make(chan struct{})
}

func (r *recorder) StartOp(ctx context.Context, op pgfence.Op) context.Context {
	r.mu.Lock()
	defer r.mu.Unlock()
	var links []string
	for _, l := range op.Links {
		links = append(links, reqOf(l))
	}
	r.ops = append(r.ops, recordedOp{start: true, op: op, req: reqOf(ctx), links: links})
	return context.WithValue(ctx, opKey{}, op.Kind)
}

func (r *recorder) EndOp(ctx context.Context, op pgfence.Op, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	kind, _ := ctx.Value(opKey{}).(pgfence.OpKind)
	r.ops = append(r.ops, recordedOp{op: op, req: reqOf(ctx), marked: kind == op.Kind, err: err})
	close(r.changed)
	r.changed = make(chan struct{})
}

// await returns the first event matching pred, waiting for it.
func (r *recorder) await(t *testing.T, what string, pred func(recorded) bool) recorded {
	t.Helper()
	deadline := time.After(30 * time.Second)
	for i := 0; ; {
		r.mu.Lock()
		for ; i < len(r.events); i++ {
			if pred(r.events[i]) {
				e := r.events[i]
				r.mu.Unlock()
				return e
			}
		}
		ch := r.changed
		r.mu.Unlock()
		select {
		case <-ch:
		case <-deadline:
			t.Fatalf("never observed: %s", what)
		}
	}
}

// awaitOp returns the first EndOp matching pred, waiting for it.
func (r *recorder) awaitOp(t *testing.T, what string, pred func(recordedOp) bool) recordedOp {
	t.Helper()
	deadline := time.After(30 * time.Second)
	for i := 0; ; {
		r.mu.Lock()
		for ; i < len(r.ops); i++ {
			if !r.ops[i].start && pred(r.ops[i]) {
				o := r.ops[i]
				r.mu.Unlock()
				return o
			}
		}
		ch := r.changed
		r.mu.Unlock()
		select {
		case <-ch:
		case <-deadline:
			t.Fatalf("never observed: %s", what)
		}
	}
}

// count returns how many recorded events match pred.
func (r *recorder) count(pred func(recorded) bool) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.countLocked(pred)
}

// countLocked is count with r.mu held (from an await predicate).
func (r *recorder) countLocked(pred func(recorded) bool) int {
	n := 0
	for _, e := range r.events {
		if pred(e) {
			n++
		}
	}
	return n
}

// checkOps checks that every EndOp has its StartOp (same kind and name,
// same request id) and got the ctx StartOp returned.
func (r *recorder) checkOps(t *testing.T) {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	open := map[string]int{}
	key := func(o recordedOp) string { return o.op.Kind.String() + "/" + o.op.Name + "/" + o.req }
	for _, o := range r.ops {
		if o.start {
			open[key(o)]++
			continue
		}
		require.True(t, o.marked, "EndOp of %v got StartOp's ctx", o.op.Kind)
		require.Positive(t, open[key(o)], "EndOp of %s without its StartOp", key(o))
		open[key(o)]--
	}
}

func isEvent[E pgfence.Event](name string) func(recorded) bool {
	return func(r recorded) bool {
		e, ok := r.e.(E)
		if !ok {
			return false
		}
		switch e := any(e).(type) {
		case pgfence.Acquired:
			return e.Name == name
		case pgfence.NotAcquired:
			return e.Name == name
		case pgfence.Renewed:
			return e.Name == name
		case pgfence.RenewalFailed:
			return e.Name == name
		case pgfence.Lost:
			return e.Name == name
		case pgfence.Released:
			return e.Name == name
		}
		return true
	}
}

// TestEventsAndStats walks a lease through every outcome and checks each
// event, the ctx it came with (the caller's for the caller's calls, the
// acquiring ctx's values for renewals and losses), the operations around
// them, and the Stats counters.
func TestEventsAndStats(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.NewDB(t)
	rec, rec2 := newRecorder(), newRecorder()
	logs := newLogWatch()
	k, err := leasetable.New(ctx, db.Pool, &leasetable.Config{TTL: 1500 * time.Millisecond, Observer: rec})
	require.NoError(t, err)
	other := newLocker(t, db.Pool, &leasetable.Config{Observer: rec2, Logger: logs.logger()})

	l, err := k.TryAcquire(withReq("acq-a"), "a", nil)
	require.NoError(t, err)
	got := rec.await(t, "Acquired a", isEvent[pgfence.Acquired]("a"))
	acq := got.e.(pgfence.Acquired)
	require.Equal(t, "acq-a", got.req)
	require.Equal(t, pgfence.Lock{Kind: pgfence.StrategyLeaseTable, Name: "a", Token: l.Token()}, acq.Lock)
	require.Equal(t, 1, acq.Attempts)
	require.Positive(t, acq.Wait)
	op := rec.awaitOp(t, "acquire op", func(o recordedOp) bool { return o.op.Kind == pgfence.OpAcquire })
	require.Equal(t, pgfence.Op{Kind: pgfence.OpAcquire, Strategy: pgfence.StrategyLeaseTable, Name: "a", Batch: 1}, op.op)
	require.Equal(t, "acq-a", op.req)
	require.NoError(t, op.err)

	_, err = other.TryAcquire(withReq("try-a"), "a", nil)
	require.ErrorIs(t, err, pgfence.ErrNotAcquired)
	got = rec2.await(t, "NotAcquired a", isEvent[pgfence.NotAcquired]("a"))
	na := got.e.(pgfence.NotAcquired)
	require.Equal(t, "try-a", got.req)
	require.Zero(t, na.Token)
	require.Equal(t, 1, na.Attempts)
	require.ErrorIs(t, na.Err, pgfence.ErrNotAcquired)

	// Bad input is no outcome: no event, no count.
	_, err = other.TryAcquire(ctx, "", nil)
	require.Error(t, err)
	require.Equal(t, 1, rec2.count(func(r recorded) bool { _, ok := r.e.(pgfence.NotAcquired); return ok }))

	got = rec.await(t, "Renewed a", isEvent[pgfence.Renewed]("a"))
	require.Equal(t, "acq-a", got.req, "a renewal carries the acquiring ctx's values")
	require.WithinDuration(t, time.Now().Add(1500*time.Millisecond), got.e.(pgfence.Renewed).Expiry, 1500*time.Millisecond)
	renewOp := rec.awaitOp(t, "renew op", func(o recordedOp) bool { return o.op.Kind == pgfence.OpRenew })
	require.Equal(t, "a", renewOp.op.Name)
	require.Equal(t, 1, renewOp.op.Batch)
	require.Equal(t, "acq-a", renewOp.req)

	st := k.Stats()
	require.Equal(t, 1, st.Held)
	require.Equal(t, uint64(1), st.Acquired)

	// Waiting, and listening.
	ready, waiting := logs.next("LISTEN connection ready"), logs.next("waiting for lease")
	wait := make(chan error, 1)
	go func() {
		l, err := other.Acquire(withReq("wait-a"), "a", &leasetable.AcquireOpts{WaitTimeout: 30 * time.Second})
		if err == nil {
			err = l.Release(ctx)
		}
		wait <- err
	}()
	waitFor(t, waiting, "the waiter")
	waitFor(t, ready, "the listener")
	select {
	case err := <-wait:
		t.Fatalf("the waiter returned: %v", err)
	default:
	}
	require.Equal(t, 1, other.Stats().Waiting)
	require.Eventually(t, func() bool { return other.Stats().Listening }, 30*time.Second, 5*time.Millisecond)

	require.NoError(t, l.Release(withReq("rel-a")))
	got = rec.await(t, "Released a", isEvent[pgfence.Released]("a"))
	require.Equal(t, "rel-a", got.req)
	require.NoError(t, got.e.(pgfence.Released).Err)
	require.Positive(t, got.e.(pgfence.Released).HeldFor)
	relOp := rec.awaitOp(t, "release op", func(o recordedOp) bool { return o.op.Kind == pgfence.OpRelease })
	require.Equal(t, "rel-a", relOp.req)
	require.NoError(t, <-wait)
	got = rec2.await(t, "Acquired a by the waiter", isEvent[pgfence.Acquired]("a"))
	require.Equal(t, "wait-a", got.req)
	require.GreaterOrEqual(t, got.e.(pgfence.Acquired).Attempts, 2)
	require.Zero(t, other.Stats().Waiting)

	// Lost: force-released by an operator.
	lb, err := k.TryAcquire(withReq("acq-b"), "b", nil)
	require.NoError(t, err)
	_, err = other.ForceRelease(ctx, "b", "test")
	require.NoError(t, err)
	got = rec.await(t, "Lost b", isEvent[pgfence.Lost]("b"))
	require.Equal(t, "acq-b", got.req)
	require.ErrorIs(t, got.e.(pgfence.Lost).Cause, pgfence.ErrLeaseLost)
	require.NotErrorIs(t, got.e.(pgfence.Lost).Cause, pgfence.ErrClosed)
	require.Equal(t, lb.Token(), got.e.(pgfence.Lost).Token)

	// Lost: the Locker closed.
	_, err = k.TryAcquire(withReq("acq-c"), "c", nil)
	require.NoError(t, err)
	k.Close()
	got = rec.await(t, "Lost c", isEvent[pgfence.Lost]("c"))
	require.Equal(t, "acq-c", got.req)
	require.ErrorIs(t, got.e.(pgfence.Lost).Cause, pgfence.ErrClosed)

	st = k.Stats()
	require.Equal(t, pgfence.Stats{Acquired: 3, Released: 1, Lost: 2}, st)
	st = other.Stats()
	require.Equal(t, uint64(1), st.NotAcquired)
	require.Equal(t, uint64(1), st.Acquired)
	require.Equal(t, uint64(1), st.Released)
	rec.checkOps(t)
	rec2.checkOps(t)
}

// TestRenewBatchOperation: leases renewed together are one renew
// operation whose ctx carries the first lease's acquiring values and
// whose Links carry the others'.
func TestRenewBatchOperation(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDB(t)
	rec := newRecorder()
	k := newLocker(t, db.Pool, &leasetable.Config{TTL: 1500 * time.Millisecond, Observer: rec})
	want := map[string]bool{}
	for _, name := range []string{"x", "y", "z"} {
		_, err := k.TryAcquire(withReq("acq-"+name), name, nil)
		require.NoError(t, err)
		want["acq-"+name] = true
	}
	op := rec.awaitOp(t, "a renew batch", func(o recordedOp) bool { return o.op.Kind == pgfence.OpRenew && o.op.Batch == 3 })
	require.Empty(t, op.op.Name, "several names")
	var start recordedOp
	rec.mu.Lock()
	for _, o := range rec.ops {
		if o.start && o.op.Kind == pgfence.OpRenew && o.op.Batch == 3 {
			start = o
			break
		}
	}
	rec.mu.Unlock()
	require.Len(t, start.links, 2)
	seen := map[string]bool{start.req: true}
	for _, l := range start.links {
		seen[l] = true
	}
	require.Equal(t, want, seen, "the first lease's values, the others linked")
	rec.checkOps(t)
}

// stmtRecorder is a pgx tracer that records each statement's request id.
type stmtRecorder struct {
	mu    sync.Mutex
	stmts []recordedStmt
}

type recordedStmt struct{ sql, req string }

func (s *stmtRecorder) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stmts = append(s.stmts, recordedStmt{d.SQL, reqOf(ctx)})
	return ctx
}

func (s *stmtRecorder) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// reqs returns the request ids of the statements containing sub.
func (s *stmtRecorder) reqs(sub string) map[string]int {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[string]int{}
	for _, st := range s.stmts {
		if strings.Contains(st.sql, sub) {
			out[st.req]++
		}
	}
	return out
}

// logRecorder is a slog handler that records each record's message and
// the request id of its ctx.
type logRecorder struct {
	mu   sync.Mutex
	recs []recordedStmt
}

func (h *logRecorder) Enabled(context.Context, slog.Level) bool { return true }
func (h *logRecorder) WithAttrs([]slog.Attr) slog.Handler       { return h }
func (h *logRecorder) WithGroup(string) slog.Handler            { return h }
func (h *logRecorder) Handle(ctx context.Context, r slog.Record) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.recs = append(h.recs, recordedStmt{r.Message, reqOf(ctx)})
	return nil
}

// TestContextReachesEveryStatement: the acquire, renew and release
// statements, and the log records about them, carry the values of the
// caller they run for: the acquirer's for the acquire and every renewal
// and Close's release, the releaser's for a release. The negative control
// is a statement sent with context.Background(), which the tracer records
// without a request id.
func TestContextReachesEveryStatement(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.NewDB(t)
	tracer := &stmtRecorder{}
	pool := db.NewPool(t, func(c *pgxpool.Config) { c.ConnConfig.Tracer = tracer })
	logs := &logRecorder{}
	rec := newRecorder()
	k, err := leasetable.New(ctx, pool, &leasetable.Config{TTL: 600 * time.Millisecond, Logger: slog.New(logs), Observer: rec})
	require.NoError(t, err)

	l, err := k.TryAcquire(withReq("acq-1"), "one", nil)
	require.NoError(t, err)
	_, err = k.TryAcquire(withReq("acq-2"), "two", nil)
	require.NoError(t, err)
	rec.await(t, "a renewal of one", isEvent[pgfence.Renewed]("one"))
	require.NoError(t, l.Release(withReq("rel-1")))
	k.Close() // releases "two" with its acquiring values

	require.Equal(t, map[string]int{"acq-1": 1, "acq-2": 1}, tracer.reqs("pgfence_acquire("))
	renews := tracer.reqs("pgfence_renew(")
	require.NotEmpty(t, renews)
	for req := range renews {
		require.Contains(t, []string{"acq-1", "acq-2"}, req, "a renewal carries an acquirer's values")
	}
	require.Equal(t, map[string]int{"rel-1": 1, "acq-2": 1}, tracer.reqs("pgfence_release("))

	_, err = pool.Exec(ctx, "SELECT 'control'")
	require.NoError(t, err)
	require.Equal(t, map[string]int{"": 1}, tracer.reqs("'control'"), "negative control: no values, no request id")

	logs.mu.Lock()
	defer logs.mu.Unlock()
	require.NotEmpty(t, logs.recs)
	for _, r := range logs.recs {
		require.NotEmpty(t, r.req, "log record %q has its caller's ctx", r.sql)
	}
}
