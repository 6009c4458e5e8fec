// Package advisory provides distributed locks built on PostgreSQL advisory
// locks, with fencing tokens and loss detection.
//
// There are two kinds of lock, and the type of the handle says which:
//
//   - Session locks, taken through a [Locker] ([Locker.TryAcquire],
//     [Locker.Acquire], [Locker.Do] by name; [Locker.TryAcquireKey],
//     [Locker.AcquireKey], [Locker.DoKey] by [Key]), are held by a database
//     session (a connection) that the Locker owns, until [Lease.Release],
//     [Locker.Close], or the death of that session.
//   - Transaction locks ([Locker.TryAcquireTx], [Locker.AcquireTx]) are
//     taken inside the caller's pgx.Tx and released by PostgreSQL when it
//     commits or rolls back. There is nothing to release and nothing to
//     watch. [Locker.TryAcquireSQLTx] and [Locker.AcquireSQLTx] are the
//     same for a database/sql *sql.Tx on pgx's stdlib driver.
//
// Both kinds share one key space per database (pg_advisory_lock(bigint) and
// pg_advisory_xact_lock(bigint) conflict with each other), and both hand out
// fencing tokens from the sequence that package leasetable uses.
//
//	locker, err := advisory.New(ctx, pool, nil) // nil Config: the defaults
//	defer locker.Close()
//	err = locker.Do(ctx, "account:42", nil, func(ctx context.Context, l pgfence.Lease) error {
//		// ... work that stops when ctx is cancelled; writes guarded by l.Token() ...
//	})
//
// A [Locker] is a [pgfence.Locker] and its handles are [pgfence.Lease]
// values holding a *[Lease], as in package leasetable: the verbs, options
// ([pgfence.AcquireOpts]), errors and Do's behaviour are the same, and the
// shared contract tests run against both. What differs is what the
// strategies are: an advisory lock has no TTL (TTL and AtLeast are
// rejected; [Lease.Expiry] is zero and [Lease.Renew] checks its session),
// it can be shared ([pgfence.AcquireOpts].Shared), and it is lost when its
// session dies rather than when a time passes. Tokens are drawn from the
// sequence of [Config].Schema through pgfence_next_token and
// pgfence_next_tokens, SECURITY DEFINER functions; every statement names
// pg_catalog for the built-ins it calls.
//
// # PgBouncer and other poolers: READ THIS
//
// SESSION LOCKS DO NOT WORK BEHIND A TRANSACTION- OR STATEMENT-POOLING PROXY
// (PgBouncer with pool_mode=transaction or pool_mode=statement, Odyssey,
// pgcat, RDS Proxy, Supavisor in transaction mode, ...). Such a proxy runs
// each transaction on whatever server connection is free: a lock taken by
// one statement stays on a server connection that the next statement, or
// another client, gets. The lock then belongs to nobody you know, is never
// released, and Release runs on a connection that does not hold it.
//
// Point the pool you give to [New] directly at PostgreSQL, or at a pooler in
// session mode (pool_mode=session), or use [Locker.TryAcquireTx]/[Locker.AcquireTx], which work
// behind any pooler because the lock lives exactly as long as the
// transaction. (Behind PgBouncer, pgx's default statement cache also needs
// PgBouncer 1.21 or later with max_prepared_statements set, or a pool with
// a QueryExecMode that does not prepare statements; that is between pgx and
// the pooler.)
//
// The Locker checks, best effort, on every statement of a lock session
// (lock, unlock, liveness check) that it still runs on the backend where
// the session started (pg_backend_pid). When the backend changed, the
// session is treated as lost, with an error that names the likely cause.
// This catches a transaction pooler only once it actually moves the session;
// a pooler that happens to keep giving the same backend is not detected, and
// neither is one that does not forward pg_backend_pid faithfully. Do not rely
// on the check: configure the connection correctly.
//
// # Keys
//
// A [Key] is one signed 64-bit integer. [ID] uses a number as given. [Name]
// hashes a string: the first 8 bytes of its SHA-256 digest, read as a
// big-endian signed integer, moved out of [0, 2^32) by setting bit 62 when
// its upper half is zero, so it never meets golang-migrate's lock (which
// uses keys in that range). [NameKeySQL] computes the same key in SQL. Two
// names collide with a chance of about n²/2^65 among n names; a collision
// only makes the two names exclude each other.
//
// # Fencing tokens
//
// Every acquisition, session or transaction, exclusive or shared, draws a
// token with pgfence_next_token() (a SECURITY DEFINER function of
// [Config].Schema) in the same statement as the lock, and only once the
// lock is granted:
//
//	SELECT CASE WHEN pg_catalog.pg_try_advisory_lock($1) THEN "pgfence".pgfence_next_token() END
//
// When one statement takes the locks of several callers (see Sessions),
// it tries every lock first and then draws the tokens of those granted
// with one call of pgfence_next_tokens (migration 000009), in the callers'
// order; on a schema before 000009, or for a role not granted it, it calls
// pgfence_next_token for each grant instead ([New] finds out which). From
// migration 000010 the call hands out consecutive tokens from one sequence
// value per 1024 grants (the sequence steps by 1024), so a statement's
// tokens share one value and one WAL record, and combined statements wait
// for a WAL flush about once in 32 statements rather than once in 32
// grants.
//
// So a holder's token is larger than the token of every holder of the same
// key before it (whose lock ended before this grant), through any Locker,
// transaction or lease. The draw makes the statement's commit wait for the
// WAL flush that makes the token durable (unless that WAL is flushed
// already; see the root package's documentation), so no token is handed
// out twice after a server crash.
// Shared holders each get their own token. Use the token with package fence
// so that protected rows reject writes from a holder whose lock was lost.
//
// # Sessions
//
// A Locker dials up to [Config.MaxSessions] connections of its own, with the
// pool's connection settings, and keeps every session lock on one of them:
// ten thousand locks need no more connections than that. New keys go to the
// oldest session until 32 acquisitions are in flight on it, and only then
// to another, so a Locker with fewer concurrent callers than that uses one
// connection: the callers of one session share its statements and WAL
// flushes (below), which several sessions would each make for themselves.
// The price is that the loss of that session (see Loss detection) ends
// every lock of those callers at once, not a share of them; each holder is
// told, as for any loss. The sessions never go back to a pool; one that holds no lock for
// [Config.SessionIdleTimeout] is closed, and [Locker.Close] closes the
// rest.
//
// PostgreSQL advisory locks are re-entrant within a session: the server
// would grant a key again to the same session. The Locker therefore grants
// keys in-process first: at most one exclusive holder per key, or any
// number of shared holders (which then share one session). Two goroutines
// of one Locker exclude each other exactly as two processes do.
//
// Calls that meet on one session share its round trips: the unlocks queued
// while the session is busy are answered by one statement, and then the
// lock requests, with those made meanwhile, by another (at most one
// transaction id and one WAL flush for all their tokens, and usually none:
// a draw waits for the disk only when the WAL that covers its token is not
// flushed yet, about once per 32 tokens). A Release returns once its
// unlock ran, without waiting for the flush of the grants after it. Each
// caller gets the outcome it would get alone; when the combined statement
// fails on a live session, each request is run again alone, and when the
// session dies, every caller of the batch fails with it (transiently, so
// Acquire retries on a new session).
//
// Sharing trades latency for work: a request that arrives while its
// session is busy waits for the statements the session runs before it
// (the turn in progress, and for a lock request the unlocks of the next
// turn, which go first) before its own is sent, where a connection of its
// own would send it at once, while the server runs one statement for many
// grants. The benchmark (bench/, scenario 10) measures both sides against
// raw advisory locks, on loopback and with a delay on every statement as
// over a network.
//
// # Loss detection
//
// A session lock is lost when its session ends: the connection dropped, an
// operator ran pg_terminate_backend, the server restarted or failed over,
// the network partitioned, or a statement on the session timed out. Then
// every lock on that session ends at once: [Lease.Done] closes,
// [Lease.Context] is cancelled with a cause matching pgfence.ErrLeaseLost,
// and [Lease.Err] returns it. The Locker never re-acquires a lost lock: a
// caller that wants it again must ask, and gets a new token.
//
// The Locker learns of a loss from its watchdog, which checks each idle
// session every [Config.SessionCheckInterval] with a statement bounded by
// [Config.QueryTimeout] (a session in use is checked by the statement in
// progress, bounded the same way). A dead or hung session is noticed at most
// SessionCheckInterval + QueryTimeout (4s with the defaults) after it stopped
// answering. Between checks, every 50ms, the watchdog also looks, without a
// round trip, whether an idle session's socket has anything to read: the
// server sends an idle lock session nothing unless it is ending it (a
// FATAL error, then the close), so a session the server ended is noticed
// within about 50ms, and checked at once (on platforms without poll(2),
// and for connections from a custom DialFunc that hide their socket, only
// the checks run). When the session is only hung (the server or the network
// stalled, the connection still open), the holders are told before the
// connection is closed, so before the server can release the locks.
//
// In the other direction, the server must release the locks of a client
// that vanished without closing its connection (crash of the host, network
// partition). Lock sessions set tcp_keepalives_idle, tcp_keepalives_interval,
// tcp_keepalives_count and tcp_user_timeout on the server; with the defaults
// the server drops such a session, and releases its locks, between about 10
// and 11 seconds after the client went silent (tcp_user_timeout 10s when
// the server has unacknowledged data; otherwise keepalives: 5s idle, then
// 3 probes 2s apart). [New] rejects settings under which a partitioned
// holder would not learn of the loss before the server frees the lock.
//
// The order is not guaranteed when the server ends the session itself
// (pg_terminate_backend, a restart, a failover): the lock is free for others
// at once, and the old holder learns of it up to SessionCheckInterval +
// QueryTimeout later. That window, and process pauses (GC, a stopped VM) in
// general, are why work protected by a lock must fence its writes with the
// token rather than trust that it still holds the lock.
//
// # Cancellation
//
// pgx closes a connection whose statement was cancelled through its
// context, and a closed session silently drops every lock on it. So the
// Locker never runs statements on a lock session with a caller's context:
// ctx bounds only the waits for a session (and a [Locker.Acquire]'s polling),
// and each statement is bounded by [Config.QueryTimeout] (a parked wait's,
// below, by SessionCheckInterval + QueryTimeout); a statement that fails or
// times out fails its whole session, as described above.
//
// A [Locker.Acquire] that waits in the server (parked, see Waiting) blocks
// in pg_advisory_lock on a session that holds no other lock; when its
// context ends, the Locker ends that statement with a cancel request
// (pg_cancel_backend's protocol message), which keeps the session, and
// releases the lock if the grant came first. When its context ends just
// as the lock is granted, any Acquire releases the lock before returning
// the error: an acquire that returns an error leaves nothing held.
//
// # Waiting
//
// A [Locker.Acquire] whose key is held by another session waits in the
// server when it can: it parks on a session of its Locker that holds no
// lock and has nothing in flight (opening one when none is idle and
// [Config.MaxSessions] allows) and runs pg_advisory_lock there, then draws
// the token in the same statement. The server queues the parked sessions
// of every Locker in the order their statements began and grants the lock
// to the first at the holder's unlock, so a hand-over costs the unlock and
// the waiter's commit: no notification, no process woken to ask again. A
// parked session takes no other work, and at most MaxSessions-1 sessions
// of a Locker are parked at once, so other keys always keep a session;
// with MaxSessions 1 nothing parks. Each parked statement sets lock_timeout to
// [Config.SessionCheckInterval] (or half of the server's deadlock_timeout,
// if shorter) and is sent again when it runs out, so a parked session
// answers that often and a dead one is noticed as an idle session would
// be; a statement sent again joins the back of the server's line. A
// session the server ends while parked is replaced, and the wait goes on
// (a transient error). Shared locks never park.
//
// Otherwise (no session to park on, a shared lock, or a key held by
// another caller of the same Locker), a waiting Acquire retries after 5ms,
// then after pauses that double up to [Config.MaxPollInterval] (200ms by
// default), with jitter, and asks to be woken at once: the Locker opens one
// more connection of its own, the LISTEN connection (application_name
// [Config.ApplicationName] + "-listen"), which runs LISTEN on
// [NotifyChannel] and takes a shared session lock on the key's interest
// key, pg_try_advisory_lock_shared([InterestClassID], fold(key)) where
// fold(key) is the xor of the key's two 32-bit halves. Every [Lease.Release],
// in any Locker, releases its key and, in the same statement, tries
// pg_try_advisory_xact_lock on that interest key: only when it is held
// (someone waits) does the statement also run pg_notify(NotifyChannel, key),
// delivered at its commit, which then does not wait for the WAL to be
// flushed (the unlock changes no data), and the waiters retry at once. A
// lock is thus handed over across processes within about a millisecond
// rather than at the next poll. Releases of keys nobody waits for never
// notify (NOTIFY serialises committing transactions on a database-wide
// lock); they pay one more lock-table operation inside the server.
//
// Waiting stays flat as waiters grow: the calls of one Locker waiting for a
// key stand in a line, and only the call at its head parks, or polls,
// listens and asks the server; the others wait in-process, and each takes
// the head in turn when the one before it returns (with the key, or at its
// WaitTimeout or ctx). The line registers once for wake-ups, a refusal by the server
// is not repeated by each call, and a release, in this Locker or another,
// wakes one call per waiting Locker, whether ten or a thousand calls wait.
//
// Interest keys use the two-argument advisory key space, which never meets
// a [Key] (the bigint form), golang-migrate's lock, or a two-argument key
// whose first argument is not InterestClassID; do not use that value as a
// first argument in your own pg_advisory_lock(int, int) calls. Keys whose
// folds coincide share an interest key: that costs a needless NOTIFY, not a
// missed one.
//
// The wake-up is an accelerator only: a waiter keeps polling at its pace,
// and correctness never depends on a notification. While the LISTEN
// connection is down (it reconnects with backoff, and is checked when it
// has been silent for [Config.ListenCheckInterval], as in package
// leasetable: both run the same LISTEN loop), waiters poll; when it
// comes back they retry at once and register again. An acquire returning, for
// any reason, drops its interest, and the LISTEN connection releases the
// interest lock when no acquire of its Locker waits for the key any more;
// [Locker.Close] closes it. [Config.DisableListen] turns wake-ups off.
//
// Any role that can connect to the database can send NOTIFY on
// NotifyChannel. Forged notifications cannot grant a lock, and their cost
// to a waiter is bounded: the waiting call of a Locker for a key (its
// line's head) makes one attempt at a time, and an attempt a notification
// woke is made at least 25ms after the previous one a notification woke.
// So a flood costs each waiting Locker at most 40 notification-triggered
// attempts per second and key, besides its polls. The first wake-up after
// 25ms without one, as after a real unlock, is not delayed.
// Releases by [Locker.Close] (pg_advisory_unlock_all), by a session's end
// and by transaction locks send no notification: their waiters see them
// at their next poll. [Locker.AcquireTx] does not poll at all: the server queues it.
//
// Transaction locks use the caller's ctx as pgx does: if it ends during
// [Locker.AcquireTx]'s wait, pgx closes the transaction's connection, which ends the
// transaction and releases its locks.
//
// # Database outages and failover
//
// Transient database errors (the server unreachable, shutting down,
// starting up or failing over, a lock session that died; see
// [pgfence.ErrUnavailable]) do not end a wait: [Locker.Acquire] and
// [Locker.Do] retry on a new session with capped, jittered backoff (25ms
// doubling up to 500ms) for as long as their ctx and WaitTimeout allow, so
// a wait rides through a restart or a failover and gets the lock within
// about one backoff step of the database accepting connections again.
// [Locker.TryAcquire] retries for at most [Config].QueryTimeout in all.
// When they give up, the error matches pgfence.ErrUnavailable and wraps
// the last cause; when it was ctx or WaitTimeout that ended meanwhile, it
// wraps ctx's cause too (a WaitTimeout end still matches
// pgfence.ErrNotAcquired and context.DeadlineExceeded). A lock is only
// handed out while held: a grant whose session failed before the acquire
// could return it is retried like a transient error. A lock session that
// reached a read-only server (a standby, through a load balancer or a URL
// without target_session_attrs=read-write) gets no lock there, since a
// standby refuses the token draw (SQLSTATE 25006): the session is dropped
// and the acquire retries on a new one, which may reach the primary.
//
// What a holder sees during a failover: its session locks are lost, since
// they lived on the old primary's sessions. A server that shuts down
// (switchover, fast shutdown), whose postmaster dies, or that terminates
// the backend ends the sessions itself; the watchdog, which looks at idle
// sessions' sockets every 50ms between its checks, notices within about
// that and a round trip. A server that vanishes silently (node crash,
// network cut) is noticed when the next session check times out, within
// [Config].SessionCheckInterval + QueryTimeout (4s with the defaults).
// Either way the holder is normally told before a failover manager has
// promoted a new primary (Patroni waits out its leader key's ttl, 30s by
// default, after a crash, and shuts the old primary down before a
// switchover), but that is not guaranteed (a process paused meanwhile,
// settings with a shorter ttl): fence the protected writes with the token.
// [Lease.Done] closes, [Lease.Err] matches pgfence.ErrLeaseLost, and the
// lock is never re-acquired for the holder: it must acquire again, and
// gets a new, larger token. Point the pool at the primary only
// (target_session_attrs=read-write in a multi-host URL), with a
// connect_timeout, so that new sessions find the new primary.
//
// # Release failures
//
// An advisory lock belongs to the session that took it: no other session
// can unlock it, so a failed unlock cannot be retried elsewhere, and
// retrying it on its own session is impossible too, since pgx closes a
// connection whose statement failed other than with a server error. The
// Locker therefore closes the session (its other locks are lost), and the
// session's end is what releases the lock:
//
//   - When the failure was the server ending the session (a shutdown, a
//     crash, a failover, pg_terminate_backend, a reset connection), the
//     lock was released with it: nothing is left to do.
//   - When it was a timeout (QueryTimeout) on a live server, the closed
//     connection reaches the server, whose backend exits once the
//     statement it may still be running ends (an unlock takes effect
//     before its commit, so a commit waiting for a synchronous standby
//     does not keep the lock).
//   - When the network is cut, the client's TCP keeps resending its
//     close, which ends the backend as soon as the network is back; if it
//     stays cut, the server drops the session once its TCP settings give
//     up on the client ([Config].TCPUserTimeout, the keepalives: about
//     10-11s with the defaults). This is the advisory counterpart of a
//     lease that would have expired anyway, and [New] makes sure it comes
//     after the holder was told.
//
// So nothing is retried in the background, and [Locker.Close] has no
// release to wait for. [Lease.Release] returns an error matching
// pgfence.ErrNotHeld, and also pgfence.ErrUnavailable when the failure
// was transient; the Observer sees the lock Released, with that error.
//
// # Events
//
// [Config].Observer receives the events of [pgfence.Observer], the same as
// package leasetable sends, with these specifics:
//
//   - Acquired and NotAcquired: from every TryAcquire, Acquire and Do (by
//     name or [Key]; Lock.Name is the name, or the decimal key of an [ID]),
//     on the caller's goroutine with the ctx its OpAcquire runs with (the
//     caller's when the Observer is not an OpObserver), before the call
//     returns. Attempts counts the attempts that asked the database (a
//     refusal because another caller of the same Locker holds the key
//     costs no round trip and is not counted). An acquire refused with
//     pgfence.ErrAlreadyHeld or pgfence.ErrClosed sends NotAcquired; bad
//     input (an empty name, a TTL) sends nothing. Transaction locks
//     ([Locker.TryAcquireTx], [Locker.AcquireTx]) send no events.
//   - Renewed: after each successful session check (the watchdog's, every
//     SessionCheckInterval, or [Lease.Renew]), for each lock the check
//     covers; Expiry is zero.
//   - RenewalFailed: never. A session check that fails loses every lock on
//     the session at once (there is no TTL to ride out), so each gets Lost.
//   - Lost: when a lock's session died or [Locker.Close] dropped it
//     (Cause matches pgfence.ErrLeaseLost, and pgfence.ErrClosed for
//     Close), with the values of the ctx that acquired it.
//   - Released: from [Lease.Release] (and Do's release), with Err set when
//     the unlock failed (see Release failures). Every lock handed out ends
//     with exactly one Released or Lost. As Lost comes from the delivery
//     goroutine, a lock lost just as its acquire returned may have its
//     Lost delivered before its Acquired.
//   - ListenLost and ListenRestored: once per outage of the LISTEN
//     connection (see Waiting), not when it is closed for lack of waiters;
//     ListenLost's Err only says that it ended (the cause is logged).
//
// With an [pgfence.OpObserver], each acquire (all its attempts and waits),
// each release, and each session check is an operation: an OpRenew covers
// every lock on the session (Batch; Name only when it is one), runs with
// the values of the ctx that acquired the oldest of them, and links the
// others' ([pgfence.Op].Links). [Locker.Stats] counts the same outcomes.
//
// Every statement sent for a caller carries that caller's ctx values (for
// pgx tracers), though never its cancellation (see Cancellation): the
// dial and setup of a session opened for an acquire, the lock and unlock
// statements, the session checks (the acquiring ctx of the oldest lock),
// and the interest locks of the LISTEN connection (the first waiter's).
// Log records are written with the same contexts.
//
// # What is not guaranteed
//
//   - Mutual exclusion in real time: a holder can keep running after its
//     lock was lost (see Loss detection); fencing tokens make its late
//     writes fail.
//   - Fairness or FIFO order among waiters of [Locker.Acquire].
//   - Exclusion across databases: advisory locks are per database.
//   - Survival of session locks across a failover or restart: they are
//     lost, and reported lost.
//   - Detection of transaction pooling (see above).
package advisory
