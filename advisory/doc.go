// Package advisory provides distributed locks built on PostgreSQL advisory
// locks, with fencing tokens and loss detection.
//
// There are two kinds of lock, and the type of the handle says which:
//
//   - Session locks, taken through a [Locker] ([Locker.TryAcquire],
//     [Locker.Acquire], [Locker.Do] by name; [Locker.TryAcquireKey],
//     [Locker.AcquireKey], [Locker.DoKey] by [Key]), are held by a database
//     session that the Locker owns, until [Lease.Release], [Locker.Close],
//     or the end of that session.
//   - Transaction locks ([Locker.TryAcquireTx], [Locker.AcquireTx], and
//     [Locker.TryAcquireSQLTx], [Locker.AcquireSQLTx] for database/sql) are
//     taken inside the caller's transaction and released when it ends.
//
// Both kinds share one key space per database and draw fencing tokens from
// the sequence that package leasetable uses.
//
//	locker, err := advisory.New(ctx, pool, nil) // nil Config: the defaults
//	defer locker.Close()
//	err = locker.Do(ctx, "account:42", nil, func(ctx context.Context, l pgfence.Lease) error {
//		// ... work that stops when ctx is cancelled; writes guarded by l.Token() ...
//	})
//
// A [Locker] is a [pgfence.Locker] and its handles are [pgfence.Lease]
// values holding a *[Lease]: the verbs, options ([pgfence.AcquireOpts]),
// errors and Do's behaviour are those of package leasetable. What differs:
// an advisory lock has no TTL ([Lease.Expiry] is zero, [Lease.Renew] checks
// its session), it can be shared, and it ends with its session rather than
// at a time.
//
// # Poolers: READ THIS
//
// SESSION LOCKS DO NOT WORK BEHIND A TRANSACTION- OR STATEMENT-POOLING PROXY
// (PgBouncer with pool_mode=transaction or statement, Odyssey, pgcat, RDS
// Proxy, Supavisor in transaction mode). Such a proxy runs each transaction
// on whatever server connection is free, so a lock stays on a connection
// that someone else gets next. Point the pool given to [New] directly at
// PostgreSQL or at a pooler in session mode, or use the transaction locks,
// which work behind any pooler. The Locker checks on every statement that
// its session still runs on the backend where it started, and treats the
// session as lost when not; that catches a pooler only once it moves the
// session. Do not rely on it.
//
// # Keys and tokens
//
// A [Key] is one signed 64-bit integer: [ID] uses a number as given, [Name]
// hashes a string (SHA-256) out of the range golang-migrate locks, and
// [NameKeySQL] computes the same key in SQL.
//
// Every acquisition, session or transaction, exclusive or shared, draws a
// token in the statement that takes the lock, once granted. A holder's
// token is larger than that of every earlier holder of the key, through any
// Locker, transaction or lease, and is durable before it is handed out.
// Present it to package fence so that writes from a holder whose lock was
// lost fail.
//
// # Sessions
//
// A Locker dials up to [Config].MaxSessions connections of its own, with the
// pool's settings, and keeps every session lock on one of them; new keys go
// to the oldest session until it is busy. Calls that meet on one session
// share its statements: the queued releases run in one statement, then the
// queued acquires in another, each caller getting the answer it would get
// alone. Keys are granted in-process first: two goroutines of one Locker
// exclude each other exactly as two processes do.
//
// # Failure model
//
// A session lock lives exactly as long as its database session. It survives
// slow work, idle periods and the caller's cancelled contexts: no statement
// on a lock session runs with a caller's cancellation, and each is bounded
// by [Config].QueryTimeout instead. It does not survive the end of its
// session: a dropped connection, pg_terminate_backend, a server restart or
// failover, a partition, or a statement that timed out. Then every lock on
// that session ends at once: [Lease.Done] closes, [Lease.Context] is
// cancelled and [Lease.Err] matches pgfence.ErrLeaseLost. A lost lock is
// never re-acquired for its holder.
//
// The Locker notices a dead or hung session within
// [Config].SessionCheckInterval + QueryTimeout, and a session the server
// ended within about 50ms. The server, through the TCP settings that lock
// sessions set, drops the session of a client that vanished; [New] rejects
// settings under which it could do so before the holder was told. When the
// server ends a session itself, the lock is free at once and its holder
// learns of it up to SessionCheckInterval + QueryTimeout later. A process
// paused (GC, a stopped VM) keeps running after its lock was lost. So work
// protected by a lock must fence its writes with the token.
//
// A failed unlock cannot be retried (no other session can release the lock):
// the Locker closes the session, whose end releases it, and
// [Lease.Release] returns an error matching pgfence.ErrNotHeld.
//
// # Waiting
//
// A [Locker.Acquire] whose key another session holds waits in the server
// when it can: it parks on an idle session of its Locker in
// pg_advisory_lock, so the holder's release hands the lock over at once. At
// most MaxSessions-1 sessions park; shared locks never do. Otherwise it
// polls, with pauses that double up to [Config].MaxPollInterval, and is
// woken by a NOTIFY on [NotifyChannel] when the key is released in any
// Locker, through an interest lock its LISTEN connection takes (first
// argument [InterestClassID]; [Config].DisableListen turns this off).
// Notifications only hasten a retry, and forged ones are rate-limited. The
// calls of one Locker waiting for a key stand in a line whose head alone
// waits, so a release wakes one call per Locker.
//
// Transient database errors (see [pgfence.ErrUnavailable]) do not end a
// wait: Acquire retries on a new session with capped, jittered backoff for
// as long as ctx and WaitTimeout allow, riding through a restart or
// failover; [Locker.TryAcquire] retries for at most QueryTimeout.
//
// # Events
//
// [Config].Observer receives the events of [pgfence.Observer]: Acquired or
// NotAcquired from every session acquire, on the caller's goroutine;
// Renewed after each successful session check; Lost when a lock's session
// ended or [Locker.Close] dropped it; Released from [Lease.Release]; and
// ListenLost and ListenRestored once per outage of the LISTEN connection.
// RenewalFailed is never sent. With a [pgfence.OpObserver], each acquire,
// release and session check is an operation. Statements carry the values
// of the caller's ctx, for pgx tracers.
//
// # What is not guaranteed
//
//   - Mutual exclusion in real time: a holder can run on after its lock was
//     lost; fencing tokens make its late writes fail.
//   - Fairness or FIFO order among waiters.
//   - Exclusion across databases: advisory locks are per database.
//   - Survival of session locks across a failover or restart.
//   - Detection of transaction pooling.
//
// The reasoning behind these choices is in docs/advisory.md.
package advisory
