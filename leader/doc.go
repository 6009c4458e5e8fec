// Package leader elects one leader among the replicas of a service (the
// instance that runs the scheduler, the outbox relay) on top of the lease
// table, with a fencing token per term.
//
//	locker, err := leasetable.New(ctx, pool, &leasetable.Config{TTL: 10 * time.Second})
//	e, err := leader.New(ctx, pool, &leader.Config{Locker: locker, Election: "scheduler", Value: "10.0.0.7:8080"})
//	defer e.Close()
//
//	term, err := e.Campaign(ctx) // blocks until this replica leads
//	... work under term.Context(), writes fenced with term.Token() ...
//	err = term.Resign(ctx)       // hands over at once
//
// [Elector.Run] runs the loop in client-go's style with [Callbacks];
// followers ask who leads with [Elector.Leader] or follow changes with
// [Elector.Observe].
//
// # Terms
//
// An election is a lease named after it; a term is one grant of it. So a
// term has what a lease has: one holder at a time on the database clock, a
// token larger than every earlier term's ([Term.Token]), renewal in the
// background, and a local deadline ([Term.Expiry]) at which a leader whose
// renewals fail considers its term over, before the database could grant
// the next one. [Term.Context] is cancelled then, with a cause matching
// pgfence.ErrLeaseLost, or pgfence.ErrNotHeld after a resignation. Do not
// take the election's lease by its name for anything else.
//
// A leader proclaims a value (an address to forward to), recorded only
// while its lease is held with its secret. [List] and [Terms] read the
// newest terms for operators.
//
// # Campaign and hand-over
//
// [Elector.Campaign] waits without polling: a resignation wakes the other
// candidates at once, a crashed leader is replaced when its lease expires.
// After [Term.Resign] the Elector's next campaign waits until another
// candidate was granted the lease, or [Config].HandoverTimeout passed, so a
// resigning leader does not win its own term back. [Elector.StepAside]
// keeps it out for a while. One process never holds two terms of one
// election at once: a leading Elector refuses to campaign
// ([ErrAlreadyLeading]) and [Elector.Run] campaigns again only after its
// callback returned and the term was resigned.
//
// # What is not guaranteed
//
// Leadership is time-based: a leader paused past its TTL keeps running
// after its term ended, until it next looks at its context, and may still
// send writes. No election can prevent that. Make the leader's writes
// through package fence with [Term.Token] and UnderLease(election,
// term.Lease().Secret()), and a stale leader's writes are rejected. The
// clock, failover and pooler assumptions are the lease table's; a failover
// to an asynchronous standby can lose committed terms. A proclamation is
// not flushed before it returns: after a server crash a term may look
// unproclaimed until its leader proclaims again, never the other way.
// Observers and campaigns work through a transaction pooler with
// [Config].ListenConnConfig or DisableListen.
//
// docs/leader.md in the repository has the design in full.
package leader
