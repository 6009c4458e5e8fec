package otelpgfence_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/pgfence/pgfence"
	"github.com/pgfence/pgfence/leasetable"
	"github.com/pgfence/pgfence/otelpgfence"
)

// The Prometheus path: OpenTelemetry's Prometheus exporter reads the
// Observer's metrics, promhttp serves them as /metrics. A lease is taken,
// then force-released by an operator, and its holder finds it lost.
func Example_prometheus() {
	ctx := context.Background()
	pool, closePool := examplePool() // a pool on a database with pgfence's migrations applied
	defer closePool()

	reg := prometheus.NewRegistry()
	exporter, err := otelprom.New(otelprom.WithRegisterer(reg), otelprom.WithoutScopeInfo(), otelprom.WithoutTargetInfo())
	must(err)
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(exporter))
	defer mp.Shutdown(ctx)
	obs, err := otelpgfence.New(&otelpgfence.Config{MeterProvider: mp})
	must(err)
	defer obs.Close()

	locker, err := leasetable.New(ctx, pool, &leasetable.Config{Observer: obs})
	must(err)
	defer locker.Close()
	defer obs.Track(pgfence.StrategyLeaseTable, locker)()

	srv := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	defer srv.Close()
	scrape := func() string {
		resp, err := http.Get(srv.URL + "/metrics")
		must(err)
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		must(err)
		return string(body)
	}
	show := func(when string) {
		fmt.Println(when + ":")
		for _, line := range strings.Split(scrape(), "\n") {
			if strings.HasPrefix(line, "pgfence_lock_held") || strings.HasPrefix(line, "pgfence_lock_losses_total") ||
				strings.HasPrefix(line, "pgfence_lock_acquire_duration_seconds_count") {
				fmt.Println(" ", line)
			}
		}
	}

	lease, err := locker.TryAcquire(ctx, "example-report", nil)
	must(err)
	show("held")

	_, err = locker.ForceRelease(ctx, "example-report", "example")
	must(err)
	fmt.Println("renew finds it lost:", errors.Is(lease.Renew(ctx), pgfence.ErrLeaseLost))
	// The Lost event comes from the Locker's own goroutine, just after.
	for !strings.Contains(scrape(), "pgfence_lock_losses_total") {
		time.Sleep(time.Millisecond)
	}
	show("lost")
	// Output:
	// held:
	//   pgfence_lock_acquire_duration_seconds_count{pgfence_acquire_result="acquired",pgfence_lock_strategy="leasetable"} 1
	//   pgfence_lock_held{pgfence_lock_strategy="leasetable"} 1
	// renew finds it lost: true
	// lost:
	//   pgfence_lock_acquire_duration_seconds_count{pgfence_acquire_result="acquired",pgfence_lock_strategy="leasetable"} 1
	//   pgfence_lock_held{pgfence_lock_strategy="leasetable"} 0
	//   pgfence_lock_losses_total{pgfence_lock_strategy="leasetable",pgfence_loss_cause="taken_over"} 1
}
