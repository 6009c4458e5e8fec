// Command prometheus serves pgfence's metrics at /metrics through
// OpenTelemetry's Prometheus exporter, while a lease table Locker and an
// advisory Locker take and release locks, and one lease is lost (an
// operator force-releases it), so that every number moves.
//
//	go run ./examples/prometheus -database "$DATABASE_URL"
//	curl -s localhost:9464/metrics | grep '^pgfence_'
//
// It applies pgfence's migrations to the database first. With -for it stops
// after that long and prints /metrics as it is then.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/pgfence/pgfence"
	"github.com/pgfence/pgfence/advisory"
	"github.com/pgfence/pgfence/leasetable"
	"github.com/pgfence/pgfence/migrations"
	"github.com/pgfence/pgfence/otelpgfence"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:9464", "address to serve /metrics on")
	database := flag.String("database", os.Getenv("DATABASE_URL"), "PostgreSQL URL (default $DATABASE_URL); pgfence's migrations are applied to it")
	runFor := flag.Duration("for", 0, "stop after this long and print /metrics (0: serve until SIGINT or SIGTERM)")
	flag.Parse()
	if *database == "" {
		log.Fatal("no database: pass -database or set DATABASE_URL")
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if *runFor > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, *runFor)
		defer cancel()
	}
	if err := run(ctx, *addr, *database, *runFor > 0); err != nil {
		log.Fatal(err)
	}
}

func run(ctx context.Context, addr, database string, dump bool) error {
	// The Prometheus exporter is a metric reader of the MeterProvider; its
	// registry is what /metrics serves.
	reg := prometheus.NewRegistry()
	exporter, err := otelprom.New(otelprom.WithRegisterer(reg))
	if err != nil {
		return err
	}
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(exporter))
	defer func() { _ = mp.Shutdown(context.Background()) }()
	obs, err := otelpgfence.New(&otelpgfence.Config{MeterProvider: mp})
	if err != nil {
		return err
	}
	defer obs.Close()

	if err := migrations.Up(ctx, migrations.Target{URL: database}, nil); err != nil {
		return err
	}
	pool, err := pgxpool.New(ctx, database)
	if err != nil {
		return err
	}
	defer pool.Close()
	leases, err := leasetable.New(ctx, pool, &leasetable.Config{Observer: obs, Owner: "example"})
	if err != nil {
		return err
	}
	defer leases.Close()
	defer obs.Track(pgfence.StrategyLeaseTable, leases)()
	locks, err := advisory.New(ctx, pool, &advisory.Config{Observer: obs})
	if err != nil {
		return err
	}
	defer locks.Close()
	defer obs.Track(pgfence.StrategyAdvisory, locks)()

	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	defer srv.Close()
	fmt.Fprintf(os.Stderr, "serving http://%s/metrics\n", ln.Addr())

	if err := loseOne(ctx, leases); err != nil {
		return err
	}
	work(ctx, leases, locks)

	if dump {
		return printMetrics(ln.Addr().String())
	}
	return nil
}

// loseOne takes a lease, has it force-released as an operator would, and
// lets the holder find out: one loss with cause taken_over.
func loseOne(ctx context.Context, leases *leasetable.Locker) error {
	l, err := leases.TryAcquire(ctx, "example-lost", nil)
	if err != nil {
		return err
	}
	if _, err := leases.ForceRelease(ctx, "example-lost", "otelpgfence example"); err != nil {
		return err
	}
	if err := l.Renew(ctx); !errors.Is(err, pgfence.ErrLeaseLost) {
		return fmt.Errorf("the force-released lease was not lost: %v", err)
	}
	return nil
}

// work takes and releases a lock of each strategy every 200ms until ctx
// ends; every fifth round a second caller finds the lease busy.
func work(ctx context.Context, leases *leasetable.Locker, locks *advisory.Locker) {
	t := time.NewTicker(200 * time.Millisecond)
	defer t.Stop()
	for i := 0; ctx.Err() == nil; i++ {
		// A round runs to its end when ctx ends during it.
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		for _, k := range []pgfence.Locker{leases, locks} {
			l, err := k.TryAcquire(rctx, "example-job", nil)
			if err != nil {
				continue
			}
			if i%5 == 0 {
				_, _ = k.TryAcquire(rctx, "example-job", nil) // busy: not acquired
			}
			_ = l.Release(rctx)
		}
		cancel()
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// printMetrics prints pgfence's series from /metrics.
func printMetrics(addr string) error {
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	for _, line := range strings.Split(string(body), "\n") {
		if strings.Contains(line, "pgfence_") {
			fmt.Println(line)
		}
	}
	return nil
}
