// Package leasetable provides lease locks with fencing tokens, stored as rows
// of the pgfence_leases table.
//
// A [Locker] takes leases by name through a *pgxpool.Pool:
//
//	locker, err := leasetable.New(ctx, pool, &leasetable.Config{TTL: 30 * time.Second})
//	defer locker.Close()
//
//	lease, err := locker.TryAcquire(ctx, "account:42", nil) // ErrNotAcquired if held
//	lease, err := locker.Acquire(ctx, "account:42", nil)    // waits
//	err = locker.Do(ctx, "nightly-report", nil, func(ctx context.Context, l pgfence.Lease) error { ... })
//
// A [Locker] is a [pgfence.Locker], and its handles are [pgfence.Lease]
// values holding a *[Lease]: code written against those interfaces runs
// unchanged on session advisory locks (package advisory). A lease is
// renewed in the background until it is released or lost. Its
// [Lease.Token] is a fencing token; its [Lease.Done] channel and
// [Lease.Context] tell the holder when it must stop; [Lease.Expiry] is its
// local deadline and [Lease.Renew] renews it at once.
//
// pgfence's migrations must be applied first (package migrations, or
// pgfence migrate up), into the schema [Config].Schema names
// ([pgfence.DefaultSchema] unless set). [New] checks that they are, once.
//
// # Privileges
//
// Every statement the Locker sends calls a SECURITY DEFINER function of
// pgfence's schema (pgfence_acquire, pgfence_renew, pgfence_release,
// pgfence_prune_scan, pgfence_prune_delete, and, for operators,
// pgfence_force_release) or reads the table; the application role needs no
// write privilege on pgfence_leases and none on its sequence, so it cannot
// forge, rewind or reissue a token, take over a lease that has not expired,
// or revive one that has. migrations.Grant gives a role exactly what a
// Locker needs. Every statement names the schema and calls built-ins through
// pg_catalog, so no object another role plants on the search_path is ever
// called.
//
// # Ownership
//
// Each acquisition draws a secret in the database ([Lease.Secret]); only
// its SHA-256 is stored, so no role can read it back. Renewing, releasing,
// a lease-checked write (fence's UnderLease, pgfence_lease_held) and
// proclaiming a leader all present it: a role that reads a lease's name,
// owner and token from pgfence_leases still cannot act on it. The token
// stays public: it is the fencing token. Hand the secret only to code that
// acts for the holder. TTLs and AtLeast are at most [MaxTTL], in SQL too.
//
// Another role's transaction cannot stall a holder: an acquire answers at
// once, not acquired, for a name another transaction is claiming or whose
// expired row it has locked (a "busy" name, retried soon by Acquire), and
// a renewal skips a row another transaction has locked instead of waiting,
// so the rest of its batch is renewed. Release notifications carry a tag
// and a MAC under the install's key (pgfence_notify_key) instead of the
// name: a role without pgfence's grant reads no lease name from them, and
// forged or replayed ones cost a waiting Locker no statement.
//
// # What "held" means
//
// A lease is held by exactly the row that satisfies
//
//	name = $name AND fence = $token AND expires_at > now()
//
// judged on the database's clock only. The client's wall clock is never
// compared with the database's. Package fence's lease-checked writes check
// the same predicate with clock_timestamp() (the time the check runs, not
// the transaction's start), through pgfence_lease_held, and lock the row
// until their transaction ends, so a write checked that way is made while
// the lease is held.
//
// # Acquiring
//
// Acquiring is one statement (one round trip): an INSERT ... ON CONFLICT DO
// UPDATE that inserts the row, or takes over a row whose lease has expired or
// was released (expires_at <= now()), and returns the new token. Concurrent
// acquirers of one name are serialised by the row (or unique index) lock;
// exactly one sees the row free. A Locker does not re-enter: a name it
// already holds is not acquired again. TryAcquire of a name held by another
// caller of the same Locker is refused at once, without a round trip;
// Acquire waits and is woken at once when that caller releases it (with or
// without LISTEN); and a caller that already holds the name (its ctx
// descends from the lease's Context, as in a nested [Locker.Do]) gets
// [pgfence.ErrAlreadyHeld] at once. An attempt on a lease that is held
// (in the statement's snapshot) neither locks the row nor draws a token, so
// it writes nothing and waits for no WAL flush.
//
// # Group commit
//
// Concurrent acquires of one Locker are combined into one statement, and so
// are concurrent releases: a request that finds no statement of its kind in
// flight is sent at once (no timer delays a lone request); requests that
// arrive while one is in flight queue and go out together in the next one,
// matched back to their callers by name (acquires) or token (releases). N
// requests then cost one round trip and one WAL flush. Each request in a batch gets exactly the
// outcome it would get alone: when several goroutines acquire the same name
// in one batch, the name is sent once and the others see it held by the
// first. The local deadline of a lease acquired in a batch counts from the
// moment the batch statement was sent. The statement is cancelled only when
// every caller in it has given up; a lease taken for a caller that gave up
// before learning of it is released at once. Acquire batches insert and
// lock rows in name order; if a batch still deadlocks with another
// client's statement, its requests are retried one by one.
//
// [Locker.Acquire] waits without polling. Each Locker keeps one LISTEN
// connection of its own (opened from the pool's connection configuration,
// never taken from or returned to the pool), shared by all its waiters;
// releases send pg_notify on [NotifyChannel] with the lease name in the same
// statement, so a waiter wakes within milliseconds of the release's commit.
// The connection is subscribed (LISTEN) only while a call waits after a
// refusal, and for a second after the last one stopped, then unsubscribed
// (UNLISTEN): PostgreSQL signals every listening session of the database
// at each NOTIFY's commit, so a Locker that listened while idle would slow
// every release of every other Locker. A waiter whose refusal came before
// the subscription tries again once it is in place, as a release committed
// in between was announced to no one here.
// An AtLeast release notifies too: the waiter retries, learns the expiry
// acquired_at + AtLeast, and takes the lease then. Waiters of the Locker
// that released are woken directly, without LISTEN (also with
// [Config].DisableListen).
// The calls of one Locker waiting for the same lease stand in a line: only
// the call at its head waits for the wake-ups and retries, the others wait
// in-process and take the head in turn (about in the order they began to
// wait) when the one before returns, with the lease or without it. Calls
// that do try together (the head and new calls making their first
// attempt) send one attempt between them: those registered before it
// started wait for its answer and take a refusal (another Locker took the
// lease) as theirs. So a release wakes one call and costs one attempt per
// waiting Locker however many of its calls wait.
// Otherwise a waiter retries when the holder's lease is due to expire, plus a
// little jitter. If the LISTEN connection fails, waiting still works through
// those timed retries; the connection is re-opened with capped, jittered
// backoff (25ms doubling up to 500ms) and every waiter retries once it is
// back, since a release may have been missed. When one of the Locker's own
// statements fails with a transient error, the LISTEN connection is
// checked at once with a round trip bounded by a second (at most once a
// second), so one that died in the same outage without noticing is
// replaced within about that second. A connection can also die silently (firewall or NAT state
// dropped, a partition without a reset, a proxy that stopped forwarding):
// no error arrives, and neither do notifications. So whenever the LISTEN
// connection has received nothing for [Config].ListenCheckInterval (15s by
// default), it is checked with a round trip, and replaced like a failed one
// if that is not answered in time (within the interval, at most 5s). A
// release missed on a dead connection thus delays a waiter by about the
// interval plus that timeout, not until the holder's expiry. Each failure
// is logged as a Warn.
//
// # Fencing tokens
//
// Tokens come from the sequence pgfence_leases_fence_seq, the one shared with
// package advisory, drawn inside pgfence_acquire, which also makes the acquiring transaction commit durably
// (synchronous_commit forced on), so no token handed to a caller is issued
// again after a server crash. The sequence does not cycle, so tokens never
// wrap.
//
// For each name, tokens strictly increase across every acquisition: after
// release, expiry, takeover, and deletion and re-creation of the row. On the
// takeover path the new token is drawn under the row lock, after the previous
// holder's token was drawn and committed. On the insert path the token is
// drawn before the conflict check; it is only used when no row exists. The
// one danger is a row deleted after another acquirer drew its token but
// before it inserted: that acquirer would insert a token older than the
// deleted row's. Release never deletes a row (it expires the row in place),
// and [Locker.Prune] avoids the danger (see "Table growth" below). Do not
// DELETE rows by hand while acquirers run; if you must, delete only rows
// that expired long ago (say, a day). Even a bad delete leaves fencing safe
// (guarded writes reject the older token); only the ordering of that name's
// tokens is affected.
//
// # Table growth
//
// The table holds one row per name ever used: release and expiry leave the
// row in place. That is small for the usual fixed set of lock names. When
// names are made per entity ("account:42" for every account), call
// [Locker.Prune] now and then (or run pgfence prune from cron): it deletes
// the rows of leases that ended more than a given age ago (at least
// [MinPruneAge]; [DefaultPruneAge] is a day), judged on the database clock,
// in batches of a few thousand rows, each a short statement. Held leases and
// recently released ones are never touched. Before deleting a batch, Prune
// waits for the transactions that were writing pgfence_leases when it read
// the batch (every acquire holds the table's write lock from before it
// draws its token), so an acquirer that drew its token before a pruned
// row's was drawn has finished before the row goes; the next acquirer of
// the name inserts a new row with a larger token than any earlier one. A
// holder whose row was pruned lost its lease long before; its renewal and
// release find no row, and lease-checked writes (package fence) reject it.
//
// # Renewal and the local deadline
//
// A watchdog goroutine per Locker (running only while it holds leases)
// renews leases about every TTL/3 ([Config].RenewInterval). All leases due
// within half an interval are renewed by one statement, so the cost is O(1)
// statements per interval however many leases a Locker holds. A renewal only
// extends a row whose fence still matches and which has not expired: it
// never resurrects a lease.
//
// The holder does not trust a lease until the database says it expired. It
// keeps a local deadline, measured on the local monotonic clock:
//
//	deadline = (time the last successful acquire or renew request was sent) + TTL - SafetyMargin
//
// The database computed the row's expiry as its now() plus TTL, where now()
// is no earlier than the moment the request was sent; so, as long as the two
// clocks run at about the same rate (the margin absorbs the difference),
// the local deadline comes before the database could hand the lease to
// anyone else. A failed renewal is retried until that deadline. The lease is
// lost at the deadline, or as soon as a renewal finds the row no longer held
// (expired, taken over, deleted): [Lease.Done] is closed, [Lease.Context] is
// cancelled with cause [pgfence.ErrLeaseLost], and [Lease.Err] says why.
//
// # Release
//
// [Lease.Release] is owner-checked: it changes only the row with this
// lease's name, token and secret that is still held, and it expires that row
// in place (expires_at = now(), or acquired_at + [AcquireOpts].AtLeast if
// that is later). It never deletes a row and never touches another owner's
// lease.
//
// A release that frees its lease at once commits without waiting for its
// WAL to be flushed (synchronous_commit off for that transaction only): its
// NOTIFY holds a database-wide lock until the commit completes, so waiting
// for the disk there would serialise every release on the server. If the
// server crashes before the flush, the release is undone and the lease stays
// held until its TTL ends: a crash can delay a hand-over but never makes a
// lease look free early, and whoever takes a released lease commits durably,
// which flushes the release first. A release that keeps the lease held
// (AtLeast) commits durably.
//
// # Failure model, and what is not guaranteed
//
// Leases are time-based: a holder that is paused (GC, SIGSTOP, a VM freeze,
// a slow disk) longer than its TTL keeps running after it lost the lease,
// until it next looks at Done or Context. No lock service can prevent that.
// What pgfence guarantees instead is that its token is older than the next
// holder's: write through package fence (or check the held predicate in the
// same transaction as the write) and the stale holder's writes are rejected.
// Checking Done before a write and then writing without fencing is not safe.
//
// The local deadline assumes the client's and the server's clocks advance at
// about the same rate. A jump of the client's wall clock does not matter
// (the client measures on its monotonic clock and never sends a
// timestamp). A jump of the server's clock does: a step forward expires
// every lease early, possibly before its holder's local deadline, so a new
// holder can be granted the lease while the old one still believes it holds
// it (fencing rejects the old holder's writes; the fault suite steps the
// server's clock with libfaketime to show it); a step back extends leases.
// It also assumes the database is one serialisable history: after a
// failover to an asynchronous standby, committed acquisitions and renewals
// may be lost, and a lease may be granted twice. Use synchronous replication
// if failover must not break mutual exclusion (token draws raise
// synchronous_commit to on for acquisitions, never lower it, so tokens are
// not reissued on a synchronous standby).
//
// When the context of an acquire ends while its statement is in flight, the
// statement is not cancelled (a cancel can race the commit, and then nobody
// learns the token of the lease it took): the caller returns at once, the
// statement runs on to its answer, for at most [Config].QueryTimeout after
// its last caller left, and every lease it took for a caller that stopped
// waiting is given back then, all in one release statement: such a lease
// outlives its acquirer by about a round trip. Only when no answer comes
// (the server or the network failed, QueryTimeout passed, or
// [Locker.Close] cancelled it) may such a lease stay held until its TTL
// ends. A statement unanswered a TTL after it was sent is cancelled and
// retried like a failed one: any grant it brought would be past its local
// deadline. A context that ends before the statement is sent (waiting for a
// connection) sends nothing. Renewal attempts are bounded by
// [Config].QueryTimeout, so one stuck on a dead connection is retried on
// another before the local deadline.
//
// # Failover
//
// While the database fails over (Patroni switching over, a primary
// restarting, a connection cut), the Locker's statements fail with
// transient errors: connection refused or reset, the server shutting down
// or starting, a read-only standby (a demoted primary: its pooled
// connections are then closed, so the pool reconnects to the writable
// server), a serialization failure. What a holder sees:
//
//   - [Locker.Acquire] and [Locker.Do] retry with capped, jittered backoff
//     (25ms doubling up to 500ms) while ctx and WaitTimeout allow, and are
//     granted within about half a second of the new primary accepting
//     writes; [Locker.TryAcquire] retries for at most [Config].QueryTimeout.
//     When they give up, the error matches [pgfence.ErrUnavailable] and
//     wraps the last cause.
//   - A held lease keeps being renewed: each renewal attempt is bounded
//     by QueryTimeout and retried with backoff until the local deadline,
//     so a lease whose TTL outlasts the outage (plus QueryTimeout, for an
//     attempt stuck on a dead connection) is kept; otherwise it is lost at
//     its local deadline, before the database could grant it to anyone
//     else, and [Lease.Done] tells the holder to stop.
//   - [Lease.Release] retries within QueryTimeout, then returns an error
//     matching ErrUnavailable and retries in the background until the row
//     is released (waking waiters) or would have expired anyway, so the
//     name is free soon after the database is back, not at the end of
//     its TTL.
//   - A grant whose answer arrives after its local deadline (a commit that
//     waited longer than the TTL for a synchronous standby) is given back
//     and reported as not acquired: no Lease is ever returned already
//     lost.
//   - The LISTEN connection reconnects promptly and wakes every waiter.
//
// Safety through a failover needs synchronous replication (see above);
// the retries only shorten the time without grants. Put connect_timeout
// in the connection string: a blackholed host otherwise holds each connect
// for as long as the caller's context allows.
//
// # Observing
//
// [Config].Observer receives typed events ([pgfence.Acquired],
// [pgfence.NotAcquired], [pgfence.Released] synchronously with the
// caller's ctx; [pgfence.Renewed], [pgfence.RenewalFailed], [pgfence.Lost]
// from a delivery goroutine with the acquiring ctx's values;
// [pgfence.ListenLost] and [pgfence.ListenRestored] with
// context.Background()), and [Locker.Stats] gives a snapshot of the
// counters. An Observer that implements [pgfence.OpObserver] sees each
// TryAcquire, Acquire (the acquire of a Do too) and Release as one
// operation, all its attempts included, and each renewal round trip as
// one, whose Batch counts the leases it renews and whose Links are the
// acquiring ctxs of all but the first, whose values its ctx carries. An
// acquire or release statement that serves several callers at once (group
// commit) is an operation of its own, started under the opener's
// operation, with the others' ctxs as Links.
//
// Every statement carries the values of the caller it runs for: an
// acquire statement those of the request that opened its batch, a
// renewal those of the ctx that acquired the (first) lease, a release
// those of Release's ctx (Close's: the acquiring ctx's). Every log record
// is logged with the same ctx.
//
// # Pool size
//
// The Locker runs its statements (acquire, renewal, release) on the
// caller's pool, taking a connection for each one as the caller's own code
// does; it holds none between statements. It needs MaxConns of at least 2:
// with one, a caller that holds the only connection (an open transaction, a
// long query) keeps every statement of the Locker waiting, and [New] logs a
// Warn for such a pool. Every wait for a connection is bounded by
// [Config].QueryTimeout, whatever the caller's context: an acquire inside
// the caller's own transaction on a pool of one fails after QueryTimeout
// with an error that says the pool is exhausted (with its MaxConns and
// acquired connections) instead of waiting for itself; a renewal that gets
// no connection is logged as such ("renewal could not get a connection
// from the pool within ...") and retried until the lease's local deadline,
// when the lease is lost; a release that gets none is logged and returns
// the error. Size the pool for the caller's peak use plus one connection
// for the Locker.
//
// # Connection poolers
//
// Acquire, renew, release, [Locker.List] and [Locker.Get] are single
// statements, and [Locker.Prune] a series of independent ones, that use no
// session state (no advisory locks, no temporary tables, no SET), so they
// work through a transaction-pooling PgBouncer (configure pgx for it, for
// example with QueryExecModeSimpleProtocol or PgBouncer's prepared
// statement support). LISTEN is only an optimisation:
// through such a pooler it does not receive notifications, so either point
// [Config].ListenConnConfig at the server directly or set
// [Config].DisableListen; waiters then wake at the holder's expiry instead of
// at its release (releases by the same Locker still wake them at once).
// A LISTEN connection is checked at each connect: after LISTEN, a probe
// notification is sent through the pool, from another session (a
// session's own notification would reach it even through a transaction
// pooler, which tends to hand the same server connection back), and the
// LISTEN connection waits for it for the health check's timeout (at most
// 5s). When it does not arrive, the Locker logs one Warn ("LISTEN does not
// receive notifications on this connection: is it behind a transaction
// pooler? ...") and stops using LISTEN until [Locker.Close]; its waiters
// use timed retries, as with DisableListen.
package leasetable
