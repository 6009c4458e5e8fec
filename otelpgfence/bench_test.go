package otelpgfence_test

import (
	"context"
	"testing"
	"time"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/pgfence/pgfence"
	"github.com/pgfence/pgfence/otelpgfence"
)

// BenchmarkObserve is the Observer's own cost per acquire+release cycle as
// a Locker reports it: StartOp, Acquired, EndOp, then StartOp, Released,
// EndOp, on the SDK's providers (spans recorded, not exported).
func BenchmarkObserve(b *testing.B) {
	for _, spans := range []bool{false, true} {
		name := "metrics"
		if spans {
			name = "metrics+spans"
		}
		b.Run(name, func(b *testing.B) {
			mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))
			tp := sdktrace.NewTracerProvider()
			defer func() { _ = mp.Shutdown(context.Background()); _ = tp.Shutdown(context.Background()) }()
			obs, err := otelpgfence.New(&otelpgfence.Config{MeterProvider: mp, TracerProvider: tp, DisableSpans: !spans})
			if err != nil {
				b.Fatal(err)
			}
			ctx := context.Background()
			acq := pgfence.Op{Kind: pgfence.OpAcquire, Strategy: pgfence.StrategyLeaseTable, Name: "job", Batch: 1}
			rel := pgfence.Op{Kind: pgfence.OpRelease, Strategy: pgfence.StrategyLeaseTable, Name: "job", Batch: 1}
			l := pgfence.Lock{Kind: pgfence.StrategyLeaseTable, Name: "job", Token: 7}
			b.ReportAllocs()
			for b.Loop() {
				c := obs.StartOp(ctx, acq)
				obs.Observe(c, pgfence.Acquired{Lock: l, Wait: time.Millisecond, Attempts: 1})
				obs.EndOp(c, acq, nil)
				c = obs.StartOp(ctx, rel)
				obs.Observe(c, pgfence.Released{Lock: l, HeldFor: time.Second})
				obs.EndOp(c, rel, nil)
			}
		})
	}
}
