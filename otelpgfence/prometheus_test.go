package otelpgfence_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/require"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/pgfence/pgfence"
	"github.com/pgfence/pgfence/fence"
	"github.com/pgfence/pgfence/leasetable"
	"github.com/pgfence/pgfence/otelpgfence"
	"github.com/pgfence/pgfence/schedule"
)

// promBundle is an Observer exporting to a Prometheus registry, served as
// /metrics.
type promBundle struct {
	obs   *otelpgfence.Observer
	reg   *prometheus.Registry
	srv   *httptest.Server
	spans *tracetest.SpanRecorder
}

func setupProm(t *testing.T) *promBundle {
	t.Helper()
	reg := prometheus.NewRegistry()
	exp, err := otelprom.New(otelprom.WithRegisterer(reg))
	require.NoError(t, err)
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(exp))
	spans := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	obs, err := otelpgfence.New(&otelpgfence.Config{MeterProvider: mp, TracerProvider: tp})
	require.NoError(t, err)
	srv := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	t.Cleanup(func() {
		srv.Close()
		require.NoError(t, obs.Close())
		require.NoError(t, mp.Shutdown(context.Background()))
		require.NoError(t, tp.Shutdown(context.Background()))
	})
	return &promBundle{obs: obs, reg: reg, srv: srv, spans: spans}
}

// scrape returns the text of /metrics.
func (b *promBundle) scrape(t *testing.T) string {
	t.Helper()
	resp, err := http.Get(b.srv.URL + "/metrics")
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return string(body)
}

// value returns the value of the Prometheus series family{labels}: a
// counter's or gauge's value, a histogram's count; 0 when there is no such
// series. labels are name=value pairs the series must carry (others may
// be there too).
func (b *promBundle) value(t *testing.T, family string, labels ...string) float64 {
	t.Helper()
	mfs, err := b.reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() != family {
			continue
		}
		var sum float64
		for _, m := range mf.GetMetric() {
			if !hasLabels(m, labels) {
				continue
			}
			switch {
			case m.Counter != nil:
				sum += m.Counter.GetValue()
			case m.Gauge != nil:
				sum += m.Gauge.GetValue()
			case m.Histogram != nil:
				sum += float64(m.Histogram.GetSampleCount())
			}
		}
		return sum
	}
	return 0
}

func hasLabels(m *dto.Metric, labels []string) bool {
	for _, l := range labels {
		name, value, _ := strings.Cut(l, "=")
		found := false
		for _, lp := range m.GetLabel() {
			if lp.GetName() == name && lp.GetValue() == value {
				found = true
			}
		}
		if !found {
			return false
		}
	}
	return true
}

// eventually waits until family{labels} is want: background events
// (renewals, losses) are delivered by the Locker's own goroutine.
func (b *promBundle) eventually(t *testing.T, want float64, family string, labels ...string) {
	t.Helper()
	require.Eventually(t, func() bool { return b.value(t, family, labels...) == want }, 30*time.Second, 5*time.Millisecond,
		"%s%v: want %v, have %v", family, labels, want, b.value(t, family, labels...))
}

const lt = "pgfence_lock_strategy=leasetable"

// TestPrometheusNumbersMove takes, loses and releases real leases on a
// real database and reads the numbers from the Prometheus registry that
// /metrics serves.
func TestPrometheusNumbersMove(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setupProm(t)
	pool := newPool(t, 8)

	locker, err := leasetable.New(ctx, pool, &leasetable.Config{Observer: b.obs, Owner: "a"})
	require.NoError(t, err)
	t.Cleanup(locker.Close)
	t.Cleanup(b.obs.Track(pgfence.StrategyLeaseTable, locker))
	rival, err := leasetable.New(ctx, pool, &leasetable.Config{Observer: b.obs, Owner: "b"})
	require.NoError(t, err)
	t.Cleanup(rival.Close)
	// The control: a Locker without the Observer moves no number.
	unobserved, err := leasetable.New(ctx, pool, &leasetable.Config{Owner: "c"})
	require.NoError(t, err)
	t.Cleanup(unobserved.Close)

	require.Zero(t, b.value(t, "pgfence_lock_held", lt))
	require.Zero(t, b.value(t, "pgfence_lock_acquire_duration_seconds", lt))

	// Taken: held goes up, the acquire is counted.
	job, err := locker.TryAcquire(ctx, "prom-job", nil)
	require.NoError(t, err)
	other, err := unobserved.TryAcquire(ctx, "prom-unobserved", nil)
	require.NoError(t, err)
	require.Equal(t, 1.0, b.value(t, "pgfence_lock_held", lt))
	require.Equal(t, 1.0, b.value(t, "pgfence_lock_acquire_duration_seconds", lt, "pgfence_acquire_result=acquired"))
	require.NoError(t, other.Release(ctx))
	require.Equal(t, 1.0, b.value(t, "pgfence_lock_acquire_duration_seconds", lt), "the unobserved Locker counts nowhere")

	// Contended: the rival's TryAcquire is not acquired.
	_, err = rival.TryAcquire(ctx, "prom-job", nil)
	require.ErrorIs(t, err, pgfence.ErrNotAcquired)
	require.Equal(t, 1.0, b.value(t, "pgfence_lock_acquire_duration_seconds", lt, "pgfence_acquire_result=not_acquired"))
	require.Zero(t, b.value(t, "pgfence_lock_wait_duration_seconds", lt), "a TryAcquire does not wait")

	// Renewed.
	require.NoError(t, job.Renew(ctx))
	b.eventually(t, 1, "pgfence_lock_renewals_total", lt)

	// Lost, leasetable: an operator force-releases the lease; the holder's
	// next renewal finds it taken over.
	_, err = rival.ForceRelease(ctx, "prom-job", "otelpgfence test")
	require.NoError(t, err)
	require.ErrorIs(t, job.Renew(ctx), pgfence.ErrLeaseLost)
	b.eventually(t, 1, "pgfence_lock_losses_total", lt, "pgfence_loss_cause=taken_over")
	b.eventually(t, 0, "pgfence_lock_held", lt)
	require.Equal(t, 1.0, b.value(t, "pgfence_lock_hold_duration_seconds", lt, "pgfence_lock_end=lost"))

	// Released: the hold ends as released.
	again, err := locker.TryAcquire(ctx, "prom-job-2", nil)
	require.NoError(t, err)
	require.NoError(t, again.Release(ctx))
	require.Equal(t, 1.0, b.value(t, "pgfence_lock_hold_duration_seconds", lt, "pgfence_lock_end=released"))

	// Every operation was timed; the text /metrics serves has the families.
	require.Positive(t, b.value(t, "pgfence_operation_duration_seconds", "pgfence_operation=acquire"))
	require.Positive(t, b.value(t, "pgfence_operation_duration_seconds", "pgfence_operation=renew"))
	text := b.scrape(t)
	for _, family := range []string{"pgfence_lock_held", "pgfence_lock_waiting", "pgfence_lock_losses_total",
		"pgfence_lock_acquire_duration_seconds_bucket", "pgfence_lock_hold_duration_seconds_bucket",
		"pgfence_lock_renewals_total", "pgfence_operation_duration_seconds_bucket"} {
		require.Contains(t, text, "\n"+family+"{", family)
	}

	// Spans: the acquire of the lost lease, with its token.
	var found bool
	for _, s := range b.spans.Ended() {
		for _, kv := range s.Attributes() {
			if s.Name() == "pgfence.acquire" && kv.Key == otelpgfence.TokenKey && kv.Value.AsInt64() == job.Token() {
				found = true
			}
		}
	}
	require.True(t, found, "a pgfence.acquire span carries the lost lease's token")
}

// TestPrometheusWaiting: a call waiting in Acquire is in
// pgfence_lock_waiting while it waits, and its wait is in
// pgfence_lock_wait_duration_seconds once it gave up.
func TestPrometheusWaiting(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setupProm(t)
	pool := newPool(t, 8)
	holder, err := leasetable.New(ctx, pool, &leasetable.Config{Observer: b.obs, Owner: "holder"})
	require.NoError(t, err)
	t.Cleanup(holder.Close)
	waiter, err := leasetable.New(ctx, pool, &leasetable.Config{Observer: b.obs, Owner: "waiter"})
	require.NoError(t, err)
	t.Cleanup(waiter.Close)
	t.Cleanup(b.obs.Track(pgfence.StrategyLeaseTable, holder))
	t.Cleanup(b.obs.Track(pgfence.StrategyLeaseTable, waiter))

	held, err := holder.TryAcquire(ctx, "prom-wait", nil)
	require.NoError(t, err)
	defer func() { require.NoError(t, held.Release(ctx)) }()
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	got := make(chan error, 1)
	go func() {
		_, err := waiter.Acquire(wctx, "prom-wait", nil)
		got <- err
	}()
	b.eventually(t, 1, "pgfence_lock_waiting", lt)
	require.Zero(t, b.value(t, "pgfence_lock_wait_duration_seconds", lt))
	cancel() // the waiter gives up
	select {
	case err := <-got:
		require.ErrorIs(t, err, context.Canceled)
	case <-time.After(30 * time.Second):
		t.Fatal(errors.New("the waiter did not return"))
	}
	require.Equal(t, 0.0, b.value(t, "pgfence_lock_waiting", lt))
	require.Equal(t, 1.0, b.value(t, "pgfence_lock_wait_duration_seconds", lt, "pgfence_acquire_result=error", "error_type=canceled"))
}

// TestPrometheusLossExpired: renewals that cannot get through (the lease's
// row is locked by another transaction) end the lease at its local
// deadline, a loss with cause expired.
func TestPrometheusLossExpired(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setupProm(t)
	pool := newPool(t, 8)
	locker, err := leasetable.New(ctx, pool, &leasetable.Config{Observer: b.obs, Owner: "slow", TTL: time.Second,
		QueryTimeout: 200 * time.Millisecond})
	require.NoError(t, err)
	t.Cleanup(locker.Close)
	l, err := locker.TryAcquire(ctx, "prom-expire", nil)
	require.NoError(t, err)

	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = tx.Exec(ctx, "SELECT 1 FROM pgfence.pgfence_leases WHERE name = 'prom-expire' FOR UPDATE")
	require.NoError(t, err)

	select {
	case <-l.Done():
	case <-time.After(30 * time.Second):
		t.Fatal("the lease did not end at its local deadline")
	}
	require.ErrorIs(t, l.Err(), pgfence.ErrLeaseExpired)
	b.eventually(t, 1, "pgfence_lock_losses_total", lt, "pgfence_loss_cause=expired")
	require.Zero(t, b.value(t, "pgfence_lock_losses_total", lt, "pgfence_loss_cause=taken_over"))
}

// TestPrometheusStaleWrite: a fenced write rejected as stale is counted,
// one that is not is only timed.
func TestPrometheusStaleWrite(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setupProm(t)
	pool := newPool(t, 4)
	_, err := pool.Exec(ctx, `CREATE TABLE prom_accounts (id int PRIMARY KEY, balance bigint NOT NULL, fence_token bigint NOT NULL DEFAULT 0);
		INSERT INTO prom_accounts (id, balance) VALUES (1, 0)`)
	require.NoError(t, err)
	var older, newer int64
	require.NoError(t, pool.QueryRow(ctx, "SELECT pgfence.pgfence_next_token(), pgfence.pgfence_next_token()").Scan(&older, &newer))

	write := fence.Update("prom_accounts").Set("balance = balance + $1").Where("id = $2").Observer(b.obs)
	_, err = write.Exec(ctx, pool, newer, 1, 1)
	require.NoError(t, err)
	require.Zero(t, b.value(t, "pgfence_fence_stale_writes_total"))
	_, err = write.Exec(ctx, pool, older, 1, 1)
	require.ErrorIs(t, err, pgfence.ErrFenced)
	require.Equal(t, 1.0, b.value(t, "pgfence_fence_stale_writes_total", "pgfence_lock_strategy=fence", "db_collection_name=prom_accounts"))
	require.Equal(t, 2.0, b.value(t, "pgfence_operation_duration_seconds", "pgfence_operation=fenced_write"))
	require.Equal(t, 1.0, b.value(t, "pgfence_operation_duration_seconds", "pgfence_operation=fenced_write", "error_type=fenced"))
}

// TestPrometheusNoTokenWrite: a write to a strict-guarded table that
// presents no token is counted as no_token_writes and typed "no_token",
// not as a stale write; the same write after Present counts nothing.
func TestPrometheusNoTokenWrite(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setupProm(t)
	pool := newPool(t, 4)
	_, err := pool.Exec(ctx, `CREATE TABLE prom_strict (id int PRIMARY KEY, balance bigint NOT NULL, fence_token bigint NOT NULL DEFAULT 0);
		INSERT INTO prom_strict (id, balance) VALUES (1, 0);
		SELECT pgfence.pgfence_protect('prom_strict', 'fence_token', true)`)
	require.NoError(t, err)

	// A plain UPDATE presents nothing: the strict guard refuses it as such.
	_, err = pool.Exec(ctx, "UPDATE prom_strict SET balance = balance + 1 WHERE id = 1")
	err = fence.Classify(err)
	require.ErrorIs(t, err, pgfence.ErrNoToken)
	require.NotErrorIs(t, err, pgfence.ErrFenced)
	require.Equal(t, "no_token", otelpgfence.ErrorType(err))

	var none *fence.NoTokenError
	require.ErrorAs(t, err, &none)
	b.obs.Observe(ctx, pgfence.NoTokenWrite{Table: "prom_strict", Current: none.Current}) // as a builder reports it
	require.Equal(t, 1.0, b.value(t, "pgfence_fence_no_token_writes_total", "pgfence_lock_strategy=fence", `db_collection_name=prom_strict`))
	require.Zero(t, b.value(t, "pgfence_fence_stale_writes_total"))

	// The control: presented, the write passes and nothing is counted.
	var token int64
	require.NoError(t, pool.QueryRow(ctx, "SELECT pgfence.pgfence_next_token()").Scan(&token))
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	require.NoError(t, fence.Present(ctx, tx, token))
	_, err = fence.Update("prom_strict").Set("balance = balance + $1").Where("id = $2").Observer(b.obs).Exec(ctx, tx, token, 1, 1)
	require.NoError(t, err)
	require.NoError(t, tx.Commit(ctx))
	require.Equal(t, 1.0, b.value(t, "pgfence_fence_no_token_writes_total", "pgfence_lock_strategy=fence", `db_collection_name=prom_strict`))
}

// TestPrometheusScheduleSlots: package schedule's outcomes are counted per
// job: a slot run to done, the same slot skipped, a failed one (with its
// error type) and its retry run to done; runs are timed.
func TestPrometheusScheduleSlots(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setupProm(t)
	pool := newPool(t, 4)
	lk, err := leasetable.New(ctx, pool, &leasetable.Config{TTL: 5 * time.Second})
	require.NoError(t, err)
	t.Cleanup(func() { lk.Close() })
	r, err := schedule.New(pool, &schedule.Config{Locker: lk, Observer: b.obs})
	require.NoError(t, err)
	ok := func(context.Context, *schedule.Slot) error { return nil }

	require.NoError(t, r.Run(ctx, "report", "2026-12-03", nil, ok))
	require.ErrorIs(t, r.Run(ctx, "report", "2026-12-03", nil, ok), schedule.ErrSlotDone)
	boom := errors.New("boom")
	require.ErrorIs(t, r.Run(ctx, "report", "2026-12-04", nil, func(context.Context, *schedule.Slot) error { return boom }), boom)
	require.NoError(t, r.Run(ctx, "report", "2026-12-04", nil, ok))

	job := "pgfence_schedule_job=report"
	require.Equal(t, 2.0, b.value(t, "pgfence_schedule_slots_total", job, "pgfence_schedule_outcome=done"))
	require.Equal(t, 1.0, b.value(t, "pgfence_schedule_slots_total", job, "pgfence_schedule_outcome=skipped"))
	require.Equal(t, 1.0, b.value(t, "pgfence_schedule_slots_total", job, "pgfence_schedule_outcome=failed", "error_type=_OTHER"))
	require.Equal(t, 1.0, b.value(t, "pgfence_schedule_slots_total", job, "pgfence_schedule_outcome=retried"))
	require.Equal(t, 3.0, b.value(t, "pgfence_schedule_run_duration_seconds", job))
}

// TestPrometheusServerWarning: a warning from New about the server is
// counted by strategy and reason; other events leave it at zero.
func TestPrometheusServerWarning(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setupProm(t)
	b.obs.Observe(ctx, pgfence.Renewed{Lock: pgfence.Lock{Kind: pgfence.StrategyLeaseTable, Name: "x"}})
	require.Zero(t, b.value(t, "pgfence_server_warnings_total"))
	b.obs.Observe(ctx, pgfence.ServerWarning{Kind: pgfence.StrategyLeaseTable, Reason: "async_standby", Detail: "2 asynchronous standbys, none synchronous"})
	require.Equal(t, 1.0, b.value(t, "pgfence_server_warnings_total", "pgfence_lock_strategy=leasetable", "pgfence_server_warning=async_standby"))
}
