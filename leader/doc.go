// Package leader elects one leader among the replicas of a service (the
// instance that runs the scheduler, the outbox relay, the compaction loop)
// on top of the lease table, with a fencing token per term.
//
// An [Elector] campaigns in one election for its process:
//
//	locker, err := leasetable.New(ctx, pool, &leasetable.Config{TTL: 10 * time.Second})
//	e, err := leader.New(ctx, pool, &leader.Config{Locker: locker, Election: "scheduler", Value: "10.0.0.7:8080"})
//	defer e.Close()
//
//	term, err := e.Campaign(ctx)     // blocks until this replica leads
//	... work under term.Context(), writes fenced with term.Token() ...
//	err = term.Resign(ctx)           // hands over at once
//
// or, in the style of client-go's leaderelection, runs the whole loop:
//
//	err = e.Run(ctx, leader.Callbacks{
//		OnStartedLeading: func(ctx context.Context, t *leader.Term) { runScheduler(ctx, t.Token()) },
//		OnStoppedLeading: func(t *leader.Term) { log.Print("term ended: ", t.Err()) },
//		OnNewLeader:      func(info leader.TermInfo) { forwardTo.Store(info.Value) },
//	})
//
// Followers ask who leads with [Elector.Leader], or follow every change
// with [Elector.Observe].
//
// # Elections, terms and tokens
//
// An election is a lease of the lease table (package leasetable) named
// after it; its leader is the lease's holder; a term is one grant of the
// lease. So everything the lease table guarantees holds for terms: one
// holder at a time on the database's clock, a token that is larger for
// every later term ([Term.Token]), renewal in the background, and a
// holder-side deadline ([Term.Expiry]): a leader whose renewals fail
// considers its term over before the database could grant it to anyone
// else, and its [Term.Context] is cancelled then, with a cause matching
// [pgfence.ErrLeaseLost]. A resignation cancels it with a cause matching
// [pgfence.ErrNotHeld]. Do not take the election's lease by its name for
// anything else.
//
// What the lease table cannot carry is the value a leader proclaims (an
// address to forward requests to). Migration 000005 adds the table
// pgfence_leaders for it, written only by the SECURITY DEFINER function
// pgfence_leader_proclaim, which records a value only for a term whose
// lease is held (name, token and owner match, and it has not expired on
// clock_timestamp()) and locks that lease row while it writes. It keeps the
// newest ten terms of each election, for operators ([List], [Terms], and
// pgfence ls). The application role needs pgfence's grants
// (migrations.Grant): SELECT on pgfence_leaders and EXECUTE on the function.
//
// # Campaign and hand-over
//
// [Elector.Campaign] acquires the election's lease with the Locker's
// Acquire, so it waits without polling: when the leader resigns, its
// release wakes the other candidates at once (within one Locker directly,
// across Lockers through the Locker's LISTEN connection), and otherwise
// they retry when the leader's lease is due to expire. Then it proclaims
// [Config].Value, and returns once both have committed. A resignation thus
// costs the follower a notification and two round trips; a crashed
// leader's term ends when its lease expires (TTL after its last renewal)
// and the follower takes over a few milliseconds later. The measured
// figures are in the README.
//
// A resigning leader does not race its followers for the next term: its
// release reaches them a notification later, while it could take the lease
// again at once. So after [Term.Resign] (and [Elector.Resign], and Run's
// resignation when OnStartedLeading returns) the Elector's next Campaign
// waits until the election's lease has been granted to someone else, which
// it learns from the new leader's proclamation on the observers' LISTEN
// connection, or until [Config].HandoverTimeout has passed since the
// resignation (when no other candidate was waiting). With DisableListen it
// waits out the timeout; the hand-over itself is not delayed.
// [Elector.StepAside] resigns and keeps the Elector out of the election for
// a given time, whoever leads meanwhile (a replica being drained).
//
// Never two terms at once in one process: an Elector that leads refuses
// to campaign ([ErrAlreadyLeading]), a Locker never holds a lease twice
// (two Electors sharing one Locker take turns), and [Elector.Run]
// campaigns again only after OnStartedLeading returned and the term was
// resigned.
//
// # Observing
//
// An observer reads the current term (one statement) and waits: for a
// notification naming the election (a proclamation on [NotifyChannel], a
// resignation on [leasetable.NotifyChannel]), for the current term's lease
// to be due to expire (so a crashed leader's end is seen within
// milliseconds of its expiry), or for [Config].ObserveInterval. The
// Elector keeps one LISTEN connection for all its observers, opened on the
// first Observe, and health-checked and reopened as the Locker's is.
// Observers never decide anything: the database does. An observer
// reports a new term with its value: one that reads the term between its
// grant and its proclamation waits for the proclamation (at most a second).
//
// # Fencing: what is not guaranteed
//
// Leadership is time-based, as leases are: a leader that is paused (GC,
// SIGSTOP, a VM freeze) past its TTL keeps running after its term ended,
// until it next looks at its context, and may still send writes. No
// election can prevent that. What this package guarantees instead is that
// its token is older than every later term's: make the leader's writes
// through package fence with [Term.Token] and lease-checked with
// UnderLease([Term.Election]) (rejected as soon as the term's lease is not
// held, on the database's clock), and a stale leader's writes are rejected.
// The fault suite (internal/chaos, leader_*_chaos_test.go) shows it for a
// SIGSTOPped leader, killed backends and a server restart, with a history
// check by the database's clock.
//
// The clock, failover and PostgreSQL assumptions are the lease table's
// (see package leasetable): the client's and the server's clocks must
// advance at about the same rate, and a failover to an asynchronous
// standby can lose committed terms. A proclamation commits without waiting
// for its WAL to be flushed (as a release does): after a server crash the
// term may look unproclaimed (TermInfo.Proclaimed false) until its leader
// proclaims again ([Term.Proclaim]); it never makes anyone look like the
// leader.
//
// # Metrics and traces
//
// An Elector's terms are the leases of the leasetable.Locker it is given:
// set that Locker's Config.Observer (for example otelpgfence's) and every
// term's grant, renewals and end arrive as its events (Acquired, Renewed,
// Lost with its cause, Released) under the election's name.
//
// # Connection poolers
//
// Campaign, Resign, Proclaim, Leader, [List] and [Terms] are single
// statements without session state, so they work through a
// transaction-pooling PgBouncer, like the Locker's. LISTEN does not: point
// [Config].ListenConnConfig (and the Locker's) at the server directly, or
// set DisableListen; observers then see changes at the current term's
// expiry or after ObserveInterval, and campaigns take over at the leader's
// expiry (or at once within one Locker). A LISTEN connection behind such a
// pooler is detected at connect (a probe notification does not arrive),
// logged once, and given up.
package leader
