// Package otelpgfence builds OpenTelemetry metrics and traces from
// pgfence's typed events and operations. It is a module of its own
// (github.com/pgfence/pgfence/otelpgfence), so that pgfence itself does not
// depend on OpenTelemetry.
//
// # Use
//
// Make one [Observer] with [New] and set it as the Observer of every Locker
// (leasetable.Config.Observer, advisory.Config.Observer) and fence guard;
// call [Observer.Track] with each Locker for the gauges of what is held
// and waiting now:
//
//	obs, err := otelpgfence.New(&otelpgfence.Config{MeterProvider: mp, TracerProvider: tp})
//	locker, err := leasetable.New(ctx, pool, &leasetable.Config{Observer: obs})
//	defer obs.Track(pgfence.StrategyLeaseTable, locker)()
//
// Nil providers mean OpenTelemetry's global ones. With a pgx tracer (such
// as otelpgx) on the pool, the statements pgfence sends become children of
// its operation spans.
//
// # Prometheus
//
// OpenTelemetry's Prometheus exporter (go.opentelemetry.io/otel/exporters/prometheus)
// is a metric reader: give it to the MeterProvider and serve its registry
// with promhttp. examples/prometheus is a complete program that serves
// /metrics. The exporter turns the names below into Prometheus names:
// dots become underscores, the unit "s" adds _seconds, counters add
// _total (pgfence.lock.losses is pgfence_lock_losses_total,
// pgfence.lock.acquire.duration is pgfence_lock_acquire_duration_seconds).
//
// # Metrics
//
// All come from the instrumentation scope [ScopeName]. Attribute values
// are few: lock names and tokens are only on spans.
//
//	name                            instrument           unit       attributes
//	pgfence.lock.acquire.duration   histogram            s          pgfence.lock.strategy, pgfence.acquire.result, error.type
//	pgfence.lock.wait.duration      histogram            s          as above; only calls that waited (see below)
//	pgfence.lock.acquire.attempts   histogram            {attempt}  as above
//	pgfence.lock.hold.duration      histogram            s          pgfence.lock.strategy, pgfence.lock.end, pgfence.loss.cause, error.type
//	pgfence.lock.renewals           counter              {renewal}  pgfence.lock.strategy
//	pgfence.lock.renewal.failures   counter              {failure}  pgfence.lock.strategy, error.type
//	pgfence.lock.losses             counter              {lock}     pgfence.lock.strategy, pgfence.loss.cause
//	pgfence.fence.stale_writes      counter              {write}    pgfence.lock.strategy (fence), db.collection.name
//	pgfence.fence.no_token_writes   counter              {write}    pgfence.lock.strategy (fence), db.collection.name
//	pgfence.server.warnings         counter              {warning}  pgfence.lock.strategy, pgfence.server.warning
//	pgfence.schedule.slots          counter              {slot}     pgfence.schedule.job, pgfence.schedule.outcome, error.type (failed)
//	pgfence.schedule.run.duration   histogram            s          pgfence.schedule.job, pgfence.schedule.outcome (done, failed)
//	pgfence.listen.lost             counter              {event}    pgfence.lock.strategy, error.type
//	pgfence.listen.restored         counter              {event}    pgfence.lock.strategy
//	pgfence.listen.down.duration    histogram            s          pgfence.lock.strategy
//	pgfence.operation.duration      histogram            s          db.system.name, pgfence.lock.strategy, pgfence.operation, error.type
//	pgfence.lock.held               async up-down count  {lock}     pgfence.lock.strategy (tracked Lockers' Stats)
//	pgfence.lock.waiting            async up-down count  {call}     pgfence.lock.strategy (tracked Lockers' Stats)
//	pgfence.listen.listening        async up-down count  {locker}   pgfence.lock.strategy (tracked Lockers' Stats)
//	pgfence.events.dropped          async counter        {event}    pgfence.lock.strategy (tracked Lockers' Stats)
//
// Where the values come from: acquire.duration, wait.duration and
// acquire.attempts from the Acquired and NotAcquired events (Wait,
// Attempts). wait.duration has only the calls that waited for another
// holder: grants after more than one attempt, and calls that ended
// without the lock by WaitTimeout or their ctx (not a TryAcquire that
// found the lock held); its count over acquire.duration's is the share of
// contended acquires; hold.duration from Released and Lost (HeldFor); renewals,
// renewal.failures and losses from Renewed, RenewalFailed and Lost;
// stale_writes from StaleWrite; no_token_writes from NoTokenWrite (a write
// to a strict-guarded table that presented no token: a bug in the writer,
// not a stale holder); server.warnings from ServerWarning (New found, for
// example, only asynchronous standbys); schedule.slots and schedule.run.duration from
// package schedule's SlotDone, SlotFailed, SlotSkipped and SlotRetried;
// the listen metrics from ListenLost and
// ListenRestored; operation.duration from StartOp to EndOp of every
// operation (an acquire with all its attempts, a release with its retries,
// one renewal round trip, one fenced write). The last four are read from
// [pgfence.Stats] at each collection.
//
// Attribute values: pgfence.lock.strategy is leasetable, advisory, leader
// or fence; pgfence.acquire.result is acquired, not_acquired (held by
// another, or WaitTimeout) or error; pgfence.lock.end is released or lost;
// pgfence.loss.cause is one of [LossCause]'s values; pgfence.operation is
// acquire, release, renew or fenced_write; error.type is one of
// [ErrorType]'s values (a SQLSTATE for a database error, as the semantic
// conventions for databases ask).
//
// # Spans
//
// Each operation is a span of kind Internal, a child of the span in the
// operation's ctx: pgfence.acquire (all attempts of a TryAcquire, Acquire
// or Do, waiting included), pgfence.release, pgfence.renew (one round trip;
// a lease table batch links the spans of the other leases' acquiring
// contexts, and carries db.operation.batch.size) and pgfence.fenced_write.
// They carry db.system.name=postgresql, pgfence.lock.strategy,
// pgfence.operation and, where known, pgfence.lock.name,
// db.collection.name (the guarded table) and pgfence.fence.statement. The
// events of the caller's call add pgfence.lock.token,
// pgfence.acquire.result and pgfence.acquire.attempts to an acquire span,
// pgfence.fence.presented_token and pgfence.fence.current_token to a
// rejected write. A failed operation gets error.type,
// db.response.status_code (the SQLSTATE, for a database error) and status
// Error, except an acquire that found the lock held by another owner,
// which is an expected result, not an error.
//
// # Cost
//
// Recording an event uses the attribute sets built for its strategy at
// New: a grant, a renewal or a release allocates nothing. An operation
// allocates its ctx, and its span what the TracerProvider's spans cost
// (DisableSpans keeps the metrics without spans). The gauges cost nothing
// between collections. bench/ measures the whole (scenario 9; see
// bench/results).
package otelpgfence
