package otelpgfence

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/pgfence/pgfence"
)

// ScopeName is the instrumentation scope of the meters and tracers an
// [Observer] creates: this package's import path, as OpenTelemetry
// recommends.
const ScopeName = "github.com/pgfence/pgfence/otelpgfence"

// Config configures an [Observer]. A nil *Config is the same as the zero
// Config.
type Config struct {
	// MeterProvider creates the Observer's instruments. Nil means the
	// global provider (otel.GetMeterProvider).
	MeterProvider metric.MeterProvider

	// TracerProvider creates the Observer's spans. Nil means the global
	// provider (otel.GetTracerProvider).
	TracerProvider trace.TracerProvider

	// DisableSpans turns spans off: StartOp returns its ctx unchanged. The
	// metrics, pgfence.operation.duration included, are kept.
	DisableSpans bool
}

// Observer turns pgfence's events into OpenTelemetry metrics and its
// operations into spans. It implements [pgfence.Observer] and
// [pgfence.OpObserver]: set it as the Observer of any number of Lockers
// (leasetable.Config, advisory.Config) and fence guards; call [Observer.Track]
// with each Locker for the held and waiting gauges. Its methods are safe
// for concurrent use. A nil *Observer records nothing: its methods do
// nothing, so a nil one placed in a Config is harmless.
type Observer struct {
	tracer       trace.Tracer
	disableSpans bool
	inst         instruments
	reg          metric.Registration

	attrsMu sync.RWMutex
	attrs   map[string]*strategyAttrs // by strategy; see attrsFor

	mu      sync.Mutex
	sources map[*source]struct{}
	retired map[string]uint64 // EventsDropped of untracked sources, by strategy
	closed  bool
}

var (
	_ pgfence.Observer   = (*Observer)(nil)
	_ pgfence.OpObserver = (*Observer)(nil)
)

// instruments are the Observer's instruments; doc.go lists them.
type instruments struct {
	acquireDuration   metric.Float64Histogram
	acquireAttempts   metric.Int64Histogram
	waitDuration      metric.Float64Histogram
	holdDuration      metric.Float64Histogram
	renewals          metric.Int64Counter
	renewalFailures   metric.Int64Counter
	losses            metric.Int64Counter
	staleWrites       metric.Int64Counter
	noTokenWrites     metric.Int64Counter
	slots             metric.Int64Counter
	serverWarnings    metric.Int64Counter
	slotDuration      metric.Float64Histogram
	listenLost        metric.Int64Counter
	listenRestored    metric.Int64Counter
	listenDown        metric.Float64Histogram
	operationDuration metric.Float64Histogram

	held          metric.Int64ObservableUpDownCounter
	waiting       metric.Int64ObservableUpDownCounter
	listening     metric.Int64ObservableUpDownCounter
	eventsDropped metric.Int64ObservableCounter
}

// Attribute keys of pgfence's own; the others are OpenTelemetry's semantic
// conventions (db.system.name, db.collection.name, db.operation.batch.size,
// db.response.status_code, error.type).
const (
	// StrategyKey is the strategy: leasetable, advisory, leader or fence.
	StrategyKey = attribute.Key("pgfence.lock.strategy")
	// LockNameKey is the lock name (spans only: unbounded cardinality).
	LockNameKey = attribute.Key("pgfence.lock.name")
	// TokenKey is the fencing token of a grant (spans only).
	TokenKey = attribute.Key("pgfence.lock.token")
	// ResultKey is an acquire's result: acquired, not_acquired or error.
	ResultKey = attribute.Key("pgfence.acquire.result")
	// AttemptsKey is the number of times an acquire asked the database
	// (spans only).
	AttemptsKey = attribute.Key("pgfence.acquire.attempts")
	// EndKey is how a hold ended: released or lost.
	EndKey = attribute.Key("pgfence.lock.end")
	// CauseKey is why a lock was lost; see [LossCause].
	CauseKey = attribute.Key("pgfence.loss.cause")
	// OperationKey is an operation's kind: acquire, release, renew or
	// fenced_write ([pgfence.OpKind.String]).
	OperationKey = attribute.Key("pgfence.operation")
	// StatementKey is a fenced write's statement: update, upsert, delete
	// or claim.
	StatementKey = attribute.Key("pgfence.fence.statement")
	// PresentedKey and CurrentKey are the tokens of a stale write (spans
	// only).
	PresentedKey = attribute.Key("pgfence.fence.presented_token")
	CurrentKey   = attribute.Key("pgfence.fence.current_token")
	// ReasonKey is why a server weakens a guarantee (ServerWarning's
	// Reason, e.g. async_standby).
	ReasonKey = attribute.Key("pgfence.server.warning")
	// JobKey is a schedule job's name (package schedule: a few per
	// service, so metrics carry it).
	JobKey = attribute.Key("pgfence.schedule.job")
	// SlotOutcomeKey is what became of a slot: done, failed, skipped or
	// retried.
	SlotOutcomeKey = attribute.Key("pgfence.schedule.outcome")
)

// Results of an acquire (ResultKey) and ends of a hold (EndKey).
const (
	resultAcquired    = "acquired"
	resultNotAcquired = "not_acquired"
	resultError       = "error"
	endReleased       = "released"
	endLost           = "lost"
)

// durationBuckets are the bucket boundaries, in seconds, of the duration
// histograms: a millisecond round trip up to a minute-long wait for a busy
// lock.
var durationBuckets = []float64{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60}

// holdBuckets are the boundaries of pgfence.lock.hold.duration: leases
// are held from milliseconds to hours.
var holdBuckets = []float64{0.01, 0.1, 1, 10, 30, 60, 300, 900, 3600, 14400}

// New returns an Observer whose instruments come from cfg's providers. It
// fails only when the MeterProvider refuses an instrument.
func New(cfg *Config) (*Observer, error) {
	if cfg == nil {
		cfg = &Config{}
	}
	mp := cfg.MeterProvider
	if mp == nil {
		mp = otel.GetMeterProvider()
	}
	tp := cfg.TracerProvider
	if tp == nil {
		tp = otel.GetTracerProvider()
	}
	meter := mp.Meter(ScopeName, metric.WithSchemaURL(semconv.SchemaURL))
	o := &Observer{
		tracer:       tp.Tracer(ScopeName, trace.WithSchemaURL(semconv.SchemaURL)),
		disableSpans: cfg.DisableSpans,
		attrs:        make(map[string]*strategyAttrs),
		sources:      make(map[*source]struct{}),
		retired:      make(map[string]uint64),
	}
	for _, s := range []string{pgfence.StrategyLeaseTable, pgfence.StrategyAdvisory, pgfence.StrategyLeader, pgfence.StrategyFence} {
		o.attrs[s] = newStrategyAttrs(s)
	}
	var err error
	in := &o.inst
	h := func(name, desc, unit string, buckets []float64) metric.Float64Histogram {
		var x metric.Float64Histogram
		if err == nil {
			x, err = meter.Float64Histogram(name, metric.WithDescription(desc), metric.WithUnit(unit), metric.WithExplicitBucketBoundaries(buckets...))
		}
		return x
	}
	c := func(name, desc, unit string) metric.Int64Counter {
		var x metric.Int64Counter
		if err == nil {
			x, err = meter.Int64Counter(name, metric.WithDescription(desc), metric.WithUnit(unit))
		}
		return x
	}
	in.acquireDuration = h("pgfence.lock.acquire.duration", "Duration of acquire calls (TryAcquire, Acquire, Do), waiting included, from the call to its result.", "s", durationBuckets)
	in.waitDuration = h("pgfence.lock.wait.duration", "Duration of acquire calls that waited for another holder: grants after more than one attempt, and calls that ended without the lock by WaitTimeout or their ctx.", "s", durationBuckets)
	in.holdDuration = h("pgfence.lock.hold.duration", "How long locks were held, from the grant to their release or loss.", "s", holdBuckets)
	in.listenDown = h("pgfence.listen.down.duration", "How long a Locker's LISTEN connection was down before it was restored.", "s", durationBuckets)
	in.operationDuration = h("pgfence.operation.duration", "Duration of pgfence's operations on the database: acquire (all attempts), release, one renewal round trip, one fenced write.", "s", durationBuckets)
	if err == nil {
		in.acquireAttempts, err = meter.Int64Histogram("pgfence.lock.acquire.attempts", metric.WithDescription("Number of times an acquire call asked the database."),
			metric.WithUnit("{attempt}"), metric.WithExplicitBucketBoundaries(1, 2, 3, 5, 10, 20, 50, 100))
	}
	in.renewals = c("pgfence.lock.renewals", "Renewals confirmed by the database.", "{renewal}")
	in.renewalFailures = c("pgfence.lock.renewal.failures", "Failed renewal attempts of locks still held (they are retried until the lock's expiry).", "{failure}")
	in.losses = c("pgfence.lock.losses", "Locks lost by their holder, by cause.", "{lock}")
	in.staleWrites = c("pgfence.fence.stale_writes", "Fenced writes rejected because the row carries a newer token.", "{write}")
	in.noTokenWrites = c("pgfence.fence.no_token_writes", "Writes to a strict-guarded table rejected because they presented no fencing token.", "{write}")
	in.serverWarnings = c("pgfence.server.warnings", "Warnings a Locker's New gave about the server: setups that work but weaken a guarantee, such as asynchronous standbys only.", "{warning}")
	in.slots = c("pgfence.schedule.slots", "Schedule slots by outcome: run to done, failed, skipped as already done, or retried after a holder that did not finish.", "{slot}")
	in.slotDuration = h("pgfence.schedule.run.duration", "Duration of schedule slot runs that ended done or failed.", "s", holdBuckets)
	in.listenLost = c("pgfence.listen.lost", "Times a Locker's LISTEN connection failed.", "{event}")
	in.listenRestored = c("pgfence.listen.restored", "Times a Locker's LISTEN connection was restored.", "{event}")
	if err == nil {
		in.held, err = meter.Int64ObservableUpDownCounter("pgfence.lock.held", metric.WithDescription("Locks held now by the tracked Lockers."), metric.WithUnit("{lock}"))
	}
	if err == nil {
		in.waiting, err = meter.Int64ObservableUpDownCounter("pgfence.lock.waiting", metric.WithDescription("Calls waiting now in Acquire or Do on the tracked Lockers."), metric.WithUnit("{call}"))
	}
	if err == nil {
		in.listening, err = meter.Int64ObservableUpDownCounter("pgfence.listen.listening", metric.WithDescription("Tracked Lockers whose LISTEN connection is listening now."), metric.WithUnit("{locker}"))
	}
	if err == nil {
		in.eventsDropped, err = meter.Int64ObservableCounter("pgfence.events.dropped", metric.WithDescription("Background events the tracked Lockers dropped because an Observer was too slow."), metric.WithUnit("{event}"))
	}
	if err == nil {
		o.reg, err = meter.RegisterCallback(o.observeStats, in.held, in.waiting, in.listening, in.eventsDropped)
	}
	if err != nil {
		return nil, errors.Join(errors.New("pgfence: otelpgfence: creating instruments"), err)
	}
	return o, nil
}

// Close unregisters the gauges' callback; the Observer's other metrics
// and spans keep working. It is idempotent.
func (o *Observer) Close() error {
	if o == nil {
		return nil
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.closed {
		return nil
	}
	o.closed = true
	return o.reg.Unregister()
}

// StatsSource is what [Observer.Track] reads: both strategies' Lockers
// (*leasetable.Locker, *advisory.Locker) have a Stats method.
type StatsSource interface {
	Stats() pgfence.Stats
}

type source struct {
	strategy string
	src      StatsSource
}

// Track adds src's Stats to the gauges pgfence.lock.held,
// pgfence.lock.waiting, pgfence.listen.listening and pgfence.events.dropped,
// under the strategy attribute strategy (one of the pgfence Strategy
// constants). Several Lockers of one strategy are summed. Stats is read
// at each collection. The returned function stops tracking src; call it
// before or after closing the Locker (its dropped events stay counted).
func (o *Observer) Track(strategy string, src StatsSource) (untrack func()) {
	if o == nil {
		return func() {}
	}
	s := &source{strategy: strategy, src: src}
	o.mu.Lock()
	o.sources[s] = struct{}{}
	o.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			st := src.Stats()
			o.mu.Lock()
			delete(o.sources, s)
			o.retired[strategy] += st.EventsDropped
			o.mu.Unlock()
		})
	}
}

// observeStats is the gauges' callback.
func (o *Observer) observeStats(_ context.Context, ob metric.Observer) error {
	type sums struct{ held, waiting, listening int64 }
	o.mu.Lock()
	by := make(map[string]*sums, 2)
	dropped := make(map[string]uint64, len(o.retired)+2)
	for s, n := range o.retired {
		dropped[s] = n
	}
	for s := range o.sources {
		st := s.src.Stats()
		x := by[s.strategy]
		if x == nil {
			x = &sums{}
			by[s.strategy] = x
		}
		x.held += int64(st.Held)
		x.waiting += int64(st.Waiting)
		if st.Listening {
			x.listening++
		}
		dropped[s.strategy] += st.EventsDropped
	}
	o.mu.Unlock()
	for s, x := range by {
		opt := o.attrsFor(s).base.obs
		ob.ObserveInt64(o.inst.held, x.held, opt...)
		ob.ObserveInt64(o.inst.waiting, x.waiting, opt...)
		ob.ObserveInt64(o.inst.listening, x.listening, opt...)
	}
	for s, n := range dropped {
		ob.ObserveInt64(o.inst.eventsDropped, int64(n), o.attrsFor(s).base.obs...)
	}
	return nil
}

// strategyAttrs are the attribute sets of one strategy, built once so that
// recording the common events allocates no attributes.
// The options, and the slices passed as the instruments' variadic
// arguments, are built once: made per call, they would allocate.
type strategyAttrs struct {
	base        opts // strategy
	acquired    opts // strategy, result=acquired
	notAcquired opts // strategy, result=not_acquired
	released    opts // strategy, end=released
	ops         [pgfence.OpFencedWrite + 1]opts
	// spanStart are the start options of each kind's spans: kind Internal
	// and db.system.name, strategy, operation.
	spanStart [pgfence.OpFencedWrite + 1][]trace.SpanStartOption
}

// opts is one attribute set as the options of Record, Add and Observe.
type opts struct {
	rec []metric.RecordOption
	add []metric.AddOption
	obs []metric.ObserveOption
}

func newOpts(kvs ...attribute.KeyValue) opts {
	o := metric.WithAttributeSet(attribute.NewSet(kvs...))
	return opts{rec: []metric.RecordOption{o}, add: []metric.AddOption{o}, obs: []metric.ObserveOption{o}}
}

func newStrategyAttrs(strategy string) *strategyAttrs {
	s := StrategyKey.String(strategy)
	a := &strategyAttrs{
		base:        newOpts(s),
		acquired:    newOpts(s, ResultKey.String(resultAcquired)),
		notAcquired: newOpts(s, ResultKey.String(resultNotAcquired)),
		released:    newOpts(s, EndKey.String(endReleased)),
	}
	for k := range a.ops {
		op := OperationKey.String(pgfence.OpKind(k).String())
		a.ops[k] = newOpts(semconv.DBSystemNamePostgreSQL, s, op)
		a.spanStart[k] = []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindInternal),
			trace.WithAttributes(semconv.DBSystemNamePostgreSQL, s, op)}
	}
	return a
}

// attrsFor returns strategy's attribute sets, building them for a strategy
// New did not know.
func (o *Observer) attrsFor(strategy string) *strategyAttrs {
	o.attrsMu.RLock()
	a := o.attrs[strategy]
	o.attrsMu.RUnlock()
	if a != nil {
		return a
	}
	o.attrsMu.Lock()
	defer o.attrsMu.Unlock()
	if a = o.attrs[strategy]; a == nil {
		a = newStrategyAttrs(strategy)
		o.attrs[strategy] = a
	}
	return a
}

// Observe records e in the Observer's metrics and, for events of a
// caller's call made inside an operation this Observer traces, on that
// operation's span.
func (o *Observer) Observe(ctx context.Context, e pgfence.Event) {
	if o == nil {
		return
	}
	a := o.attrsFor(e.Strategy())
	switch e := e.(type) {
	case pgfence.Acquired:
		opt := a.acquired.rec
		o.inst.acquireDuration.Record(ctx, e.Wait.Seconds(), opt...)
		o.inst.acquireAttempts.Record(ctx, int64(e.Attempts), opt...)
		if e.Attempts > 1 {
			o.inst.waitDuration.Record(ctx, e.Wait.Seconds(), opt...)
		}
		if sp := o.opSpan(ctx, pgfence.OpAcquire); sp != nil {
			sp.SetAttributes(ResultKey.String(resultAcquired), TokenKey.Int64(e.Token), AttemptsKey.Int(e.Attempts))
		}
	case pgfence.NotAcquired:
		opt := a.notAcquired.rec
		result := resultNotAcquired
		if !errors.Is(e.Err, pgfence.ErrNotAcquired) {
			result = resultError
			opt = []metric.RecordOption{metric.WithAttributes(StrategyKey.String(e.Kind), ResultKey.String(resultError), errorType(e.Err))}
		}
		o.inst.acquireDuration.Record(ctx, e.Wait.Seconds(), opt...)
		o.inst.acquireAttempts.Record(ctx, int64(e.Attempts), opt...)
		// It waited unless it was a TryAcquire that found the lock held
		// (or failed) at its one attempt: a wait ends by WaitTimeout or ctx.
		if e.Attempts > 1 || errors.Is(e.Err, context.DeadlineExceeded) || errors.Is(e.Err, context.Canceled) {
			o.inst.waitDuration.Record(ctx, e.Wait.Seconds(), opt...)
		}
		if sp := o.opSpan(ctx, pgfence.OpAcquire); sp != nil {
			sp.SetAttributes(ResultKey.String(result), AttemptsKey.Int(e.Attempts))
		}
	case pgfence.Renewed:
		o.inst.renewals.Add(ctx, 1, a.base.add...)
	case pgfence.RenewalFailed:
		o.inst.renewalFailures.Add(ctx, 1, metric.WithAttributes(StrategyKey.String(e.Kind), errorType(e.Err)))
	case pgfence.Lost:
		cause := CauseKey.String(LossCause(e.Cause))
		o.inst.losses.Add(ctx, 1, metric.WithAttributes(StrategyKey.String(e.Kind), cause))
		o.inst.holdDuration.Record(ctx, e.HeldFor.Seconds(), metric.WithAttributes(StrategyKey.String(e.Kind), EndKey.String(endLost), cause))
	case pgfence.Released:
		if e.Err != nil {
			o.inst.holdDuration.Record(ctx, e.HeldFor.Seconds(), metric.WithAttributes(StrategyKey.String(e.Kind), EndKey.String(endReleased), errorType(e.Err)))
			break
		}
		o.inst.holdDuration.Record(ctx, e.HeldFor.Seconds(), a.released.rec...)
	case pgfence.ListenLost:
		o.inst.listenLost.Add(ctx, 1, metric.WithAttributes(StrategyKey.String(e.Kind), errorType(e.Err)))
	case pgfence.ListenRestored:
		o.inst.listenRestored.Add(ctx, 1, a.base.add...)
		o.inst.listenDown.Record(ctx, e.Down.Seconds(), a.base.rec...)
	case pgfence.StaleWrite:
		o.inst.staleWrites.Add(ctx, 1, metric.WithAttributes(StrategyKey.String(pgfence.StrategyFence), semconv.DBCollectionName(collectionName(e.Table))))
		if sp := o.opSpan(ctx, pgfence.OpFencedWrite); sp != nil {
			sp.SetAttributes(PresentedKey.Int64(e.Presented), CurrentKey.Int64(e.Current))
		}
	case pgfence.ServerWarning:
		o.inst.serverWarnings.Add(ctx, 1, metric.WithAttributes(StrategyKey.String(e.Kind), ReasonKey.String(e.Reason)))
	case pgfence.SlotDone:
		o.inst.slots.Add(ctx, 1, metric.WithAttributes(JobKey.String(e.Job), SlotOutcomeKey.String("done")))
		o.inst.slotDuration.Record(ctx, e.Duration.Seconds(), metric.WithAttributes(JobKey.String(e.Job), SlotOutcomeKey.String("done")))
	case pgfence.SlotFailed:
		o.inst.slots.Add(ctx, 1, metric.WithAttributes(JobKey.String(e.Job), SlotOutcomeKey.String("failed"), errorType(e.Err)))
		o.inst.slotDuration.Record(ctx, e.Duration.Seconds(), metric.WithAttributes(JobKey.String(e.Job), SlotOutcomeKey.String("failed")))
	case pgfence.SlotSkipped:
		o.inst.slots.Add(ctx, 1, metric.WithAttributes(JobKey.String(e.Job), SlotOutcomeKey.String("skipped")))
	case pgfence.SlotRetried:
		o.inst.slots.Add(ctx, 1, metric.WithAttributes(JobKey.String(e.Job), SlotOutcomeKey.String("retried")))
	case pgfence.NoTokenWrite:
		o.inst.noTokenWrites.Add(ctx, 1, metric.WithAttributes(StrategyKey.String(pgfence.StrategyFence), semconv.DBCollectionName(collectionName(e.Table))))
		if sp := o.opSpan(ctx, pgfence.OpFencedWrite); sp != nil {
			sp.SetAttributes(CurrentKey.Int64(e.Current))
		}
	}
}

// opKey is the context key of the operation an Observer traces.
type opKey struct{}

// opState is an operation between StartOp and EndOp. It is the ctx
// StartOp returns: its parent with the state as the value of opKey (one
// allocation, where context.WithValue and a state would be two).
type opState struct {
	context.Context
	o     *Observer
	attrs *strategyAttrs
	kind  pgfence.OpKind
	start time.Time
	span  trace.Span // nil with DisableSpans
	ended atomic.Bool
}

// Value returns the state for opKey, else the parent's value.
func (st *opState) Value(key any) any {
	if key == (opKey{}) {
		return st
	}
	return st.Context.Value(key)
}

// opSpan returns the recording span of the operation of kind that ctx is
// inside, or nil: an event's ctx may be a caller's, whose span is not ours
// to annotate, or carry the values of an operation that has ended.
func (o *Observer) opSpan(ctx context.Context, kind pgfence.OpKind) trace.Span {
	st, _ := ctx.Value(opKey{}).(*opState)
	if st == nil || st.o != o || st.kind != kind || st.span == nil || st.ended.Load() || !st.span.IsRecording() {
		return nil
	}
	return st.span
}

// StartOp starts the operation's span, a child of the span in ctx, linked
// to the spans of op.Links (the other callers of a batch), and returns a
// ctx carrying it, which pgfence runs the operation's statements with.
func (o *Observer) StartOp(ctx context.Context, op pgfence.Op) context.Context {
	if o == nil {
		return ctx
	}
	a := o.attrsFor(op.Strategy)
	st := &opState{o: o, attrs: a, kind: op.Kind, start: time.Now()}
	if o.disableSpans {
		st.Context = ctx
		return st
	}
	// The start options are built once per strategy and kind; the
	// attributes of this operation are added only to a span that records
	// (a sampled one), so that an unsampled operation costs little.
	var opts []trace.SpanStartOption
	if k := op.Kind; k >= 0 && int(k) < len(a.spanStart) {
		opts = a.spanStart[k]
	} else {
		opts = []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindInternal),
			trace.WithAttributes(semconv.DBSystemNamePostgreSQL, StrategyKey.String(op.Strategy), OperationKey.String(k.String()))}
	}
	if len(op.Links) > 0 {
		links := make([]trace.Link, 0, len(op.Links))
		for _, l := range op.Links {
			if l == nil {
				continue
			}
			if sc := trace.SpanContextFromContext(l); sc.IsValid() {
				links = append(links, trace.Link{SpanContext: sc})
			}
		}
		opts = append(opts[:len(opts):len(opts)], trace.WithLinks(links...))
	}
	ctx, st.span = o.tracer.Start(ctx, spanName(op.Kind), opts...)
	if st.span.IsRecording() {
		if op.Name != "" {
			st.span.SetAttributes(LockNameKey.String(op.Name))
		}
		if op.Batch > 1 {
			st.span.SetAttributes(semconv.DBOperationBatchSize(op.Batch))
		}
		if op.Table != "" {
			st.span.SetAttributes(semconv.DBCollectionName(collectionName(op.Table)))
		}
		if op.Statement != "" {
			st.span.SetAttributes(StatementKey.String(op.Statement))
		}
	}
	st.Context = ctx
	return st
}

// spanName is "pgfence." and the operation's kind.
func spanName(k pgfence.OpKind) string {
	switch k {
	case pgfence.OpAcquire:
		return "pgfence.acquire"
	case pgfence.OpRelease:
		return "pgfence.release"
	case pgfence.OpRenew:
		return "pgfence.renew"
	case pgfence.OpFencedWrite:
		return "pgfence.fenced_write"
	}
	return "pgfence." + k.String()
}

// EndOp records the operation's duration in pgfence.operation.duration
// and ends its span: with status Error and error.type for a failure, but
// not for a lock that was simply held by another owner.
func (o *Observer) EndOp(ctx context.Context, op pgfence.Op, err error) {
	if o == nil {
		return
	}
	st, _ := ctx.Value(opKey{}).(*opState)
	if st == nil || st.o != o || !st.ended.CompareAndSwap(false, true) {
		return
	}
	d := time.Since(st.start).Seconds()
	var et attribute.KeyValue
	switch k := op.Kind; {
	case err != nil:
		et = errorType(err)
		o.inst.operationDuration.Record(ctx, d, metric.WithAttributes(semconv.DBSystemNamePostgreSQL, StrategyKey.String(op.Strategy), OperationKey.String(k.String()), et))
	case k >= 0 && int(k) < len(st.attrs.ops):
		o.inst.operationDuration.Record(ctx, d, st.attrs.ops[k].rec...)
	default:
		o.inst.operationDuration.Record(ctx, d, metric.WithAttributes(semconv.DBSystemNamePostgreSQL, StrategyKey.String(op.Strategy), OperationKey.String(k.String())))
	}
	if st.span == nil {
		return
	}
	if err != nil {
		st.span.SetAttributes(et)
		var pgErr interface{ SQLState() string }
		if errors.As(err, &pgErr) {
			st.span.SetAttributes(semconv.DBResponseStatusCode(pgErr.SQLState()))
		}
		if !errors.Is(err, pgfence.ErrNotAcquired) {
			st.span.SetStatus(codes.Error, err.Error())
		}
	}
	st.span.End()
}
