// Package chaos is pgfence's Jepsen-style fault suite: it runs lock
// workloads against real PostgreSQL clusters, injects faults, records a
// history of every operation and checks it. The scenarios are tests behind
// the build tag "chaos" (go test -race -tags chaos ./internal/chaos/...);
// make chaos-ci runs the short schedule, make chaos a long soak.
//
// # History
//
// A [Recorder] collects [Op]s, each with its invocation and completion time
// on the monotonic clock, the process (worker) that ran it, and an
// [Outcome]: [Ok], [Fail] (known not to have taken effect) or [Unknown]
// (the client cannot tell, e.g. the connection broke after the statement was
// sent). [Classify] maps an error to its outcome.
//
// # Checking
//
// [Check] runs the cheap invariants and a linearizability check with
// porcupine against [FencedRegisterModel]: one row holding a value and a
// fencing token that rejects writes (and claiming reads) with a token older
// than its own; an operation of unknown outcome may or may not have taken
// effect. The invariants:
//
//   - [CheckTokensUnique]: no token granted twice, across all names;
//   - [CheckTokensIncreasing]: per name, a grant that follows another in
//     real time has a greater token;
//   - [CheckRowTokenMonotonic]: the row's token never moves backwards;
//   - [CheckNoLostUpdate]: the final value is the number of acknowledged
//     increments, plus at most the number of unknown ones;
//   - [CheckMutualExclusion] (with [CheckOpts.Exclusive]): no two processes
//     hold a lock that never expires at once.
//
// A failing [Report] prints the violations and the history, and porcupine's
// HTML visualisation is written to the file it names. [NaiveRegisterModel]
// is the deliberately wrong model that ignores faults (it assumes unknown
// operations failed): a negative control.
//
// # Workloads
//
// [Run] drives N workers, each looping: acquire through a [Locker], sleep a
// random time inside the critical section, Read and Write(value+1) through a
// [Register], release; bounded by an operation count and a duration.
// [SQLRegister] is the register in SQL: guarded (a read that claims the row
// with the holder's token, then a fenced write; a stale holder is rejected
// at either step, so the read-modify-write is atomic across holders) or
// unguarded (plain read and write: the negative control). [SimLocker] is a
// test-only locker whose grants lapse after a TTL while their holders still
// run, drawing tokens from pgfence_next_token().
//
// # Faults
//
//   - network: [Proxy] (in-process TCP proxy: cut, blackhole, latency);
//     [Netns] (nftables drop and reset rules inside a network namespace
//     created by the test, clients dialling from inside it);
//   - process pause: [StartChild] runs a holder in a child process (the test
//     binary run again, dispatched by [ChildMain]) that [Child.Stop] pauses
//     with SIGSTOP and [Child.Cont] resumes;
//   - connection kill: [TerminateBackends] (pg_terminate_backend);
//   - server crash: internal/pgtest's Cluster.Crash and Start;
//   - clock: [FakeClock] moves a server's wall clock through libfaketime;
//   - failover: internal/pgtest's NewStandby (synchronous or asynchronous)
//     and Cluster.Promote;
//   - pooling: [StartPgBouncer] runs a transaction-pooling PgBouncer.
//
// # Adding a locker
//
// A pgfence locker joins the suite through a small adapter implementing
// [Locker] and [Holder] (Acquire returns the grant, Token its fencing token,
// Release releases it) and, for the fence package, a [Register] whose
// writes go through the generated guarded SQL.
//
// # What is not checked
//
// The suite checks the properties it names, on the histories it records;
// it does not prove them for all schedules. Each check has a negative
// control in the tests showing that it can fail.
package chaos
