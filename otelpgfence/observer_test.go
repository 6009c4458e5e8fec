package otelpgfence_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/pgfence/pgfence"
	"github.com/pgfence/pgfence/fence"
	"github.com/pgfence/pgfence/otelpgfence"
)

type testBundle struct {
	obs    *otelpgfence.Observer
	reader *sdkmetric.ManualReader
	spans  *tracetest.SpanRecorder
	tp     *sdktrace.TracerProvider
}

func setup(t *testing.T, cfg *otelpgfence.Config) *testBundle {
	t.Helper()
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	spans := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	t.Cleanup(func() {
		require.NoError(t, mp.Shutdown(context.Background()))
		require.NoError(t, tp.Shutdown(context.Background()))
	})
	if cfg == nil {
		cfg = &otelpgfence.Config{}
	}
	cfg.MeterProvider, cfg.TracerProvider = mp, tp
	obs, err := otelpgfence.New(cfg)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, obs.Close()) })
	return &testBundle{obs: obs, reader: reader, spans: spans, tp: tp}
}

// collect returns the metrics by name.
func (b *testBundle) collect(t *testing.T) map[string]metricdata.Metrics {
	t.Helper()
	var rm metricdata.ResourceMetrics
	require.NoError(t, b.reader.Collect(context.Background(), &rm))
	out := make(map[string]metricdata.Metrics)
	for _, sm := range rm.ScopeMetrics {
		require.Equal(t, otelpgfence.ScopeName, sm.Scope.Name)
		for _, m := range sm.Metrics {
			out[m.Name] = m
		}
	}
	return out
}

// key renders an attribute set as "k=v,k=v" (sorted by key).
func key(s attribute.Set) string {
	var out string
	for i, kv := range s.ToSlice() {
		if i > 0 {
			out += ","
		}
		out += fmt.Sprintf("%s=%s", kv.Key, kv.Value.Emit())
	}
	return out
}

// sums returns a counter's points by attribute set.
func sums(t *testing.T, m metricdata.Metrics) map[string]int64 {
	t.Helper()
	out := make(map[string]int64)
	switch d := m.Data.(type) {
	case metricdata.Sum[int64]:
		for _, p := range d.DataPoints {
			out[key(p.Attributes)] = p.Value
		}
	case metricdata.Gauge[int64]:
		for _, p := range d.DataPoints {
			out[key(p.Attributes)] = p.Value
		}
	default:
		t.Fatalf("%s: unexpected data %T", m.Name, m.Data)
	}
	return out
}

// counts returns a histogram's point counts and sums by attribute set.
func counts[N int64 | float64](t *testing.T, m metricdata.Metrics) (map[string]uint64, map[string]N) {
	t.Helper()
	d, ok := m.Data.(metricdata.Histogram[N])
	require.True(t, ok, "%s: %T", m.Name, m.Data)
	n, s := make(map[string]uint64), make(map[string]N)
	for _, p := range d.DataPoints {
		n[key(p.Attributes)] = p.Count
		s[key(p.Attributes)] = p.Sum
	}
	return n, s
}

func lock(kind, name string, token int64) pgfence.Lock {
	return pgfence.Lock{Kind: kind, Name: name, Token: token}
}

func TestMetricsFromEvents(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	ctx := context.Background()

	// Negative control: nothing recorded yet, no event metric has points.
	for name, m := range b.collect(t) {
		switch d := m.Data.(type) {
		case metricdata.Histogram[float64]:
			require.Empty(t, d.DataPoints, name)
		case metricdata.Sum[int64]:
			require.Empty(t, d.DataPoints, name)
		}
	}

	lt, adv := pgfence.StrategyLeaseTable, pgfence.StrategyAdvisory
	b.obs.Observe(ctx, pgfence.Acquired{Lock: lock(lt, "a", 1), Wait: 2 * time.Millisecond, Attempts: 1})
	b.obs.Observe(ctx, pgfence.Acquired{Lock: lock(lt, "b", 2), Wait: 300 * time.Millisecond, Attempts: 4})
	b.obs.Observe(ctx, pgfence.NotAcquired{Lock: lock(adv, "c", 0), Wait: time.Second, Attempts: 3, Err: fmt.Errorf("x: %w", pgfence.ErrNotAcquired)})
	b.obs.Observe(ctx, pgfence.NotAcquired{Lock: lock(adv, "c", 0), Wait: time.Second, Attempts: 1,
		Err: fmt.Errorf("%w: %w", pgfence.ErrUnavailable, &pgconn.PgError{Code: "57P01"})})
	b.obs.Observe(ctx, pgfence.Renewed{Lock: lock(lt, "a", 1), Expiry: time.Now()})
	b.obs.Observe(ctx, pgfence.Renewed{Lock: lock(lt, "a", 1), Expiry: time.Now()})
	b.obs.Observe(ctx, pgfence.RenewalFailed{Lock: lock(lt, "a", 1), Attempt: 1, Err: context.DeadlineExceeded})
	b.obs.Observe(ctx, pgfence.Lost{Lock: lock(lt, "a", 1), HeldFor: 40 * time.Second, Cause: fmt.Errorf("%w: %w", pgfence.ErrLeaseLost, pgfence.ErrClosed)})
	b.obs.Observe(ctx, pgfence.Lost{Lock: lock(adv, "d", 5), HeldFor: time.Second, Cause: fmt.Errorf("advisory session ended: %w: %w", pgfence.ErrSessionEnded, &pgconn.PgError{Code: "57P01"})})
	b.obs.Observe(ctx, pgfence.Released{Lock: lock(lt, "b", 2), HeldFor: 3 * time.Second})
	b.obs.Observe(ctx, pgfence.ListenLost{Kind: adv, Err: errors.New("conn reset")})
	b.obs.Observe(ctx, pgfence.ListenRestored{Kind: adv, Down: 1500 * time.Millisecond})
	b.obs.Observe(ctx, pgfence.StaleWrite{Table: "accounts", Presented: 3, Current: 4})

	m := b.collect(t)
	n, s := counts[float64](t, m["pgfence.lock.acquire.duration"])
	require.Equal(t, map[string]uint64{
		"pgfence.acquire.result=acquired,pgfence.lock.strategy=leasetable":                   2,
		"pgfence.acquire.result=not_acquired,pgfence.lock.strategy=advisory":                 1,
		"error.type=unavailable,pgfence.acquire.result=error,pgfence.lock.strategy=advisory": 1,
	}, n)
	require.InDelta(t, 0.302, s["pgfence.acquire.result=acquired,pgfence.lock.strategy=leasetable"], 1e-9)
	require.Equal(t, "s", m["pgfence.lock.acquire.duration"].Unit)

	n, s = counts[float64](t, m["pgfence.lock.wait.duration"])
	require.Equal(t, map[string]uint64{
		"pgfence.acquire.result=acquired,pgfence.lock.strategy=leasetable":   1,
		"pgfence.acquire.result=not_acquired,pgfence.lock.strategy=advisory": 1,
	}, n, "only calls that did not get the lock at the first attempt waited")
	// A wait that ended by WaitTimeout at its first attempt waited too; a
	// TryAcquire that found the lock held did not.
	b.obs.Observe(ctx, pgfence.NotAcquired{Lock: lock(lt, "e", 0), Wait: time.Second, Attempts: 1,
		Err: fmt.Errorf("%w: %w", pgfence.ErrNotAcquired, context.DeadlineExceeded)})
	b.obs.Observe(ctx, pgfence.NotAcquired{Lock: lock(lt, "e", 0), Wait: time.Millisecond, Attempts: 1, Err: pgfence.ErrNotAcquired})
	n, _ = counts[float64](t, b.collect(t)["pgfence.lock.wait.duration"])
	require.Equal(t, uint64(1), n["pgfence.acquire.result=not_acquired,pgfence.lock.strategy=leasetable"])
	require.InDelta(t, 0.3, s["pgfence.acquire.result=acquired,pgfence.lock.strategy=leasetable"], 1e-9)

	an, as := counts[int64](t, m["pgfence.lock.acquire.attempts"])
	require.Equal(t, uint64(2), an["pgfence.acquire.result=acquired,pgfence.lock.strategy=leasetable"])
	require.Equal(t, int64(5), as["pgfence.acquire.result=acquired,pgfence.lock.strategy=leasetable"])

	require.Equal(t, map[string]int64{"pgfence.lock.strategy=leasetable": 2}, sums(t, m["pgfence.lock.renewals"]))
	require.Equal(t, map[string]int64{"error.type=timeout,pgfence.lock.strategy=leasetable": 1}, sums(t, m["pgfence.lock.renewal.failures"]))
	require.Equal(t, map[string]int64{
		"pgfence.lock.strategy=leasetable,pgfence.loss.cause=closed":      1,
		"pgfence.lock.strategy=advisory,pgfence.loss.cause=session_ended": 1,
	}, sums(t, m["pgfence.lock.losses"]))
	hn, _ := counts[float64](t, m["pgfence.lock.hold.duration"])
	require.Equal(t, map[string]uint64{
		"pgfence.lock.end=released,pgfence.lock.strategy=leasetable":                            1,
		"pgfence.lock.end=lost,pgfence.lock.strategy=leasetable,pgfence.loss.cause=closed":      1,
		"pgfence.lock.end=lost,pgfence.lock.strategy=advisory,pgfence.loss.cause=session_ended": 1,
	}, hn)
	require.Equal(t, map[string]int64{"error.type=_OTHER,pgfence.lock.strategy=advisory": 1}, sums(t, m["pgfence.listen.lost"]))
	require.Equal(t, map[string]int64{"pgfence.lock.strategy=advisory": 1}, sums(t, m["pgfence.listen.restored"]))
	_, ds := counts[float64](t, m["pgfence.listen.down.duration"])
	require.InDelta(t, 1.5, ds["pgfence.lock.strategy=advisory"], 1e-9)
	require.Equal(t, map[string]int64{"db.collection.name=accounts,pgfence.lock.strategy=fence": 1}, sums(t, m["pgfence.fence.stale_writes"]))
}

// fakeStats is a StatsSource whose Stats the test sets.
type fakeStats struct {
	mu sync.Mutex
	s  pgfence.Stats
}

func (f *fakeStats) Stats() pgfence.Stats {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.s
}

func (f *fakeStats) set(s pgfence.Stats) {
	f.mu.Lock()
	f.s = s
	f.mu.Unlock()
}

func TestTrackGauges(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	lt1, lt2, adv := &fakeStats{}, &fakeStats{}, &fakeStats{}
	untrack1 := b.obs.Track(pgfence.StrategyLeaseTable, lt1)
	untrack2 := b.obs.Track(pgfence.StrategyLeaseTable, lt2)
	untrackAdv := b.obs.Track(pgfence.StrategyAdvisory, adv)
	defer untrack2()
	defer untrackAdv()

	lt1.set(pgfence.Stats{Held: 2, Waiting: 1, Listening: true, EventsDropped: 3})
	lt2.set(pgfence.Stats{Held: 1, Listening: true})
	adv.set(pgfence.Stats{Waiting: 4})
	m := b.collect(t)
	require.Equal(t, map[string]int64{"pgfence.lock.strategy=leasetable": 3, "pgfence.lock.strategy=advisory": 0}, sums(t, m["pgfence.lock.held"]))
	require.Equal(t, map[string]int64{"pgfence.lock.strategy=leasetable": 1, "pgfence.lock.strategy=advisory": 4}, sums(t, m["pgfence.lock.waiting"]))
	require.Equal(t, map[string]int64{"pgfence.lock.strategy=leasetable": 2, "pgfence.lock.strategy=advisory": 0}, sums(t, m["pgfence.listen.listening"]))
	require.Equal(t, map[string]int64{"pgfence.lock.strategy=leasetable": 3, "pgfence.lock.strategy=advisory": 0}, sums(t, m["pgfence.events.dropped"]))

	// The numbers move with Stats.
	lt1.set(pgfence.Stats{Held: 0, EventsDropped: 5})
	m = b.collect(t)
	require.Equal(t, int64(1), sums(t, m["pgfence.lock.held"])["pgfence.lock.strategy=leasetable"])
	require.Equal(t, int64(1), sums(t, m["pgfence.listen.listening"])["pgfence.lock.strategy=leasetable"])

	// An untracked Locker leaves the gauges; its drops stay counted (the
	// counter never goes down).
	untrack1()
	untrack1() // idempotent
	m = b.collect(t)
	require.Equal(t, int64(1), sums(t, m["pgfence.lock.held"])["pgfence.lock.strategy=leasetable"])
	require.Equal(t, int64(5), sums(t, m["pgfence.events.dropped"])["pgfence.lock.strategy=leasetable"])
}

type ctxKey struct{}

func spanByName(t *testing.T, spans []sdktrace.ReadOnlySpan, name string) sdktrace.ReadOnlySpan {
	t.Helper()
	var found sdktrace.ReadOnlySpan
	for _, s := range spans {
		if s.Name() == name {
			require.Nil(t, found, "one span %s", name)
			found = s
		}
	}
	require.NotNil(t, found, "span %s", name)
	return found
}

func attrs(s sdktrace.ReadOnlySpan) map[attribute.Key]attribute.Value {
	out := make(map[attribute.Key]attribute.Value)
	for _, kv := range s.Attributes() {
		out[kv.Key] = kv.Value
	}
	return out
}

func TestSpans(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	tracer := b.tp.Tracer("test")

	// A request acquires: the acquire span is a child of the request's,
	// the Acquired event (sent with the operation's ctx) annotates it.
	reqCtx, req := tracer.Start(context.WithValue(context.Background(), ctxKey{}, "request-1"), "request")
	acq := pgfence.Op{Kind: pgfence.OpAcquire, Strategy: pgfence.StrategyLeaseTable, Name: "job", Batch: 1}
	opCtx := b.obs.StartOp(reqCtx, acq)
	require.Equal(t, "request-1", opCtx.Value(ctxKey{}), "values are kept")
	b.obs.Observe(opCtx, pgfence.Acquired{Lock: lock(pgfence.StrategyLeaseTable, "job", 42), Wait: time.Millisecond, Attempts: 1})
	// Negative control: an event sent with the caller's own ctx does not
	// touch the caller's span.
	b.obs.Observe(reqCtx, pgfence.Acquired{Lock: lock(pgfence.StrategyLeaseTable, "job", 99), Attempts: 7})
	b.obs.EndOp(opCtx, acq, nil)
	b.obs.EndOp(opCtx, acq, errors.New("second EndOp is ignored"))

	// Another request, served by the same renewal batch.
	otherCtx, other := tracer.Start(context.Background(), "other-request")
	other.End()
	renew := pgfence.Op{Kind: pgfence.OpRenew, Strategy: pgfence.StrategyLeaseTable, Batch: 2, Links: []context.Context{otherCtx, context.Background()}}
	rctx := b.obs.StartOp(reqCtx, renew)
	b.obs.EndOp(rctx, renew, fmt.Errorf("%w: %w", pgfence.ErrUnavailable, &pgconn.PgError{Code: "57P01", Message: "terminating connection"}))

	// A busy TryAcquire is not an error span; a stale fenced write is.
	busy := pgfence.Op{Kind: pgfence.OpAcquire, Strategy: pgfence.StrategyAdvisory, Name: "busy", Batch: 1}
	bctx := b.obs.StartOp(reqCtx, busy)
	b.obs.Observe(bctx, pgfence.NotAcquired{Lock: lock(pgfence.StrategyAdvisory, "busy", 0), Attempts: 1, Err: pgfence.ErrNotAcquired})
	b.obs.EndOp(bctx, busy, pgfence.ErrNotAcquired)
	fw := pgfence.Op{Kind: pgfence.OpFencedWrite, Strategy: pgfence.StrategyFence, Table: "accounts", Statement: "update", Batch: 1}
	fctx := b.obs.StartOp(reqCtx, fw)
	b.obs.Observe(fctx, pgfence.StaleWrite{Table: "accounts", Presented: 3, Current: 4})
	b.obs.EndOp(fctx, fw, &fence.StaleTokenError{Presented: 3, Current: 4})
	req.End()

	spans := b.spans.Ended()
	var a sdktrace.ReadOnlySpan
	for _, s := range spans {
		if s.Name() == "pgfence.acquire" && attrs(s)["pgfence.lock.name"].AsString() == "job" {
			a = s
		}
	}
	require.NotNil(t, a)
	require.Equal(t, req.SpanContext().SpanID(), a.Parent().SpanID())
	got := attrs(a)
	require.Equal(t, "postgresql", got["db.system.name"].AsString())
	require.Equal(t, "leasetable", got["pgfence.lock.strategy"].AsString())
	require.Equal(t, "job", got["pgfence.lock.name"].AsString())
	require.Equal(t, int64(42), got["pgfence.lock.token"].AsInt64())
	require.Equal(t, int64(1), got["pgfence.acquire.attempts"].AsInt64())
	require.Equal(t, codes.Unset, a.Status().Code)
	_, batched := got["db.operation.batch.size"]
	require.False(t, batched, "batch size only for batches")
	require.NotContains(t, attrs(spanByName(t, spans, "request")), attribute.Key("pgfence.lock.token"))

	r := spanByName(t, spans, "pgfence.renew")
	require.Equal(t, req.SpanContext().SpanID(), r.Parent().SpanID(), "the first lease's ctx is the parent")
	require.Len(t, r.Links(), 1, "the other lease is linked; a ctx without a span is not")
	require.Equal(t, other.SpanContext().SpanID(), r.Links()[0].SpanContext.SpanID())
	got = attrs(r)
	require.Equal(t, int64(2), got["db.operation.batch.size"].AsInt64())
	require.Equal(t, "unavailable", got["error.type"].AsString())
	require.Equal(t, "57P01", got["db.response.status_code"].AsString())
	require.Equal(t, codes.Error, r.Status().Code)

	var busySpan sdktrace.ReadOnlySpan
	for _, s := range spans {
		if s.Name() == "pgfence.acquire" && attrs(s)["pgfence.lock.name"].AsString() == "busy" {
			busySpan = s
		}
	}
	require.NotNil(t, busySpan)
	require.Equal(t, codes.Unset, busySpan.Status().Code)
	require.Equal(t, "not_acquired", attrs(busySpan)["error.type"].AsString())
	require.Equal(t, "not_acquired", attrs(busySpan)["pgfence.acquire.result"].AsString())

	f := spanByName(t, spans, "pgfence.fenced_write")
	got = attrs(f)
	require.Equal(t, "accounts", got["db.collection.name"].AsString())
	require.Equal(t, "update", got["pgfence.fence.statement"].AsString())
	require.Equal(t, int64(3), got["pgfence.fence.presented_token"].AsInt64())
	require.Equal(t, int64(4), got["pgfence.fence.current_token"].AsInt64())
	require.Equal(t, "fenced", got["error.type"].AsString())
	require.Equal(t, codes.Error, f.Status().Code)

	// Every operation is in pgfence.operation.duration, by kind and error.
	n, _ := counts[float64](t, b.collect(t)["pgfence.operation.duration"])
	require.Equal(t, map[string]uint64{
		"db.system.name=postgresql,pgfence.lock.strategy=leasetable,pgfence.operation=acquire":                       1,
		"db.system.name=postgresql,error.type=unavailable,pgfence.lock.strategy=leasetable,pgfence.operation=renew":  1,
		"db.system.name=postgresql,error.type=not_acquired,pgfence.lock.strategy=advisory,pgfence.operation=acquire": 1,
		"db.system.name=postgresql,error.type=fenced,pgfence.lock.strategy=fence,pgfence.operation=fenced_write":     1,
	}, n)
}

func TestDisableSpans(t *testing.T) {
	t.Parallel()
	b := setup(t, &otelpgfence.Config{DisableSpans: true})
	op := pgfence.Op{Kind: pgfence.OpRelease, Strategy: pgfence.StrategyAdvisory, Name: "x", Batch: 1}
	ctx := b.obs.StartOp(context.Background(), op)
	b.obs.EndOp(ctx, op, nil)
	require.Empty(t, b.spans.Ended())
	n, _ := counts[float64](t, b.collect(t)["pgfence.operation.duration"])
	require.Equal(t, uint64(1), n["db.system.name=postgresql,pgfence.lock.strategy=advisory,pgfence.operation=release"], "metrics are kept")
}

func TestErrorType(t *testing.T) {
	t.Parallel()
	pgErr := &pgconn.PgError{Code: "40001"}
	for _, tt := range []struct {
		err  error
		want string
	}{
		{nil, ""},
		{pgfence.ErrNotAcquired, "not_acquired"},
		{fmt.Errorf("wait: %w: %w", pgfence.ErrNotAcquired, context.DeadlineExceeded), "not_acquired"},
		{pgfence.ErrAlreadyHeld, "already_held"},
		{fmt.Errorf("%w: %w", pgfence.ErrUnavailable, pgErr), "unavailable"},
		{fmt.Errorf("x: %w", pgfence.ErrClosed), "closed"},
		{&fence.StaleTokenError{Presented: 1, Current: 2}, "fenced"},
		{pgfence.ErrLeaseLost, "lease_lost"},
		{pgfence.ErrNotHeld, "not_held"},
		{context.Canceled, "canceled"},
		{context.DeadlineExceeded, "timeout"},
		{fmt.Errorf("q: %w", pgErr), "40001"},
		{errors.New("something"), "_OTHER"},
	} {
		require.Equal(t, tt.want, otelpgfence.ErrorType(tt.err), "%v", tt.err)
	}
}

func TestLossCause(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		cause error
		want  string
	}{
		{fmt.Errorf("lease %q: %w", "a", pgfence.ErrLeaseExpired), "expired"},
		{fmt.Errorf("lease %q: %w", "a", pgfence.ErrLeaseTakenOver), "taken_over"},
		{fmt.Errorf("session (pid 7): %w: %w", pgfence.ErrSessionEnded, errors.New("EOF")), "session_ended"},
		{fmt.Errorf("%w: %w", pgfence.ErrLeaseLost, pgfence.ErrClosed), "closed"},
		{fmt.Errorf("lock %q held for its MaxHold of 1h: %w", "a", pgfence.ErrMaxHold), "max_hold"},
		{pgfence.ErrLeaseLost, "other"},
		{nil, "other"},
	} {
		require.Equal(t, tt.want, otelpgfence.LossCause(tt.cause), "%v", tt.cause)
	}
}
