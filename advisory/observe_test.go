package advisory_test

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
	"github.com/pgfence/pgfence/advisory"
	"github.com/pgfence/pgfence/internal/pgtest"
)

// reqKey is the ctx key of a request id, as a service would set it.
type reqKey struct{}

func withReq(id string) context.Context {
	return context.WithValue(context.Background(), reqKey{}, id)
}

func reqOf(ctx context.Context) string {
	if id, ok := ctx.Value(reqKey{}).(string); ok {
		return id
	}
	return "<none>"
}

// seen is one event or operation as a recorder saw it.
type seen struct {
	e     pgfence.Event // nil for an operation
	op    pgfence.Op
	end   bool  // EndOp rather than StartOp
	err   error // EndOp's
	req   string
	links []string // the request ids of op.Links
}

// recorder is an Observer and OpObserver that keeps what it is told.
type recorder struct {
	mu     sync.Mutex
	seen   []seen
	notify chan struct{}
}

func newRecorder() *recorder { return &recorder{notify: make(chan struct{}, 1)} }

func (r *recorder) add(s seen) {
	r.mu.Lock()
	r.seen = append(r.seen, s)
	r.mu.Unlock()
	select {
	case r.notify <- struct{}{}:
	default:
	}
}

func (r *recorder) Observe(ctx context.Context, e pgfence.Event) {
	r.add(seen{e: e, req: reqOf(ctx)})
}

func (r *recorder) StartOp(ctx context.Context, op pgfence.Op) context.Context {
	s := seen{op: op, req: reqOf(ctx)}
	for _, l := range op.Links {
		s.links = append(s.links, reqOf(l))
	}
	r.add(s)
	return ctx
}

func (r *recorder) EndOp(ctx context.Context, op pgfence.Op, err error) {
	r.add(seen{op: op, end: true, err: err, req: reqOf(ctx)})
}

// wait returns the first record (from index from) that match accepts,
// waiting for it.
func (r *recorder) wait(t *testing.T, match func(seen) bool) seen {
	t.Helper()
	deadline := time.After(30 * time.Second)
	for {
		r.mu.Lock()
		for _, s := range r.seen {
			if match(s) {
				r.mu.Unlock()
				return s
			}
		}
		r.mu.Unlock()
		select {
		case <-r.notify:
		case <-deadline:
			t.Fatal("the expected event or operation was not observed")
		}
	}
}

// events returns the events of type T seen so far.
func eventsOf[T pgfence.Event](r *recorder) []T {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []T
	for _, s := range r.seen {
		if e, ok := s.e.(T); ok {
			out = append(out, e)
		}
	}
	return out
}

func isEvent[T pgfence.Event](name string) func(seen) bool {
	return func(s seen) bool {
		e, ok := s.e.(T)
		if !ok {
			return false
		}
		switch e := any(e).(type) {
		case pgfence.Lost:
			return e.Name == name
		case pgfence.Renewed:
			return e.Name == name
		}
		return true
	}
}

func TestEventsAndStats(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDB(t)
	rec := newRecorder()
	cfg := fastConfig("pgfence-events")
	cfg.MaxSessions = 1 // every lock on one session: one renewal covers them all
	cfg.Observer = rec
	l := newLocker(t, db.Pool, cfg)
	other := newLocker(t, db.NewPool(t, nil), nil)

	// A grant.
	a, err := l.TryAcquire(withReq("acquire-a"), "a", nil)
	require.NoError(t, err)
	got := rec.wait(t, func(s seen) bool { _, ok := s.e.(pgfence.Acquired); return ok })
	acq := got.e.(pgfence.Acquired)
	require.Equal(t, pgfence.Lock{Kind: pgfence.StrategyAdvisory, Name: "a", Token: a.Token()}, acq.Lock)
	require.Equal(t, 1, acq.Attempts)
	require.Positive(t, acq.Wait)
	require.Equal(t, "acquire-a", got.req, "sent with the caller's ctx")
	start := rec.wait(t, func(s seen) bool { return s.e == nil && !s.end && s.op.Kind == pgfence.OpAcquire })
	require.Equal(t, pgfence.Op{Kind: pgfence.OpAcquire, Strategy: pgfence.StrategyAdvisory, Name: "a", Batch: 1}, start.op)
	require.Equal(t, "acquire-a", start.req)
	end := rec.wait(t, func(s seen) bool { return s.end && s.op.Kind == pgfence.OpAcquire })
	require.NoError(t, end.err)

	// Refusals: held elsewhere, a WaitTimeout, already held by the caller.
	held, err := other.TryAcquire(context.Background(), "b", nil)
	require.NoError(t, err)
	_, err = l.TryAcquire(withReq("try-b"), "b", nil)
	require.ErrorIs(t, err, pgfence.ErrNotAcquired)
	_, err = l.Acquire(withReq("wait-b"), "b", &pgfence.AcquireOpts{WaitTimeout: 100 * time.Millisecond})
	require.ErrorIs(t, err, context.DeadlineExceeded)
	_, err = l.Acquire(a.Context(), "a", nil)
	require.ErrorIs(t, err, pgfence.ErrAlreadyHeld)
	na := eventsOf[pgfence.NotAcquired](rec)
	require.Len(t, na, 3)
	require.Equal(t, 1, na[0].Attempts)
	require.ErrorIs(t, na[0].Err, pgfence.ErrNotAcquired)
	require.Greater(t, na[1].Attempts, 1, "the wait asked again")
	require.ErrorIs(t, na[1].Err, context.DeadlineExceeded)
	require.GreaterOrEqual(t, na[1].Wait, 100*time.Millisecond)
	require.Zero(t, na[2].Attempts, "refused without asking the database")
	require.ErrorIs(t, na[2].Err, pgfence.ErrAlreadyHeld)
	require.Equal(t, pgfence.Lock{Kind: pgfence.StrategyAdvisory, Name: "b"}, na[0].Lock, "no token without a grant")
	require.NoError(t, held.Release(context.Background()))

	// Session checks renew every lock on the session: one OpRenew with
	// the oldest lock's acquiring ctx, the others' as links.
	c, err := l.TryAcquire(withReq("acquire-c"), "c", nil)
	require.NoError(t, err)
	renew := rec.wait(t, func(s seen) bool { return !s.end && s.op.Kind == pgfence.OpRenew && s.op.Batch == 2 })
	require.Equal(t, "acquire-a", renew.req)
	require.Equal(t, []string{"acquire-c"}, renew.links)
	require.Empty(t, renew.op.Name, "a batch of several has no single name")
	renewed := rec.wait(t, isEvent[pgfence.Renewed]("c"))
	require.Equal(t, "acquire-c", renewed.req, "a background event carries its lock's acquiring ctx")
	require.True(t, renewed.e.(pgfence.Renewed).Expiry.IsZero())
	require.NoError(t, c.Renew(withReq("renew-c")))
	rec.wait(t, func(s seen) bool {
		return !s.end && s.op.Kind == pgfence.OpRenew && s.op.Name == "c" && s.req == "renew-c"
	})

	// A release.
	require.NoError(t, a.Release(withReq("release-a")))
	rel := rec.wait(t, func(s seen) bool { _, ok := s.e.(pgfence.Released); return ok })
	require.Equal(t, "release-a", rel.req)
	require.Equal(t, "a", rel.e.(pgfence.Released).Name)
	require.NoError(t, rel.e.(pgfence.Released).Err)
	require.Positive(t, rel.e.(pgfence.Released).HeldFor)
	rec.wait(t, func(s seen) bool { return s.end && s.op.Kind == pgfence.OpRelease && s.err == nil })

	// A loss: the session dies.
	_, err = db.Pool.Exec(context.Background(), "SELECT pg_terminate_backend($1, 5000)", holderPID(t, db, advisory.Name("c")))
	require.NoError(t, err)
	lost := rec.wait(t, isEvent[pgfence.Lost]("c"))
	require.Equal(t, "acquire-c", lost.req)
	require.ErrorIs(t, lost.e.(pgfence.Lost).Cause, pgfence.ErrLeaseLost)
	require.Equal(t, c.Token(), lost.e.(pgfence.Lost).Token)
	require.ErrorIs(t, c.Release(context.Background()), pgfence.ErrNotHeld)

	// Closing with a lock held loses it, with ErrClosed.
	d, err := l.TryAcquire(withReq("acquire-d"), "d", nil)
	require.NoError(t, err)
	st := l.Stats()
	st.Listening = false // the wait for b started the LISTEN connection, which may or may not be up yet
	require.Equal(t, pgfence.Stats{Held: 1, Acquired: 3, NotAcquired: 3, Released: 1, Lost: 1}, st)
	l.Close()
	lostD := rec.wait(t, isEvent[pgfence.Lost]("d"))
	require.ErrorIs(t, lostD.e.(pgfence.Lost).Cause, pgfence.ErrClosed)
	require.ErrorIs(t, d.Err(), pgfence.ErrClosed)
	st = l.Stats()
	require.Equal(t, pgfence.Stats{Acquired: 3, NotAcquired: 3, Released: 1, Lost: 2}, st)
	require.Len(t, eventsOf[pgfence.RenewalFailed](rec), 0, "advisory sends none: a failed check loses the session")
	_, err = l.TryAcquire(withReq("closed"), "e", nil)
	require.ErrorIs(t, err, pgfence.ErrClosed)
	require.ErrorIs(t, eventsOf[pgfence.NotAcquired](rec)[3].Err, pgfence.ErrClosed)

	// Negative control: a Locker without an Observer counts the same way
	// and sends nothing.
	before := len(rec.seen)
	plain := newLocker(t, db.Pool, nil)
	x, err := plain.TryAcquire(withReq("plain"), "x", nil)
	require.NoError(t, err)
	require.NoError(t, x.Release(context.Background()))
	require.Equal(t, pgfence.Stats{Acquired: 1, Released: 1}, plain.Stats())
	rec.mu.Lock()
	require.Len(t, rec.seen, before)
	rec.mu.Unlock()
}

// TestListenEvents kills the LISTEN connection under a waiter: ListenLost,
// then ListenRestored once it listens again, and Stats.Listening follows.
func TestListenEvents(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.NewDB(t)
	rec := newRecorder()
	cfg := fastConfig("pgfence-listen-events")
	cfg.Observer = rec
	l := newLocker(t, db.Pool, cfg)
	advisory.SetNoPark(l) // it waits through the LISTEN connection
	other := newLocker(t, db.NewPool(t, nil), nil)
	key := advisory.Name("listened")

	held, err := other.TryAcquireKey(ctx, key, nil)
	require.NoError(t, err)
	done := make(chan error, 1)
	go func() {
		lk, err := l.AcquireKey(ctx, key, nil)
		if err == nil {
			err = lk.Release(ctx)
		}
		done <- err
	}()
	require.Eventually(t, func() bool { return advisory.Registered(l, key) && l.Stats().Listening }, 30*time.Second, time.Millisecond)
	require.Equal(t, 1, l.Stats().Waiting)
	require.Empty(t, eventsOf[pgfence.ListenRestored](rec), "not at the first start")

	_, err = db.Pool.Exec(ctx, `SELECT pg_terminate_backend(pid, 5000) FROM pg_stat_activity
		WHERE datname = current_database() AND application_name = 'pgfence-listen-events-listen'`)
	require.NoError(t, err)
	lostEv := rec.wait(t, func(s seen) bool { _, ok := s.e.(pgfence.ListenLost); return ok })
	require.Equal(t, pgfence.StrategyAdvisory, lostEv.e.Strategy())
	require.Error(t, lostEv.e.(pgfence.ListenLost).Err)
	restored := rec.wait(t, func(s seen) bool { _, ok := s.e.(pgfence.ListenRestored); return ok })
	require.Positive(t, restored.e.(pgfence.ListenRestored).Down)
	require.Eventually(t, func() bool { return l.Stats().Listening }, 30*time.Second, time.Millisecond)
	require.Len(t, eventsOf[pgfence.ListenLost](rec), 1, "once per outage")

	require.NoError(t, held.Release(ctx))
	require.NoError(t, <-done)
}

// statementTracer records, for each statement sent on a connection of the
// pool's configuration, the request id its ctx carries.
type statementTracer struct {
	mu   sync.Mutex
	reqs map[string][]string // by statement kind
}

func (tr *statementTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	kind := "other"
	for _, k := range []struct{ kind, needle string }{
		{"setup", "set_config('tcp_keepalives_idle'"},
		{"lock", "pg_try_advisory_lock("},
		{"unlock", "pg_advisory_unlock("},
		{"interest", "pg_try_advisory_lock_shared(1885824631"},
		{"ping", "SELECT pg_catalog.pg_backend_pid()"},
	} {
		if strings.Contains(d.SQL, k.needle) {
			kind = k.kind
			break
		}
	}
	if d.SQL == "SELECT pg_catalog.pg_backend_pid()" {
		kind = "ping"
	}
	tr.mu.Lock()
	tr.reqs[kind] = append(tr.reqs[kind], reqOf(ctx))
	tr.mu.Unlock()
	return ctx
}

func (tr *statementTracer) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (tr *statementTracer) of(kind string) []string {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	return append([]string(nil), tr.reqs[kind]...)
}

// TestContextValuesReachStatementsAndLogs checks with a pgx QueryTracer that
// the statements the Locker sends for a caller carry that caller's ctx
// values: the session's setup and the lock statement (the acquiring call),
// the unlock (the releasing call), the session checks (the ctx that
// acquired the lock they renew) and the interest lock of a waiter (the
// waiting call); and that log records carry them too.
func TestContextValuesReachStatementsAndLogs(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.NewDB(t)
	tr := &statementTracer{reqs: map[string][]string{}}
	pool := db.NewPool(t, func(c *pgxpool.Config) { c.ConnConfig.Tracer = tr })
	h := &recordHandler{}
	cfg := fastConfig("pgfence-ctx")
	cfg.MaxSessions = 1
	cfg.Logger = slog.New(h)
	l := newLocker(t, pool, cfg)
	other := newLocker(t, db.NewPool(t, nil), nil)

	a, err := l.TryAcquireKey(withReq("acquire-a"), advisory.Name("a"), nil)
	require.NoError(t, err)
	require.Equal(t, []string{"acquire-a"}, tr.of("setup"))
	require.Equal(t, []string{"acquire-a"}, tr.of("lock"))
	require.Equal(t, "acquire-a", h.ctxReq("pgfence: advisory: lock session opened"))
	require.Eventually(t, func() bool { return len(tr.of("ping")) > 0 }, 30*time.Second, time.Millisecond)
	for _, r := range tr.of("ping") {
		require.Equal(t, "acquire-a", r, "a session check renews a: it carries a's acquiring ctx")
	}

	// A waiter that registers interest on the LISTEN connection.
	held, err := other.TryAcquireKey(ctx, advisory.Name("b"), nil)
	require.NoError(t, err)
	done := make(chan error, 1)
	go func() {
		lk, err := l.AcquireKey(withReq("wait-b"), advisory.Name("b"), nil)
		if err == nil {
			err = lk.Release(withReq("release-b"))
		}
		done <- err
	}()
	require.Eventually(t, func() bool { return len(tr.of("interest")) > 0 }, 30*time.Second, time.Millisecond)
	require.Equal(t, "wait-b", tr.of("interest")[0])
	require.NoError(t, held.Release(ctx))
	require.NoError(t, <-done)

	require.NoError(t, a.Release(withReq("release-a")))
	unlocks := tr.of("unlock")
	require.Contains(t, unlocks, "release-a")
	require.Contains(t, unlocks, "release-b")
	for _, r := range tr.of("lock") {
		require.NotEqual(t, "<none>", r)
	}
	for _, r := range unlocks {
		require.NotEqual(t, "<none>", r)
	}

	// The loss of a session is logged with the ctx of a lock it held.
	c, err := l.TryAcquireKey(withReq("acquire-c"), advisory.Name("c"), nil)
	require.NoError(t, err)
	_, err = db.Pool.Exec(ctx, "SELECT pg_terminate_backend($1, 5000)", holderPID(t, db, c.Key()))
	require.NoError(t, err)
	waitDone(t, c)
	select {
	case <-h.logged("pgfence: advisory: lock session lost"):
	case <-time.After(30 * time.Second):
		t.Fatal("the loss was not logged")
	}
	require.Equal(t, "acquire-c", h.ctxReq("pgfence: advisory: lock session lost"))
	require.Equal(t, "<none>", reqOf(ctx), "negative control: a bare ctx carries no request")
}

// TestReleaseOnDeadSession releases a lock whose session the server ended
// before the watchdog noticed: the unlock fails, which ends the session
// (and so the lock: the server released it with the session). Release
// reports it (ErrNotHeld, and ErrUnavailable as the cause is transient),
// the lock ends Released with that error, and the other lock on the
// session ends Lost. A release on a live session (the control) reports
// nothing.
func TestReleaseOnDeadSession(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDB(t)
	rec := newRecorder()
	l := newLocker(t, db.Pool, &advisory.Config{
		MaxSessions:          1,
		SessionCheckInterval: time.Hour,
		TCPKeepalivesIdle:    3 * time.Hour,
		TCPUserTimeout:       3 * time.Hour,
		Observer:             rec,
	})
	advisory.SetNoPeek(l)
	ctx := withReq("release")

	ok, err := l.TryAcquire(ctx, "ok", nil)
	require.NoError(t, err)
	require.NoError(t, ok.Release(ctx), "control: a release on a live session")
	a, err := l.TryAcquire(ctx, "a", nil)
	require.NoError(t, err)
	b, err := l.TryAcquire(ctx, "b", nil)
	require.NoError(t, err)
	_, err = db.Pool.Exec(context.Background(), "SELECT pg_terminate_backend($1, 5000)", holderPID(t, db, advisory.Name("a")))
	require.NoError(t, err)

	err = a.Release(ctx)
	require.ErrorIs(t, err, pgfence.ErrNotHeld)
	require.ErrorIs(t, err, pgfence.ErrUnavailable)
	require.NoError(t, a.Release(ctx), "reported once")
	waitDone(t, b)
	rel := eventsOf[pgfence.Released](rec)
	require.Len(t, rel, 2)
	require.NoError(t, rel[0].Err)
	require.Equal(t, "a", rel[1].Name)
	require.ErrorIs(t, rel[1].Err, pgfence.ErrUnavailable)
	lost := rec.wait(t, isEvent[pgfence.Lost]("b"))
	require.ErrorIs(t, lost.e.(pgfence.Lost).Cause, pgfence.ErrLeaseLost)
	require.Empty(t, func() (names []string) {
		for _, e := range eventsOf[pgfence.Lost](rec) {
			if e.Name == "a" {
				names = append(names, e.Name)
			}
		}
		return names
	}(), "the released lock is not also lost")
	st := l.Stats()
	require.Equal(t, uint64(2), st.Released)
	require.Equal(t, uint64(1), st.Lost)
	require.Zero(t, st.Held)
	require.Zero(t, heldAdvisoryLocks(t, db.Pool))
}
