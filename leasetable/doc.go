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
// renewed in the background until it is released or lost. [Lease.Token] is
// its fencing token; [Lease.Done] and [Lease.Context] tell the holder when
// it must stop; [Lease.Expiry] is its local deadline; [Lease.Renew] renews
// it at once.
//
// pgfence's migrations must be applied first, into [Config].Schema; [New]
// checks that they are. docs/leasetable.md explains the design.
//
// # What "held" means
//
// A lease is held by exactly the row that satisfies
//
//	name = $name AND fence = $token AND expires_at > now()
//
// judged on the database's clock only; the client's wall clock is never
// compared with it. Package fence's lease-checked writes check the same
// predicate with clock_timestamp() and lock the row until their transaction
// ends, so a write checked that way is made while the lease is held.
//
// Acquiring is one statement: it inserts the row, or takes over a row whose
// lease has expired or was released, and draws a new token. A Locker does
// not re-enter a name ([pgfence.ErrAlreadyHeld] for a caller whose ctx
// descends from the lease's Context). [Locker.Acquire] waits without
// polling: a release notifies on [NotifyChannel], which the Locker's LISTEN
// connection receives, when some waiter holds the name's interest key
// ([InterestClassID]); otherwise a waiter retries at the holder's expiry.
// Concurrent acquires (and releases) of one Locker go out in one statement;
// each caller gets the outcome it would get alone.
//
// # Fencing tokens
//
// Tokens come from one sequence that does not cycle, shared with package
// advisory. For each name they strictly increase across every acquisition,
// also after [Locker.Prune] deleted the row. Acquisitions commit durably, so
// no token is issued twice across a crash. Do not DELETE rows by hand while
// acquirers run: that may reorder a name's tokens (fencing stays safe).
//
// # Semaphores and sets
//
// [Locker.AcquirePermit] takes one of N permits of a name: permit k is the
// lease named [PermitName](name, k), with its own token, renewed, released
// and lost like any lease. [Locker.AcquireSet] takes several leases in one
// statement, all or none. Both need schema version 5 (6 for the permits' line across Lockers); docs/semaphores.md
// gives the design, the rule for N and the waiters' bound.
//
// # Ownership and privileges
//
// Every statement calls a SECURITY DEFINER function of pgfence's schema or
// reads the table: the application role, granted by migrations.Grant, needs
// no write privilege, so it cannot forge, rewind or reissue a token, or take
// over a lease that has not expired. Statements name the schema and call
// built-ins through pg_catalog.
//
// Each acquisition draws a secret in the database ([Lease.Secret]); only its
// hash is stored. Renewing, releasing and lease-checked writes present it,
// so a role that reads a lease's row still cannot act on it. The token stays
// public. Hand the secret only to code acting for the holder. Release
// notifications carry a keyed tag instead of the name: forged or replayed
// ones cost a waiting Locker no statement. TTLs and AtLeast are at most
// [MaxTTL].
//
// # Renewal and the local deadline
//
// A watchdog renews leases about every [Config].RenewInterval, all leases
// due together in one statement; a renewal never extends an expired row.
// The holder keeps a local deadline on its monotonic clock:
//
//	deadline = (time the last successful acquire or renew request was sent) + TTL - SafetyMargin
//
// The database's expiry is its now() (no earlier than the send) plus TTL,
// so while both clocks run at about the same rate the local deadline comes
// first. A failed renewal is retried until then. At the deadline, or when a
// renewal finds the row no longer held, the lease is lost: [Lease.Context]
// is cancelled with cause [pgfence.ErrLeaseLost], and [Lease.Err] says why.
// [Lease.Release] expires only the row still held with its token and secret.
//
// # Failure model
//
// A holder that is paused (GC, SIGSTOP, a VM freeze) longer than its TTL
// runs on after it lost the lease, until it next looks at Done. No lock
// service can prevent that; what pgfence guarantees is that its token is
// older than the next holder's. Write through package fence (or check the
// held predicate in the write's transaction) and the stale holder's writes
// are rejected. Checking Done and then writing without fencing is not safe.
//
// Expiry is computed on the database's clock. A jump of the client's wall
// clock does not matter; a step of the server's clock does: forward, it
// expires leases early, possibly before their holders' local deadlines
// (fencing still rejects the old holder); back, it extends them.
//
// During a failover the Locker's statements fail with transient errors.
// Acquire and Do retry while ctx and WaitTimeout allow; TryAcquire and
// Release retry for [Config].QueryTimeout, then return an error matching
// [pgfence.ErrUnavailable] (Release goes on retrying in the background).
// Renewals are retried until the local deadline, so a lease whose TTL
// outlasts the outage is kept. A grant whose answer arrives after its local
// deadline is given back, never returned. The LISTEN connection reconnects
// and wakes every waiter. Put connect_timeout in the connection string.
//
// The Locker runs its statements on the caller's pool: size it one above the
// caller's peak use, and at least 2. Every statement but LISTEN works
// through a transaction-pooling PgBouncer, where LISTEN receives nothing
// (detected at connect): point [Config].ListenConnConfig at the server, or
// set [Config].DisableListen, and waiters wake at the holder's expiry.
//
// # What is not guaranteed
//
//   - Mutual exclusion in time: a paused or partitioned holder may act after
//     its lease passed on. Only fenced or lease-checked writes are safe.
//   - Safety across a failover to an asynchronous standby: committed grants
//     and renewals may be lost, and a lease granted twice. Use synchronous
//     replication if failover must not break mutual exclusion.
//   - Order across Lockers: the calls of one Locker waiting for a name are
//     served about in the order they began; across Lockers no order holds.
//   - A prompt give-back when an acquire's ctx ends with its statement in
//     flight: the statement runs on and a lease it took is given back at its
//     answer; with no answer it stays held until its TTL ends. So does a
//     release that a server crash undoes.
//
// # Observing
//
// [Config].Observer receives typed events: [pgfence.Acquired],
// [pgfence.NotAcquired] and [pgfence.Released] on the caller's goroutine, the
// others ([pgfence.Lost], [pgfence.Renewed], ...) from a delivery goroutine.
// An [pgfence.OpObserver] sees each call and each renewal round trip as one
// operation. Statements and log records carry the values of the ctx they
// run for. [Locker.Stats] gives the counters; [Locker.List] and [Locker.Get]
// show the table to operators.
package leasetable
