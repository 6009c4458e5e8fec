// Package chaos is pgfence's Jepsen-style fault suite: it runs lock
// workloads against real PostgreSQL clusters, injects faults, records a
// history of every operation and checks it.
//
// # History
//
// A [Recorder] collects [Op]s, each with its invocation and completion time,
// the process (worker) that ran it, and an [Outcome]: [Ok], [Fail] (known not
// to have taken effect) or [Unknown] (the client cannot tell, e.g. the
// connection broke after the statement was sent).
//
// # Checking
//
// [Check] runs the cheap invariants ([CheckTokensUnique],
// [CheckTokensIncreasing], [CheckRowTokenMonotonic], [CheckNoLostUpdate]) and
// a linearizability check with porcupine against [FencedRegisterModel], a
// register holding a value and a fencing token that rejects writes with a
// token older than its own. A failing [Report] prints the history and writes
// porcupine's HTML visualisation to a file whose path it names.
//
// # Workloads
//
// [Run] drives N workers, each looping: acquire a lock through a [Locker],
// sleep a random time inside the critical section, do a read-modify-write
// through a [Register], release. [SQLRegister] is the register in SQL, with a
// guarded (fenced) mode and an unguarded mode that is the negative control.
// [SimLocker] is a test-only locker whose holders may overlap (a lease that
// expires while its holder still runs) and that draws its fencing tokens from
// pgfence_next_token(); the real lockers plug in through the same interface.
//
// # Faults
//
// [Proxy] is an in-process TCP proxy that can cut, blackhole or delay
// connections; [Netns] runs nftables rules in a network namespace;
// [StartChild] runs a holder in a child process that can be paused with
// SIGSTOP; [TerminateBackends] kills server connections; [FakeClock] moves
// a server's clock through libfaketime; [StartPgBouncer] starts a
// transaction-pooling PgBouncer. Server crashes and failover use
// internal/pgtest's Cluster and standby support.
//
// # What is not checked
//
// The suite checks the properties it names on the histories it records; it
// does not prove them for all schedules. Each check has a negative control
// in the tests showing it can fail.
package chaos
