// Package chaos is pgfence's Jepsen-style fault suite: it runs lock
// workloads against real PostgreSQL clusters, injects faults, records a
// history of every operation and checks it. The scenarios are tests behind
// the build tag "chaos", in the test module (cd test && go test -race -tags
// chaos ./chaos/...); make chaos-ci runs the short schedule, make chaos a
// long soak.
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
// [Run] drives N workers, each looping: acquire through a [Locker] (one per
// worker with [WorkloadConfig.Lockers], as separate processes would have),
// sleep a random time inside the critical section, Read and Write(value+1)
// through a [Register], release; bounded by an operation count and a
// duration. The register is one row holding a value and a fencing token:
//
//   - [FenceRegister] writes through package fence's generated guarded
//     UPDATE (fence.Update(...).Exec), optionally lease-checked
//     (UnderLease); errors matching pgfence.ErrFenced are recorded as
//     fenced failures ([IsFenced]), a lease-checked rejection as a plain
//     failure;
//   - [SQLRegister] is the same with raw SQL: guarded, or unguarded (plain
//     read and write: the negative control).
//
// The real lockers join through adapters: [PgfenceLocker] takes any
// pgfence.Locker (a leasetable or an advisory Locker: Acquire by name) and
// hands the workload the pgfence.Lease itself (Token, Release, and Done,
// which the workload watches: see [Watched] and [Op.Lost]);
// [AdvisoryTxLocker] runs a transaction per critical section, locked with
// the advisory Locker's AcquireTx (the register's operations run in it, see
// [Scoped], and take effect only if its commit does). [SimLocker] is a
// test-only locker whose grants lapse after a TTL while their holders still
// run.
//
// # Why the read claims the row
//
// Fencing with fence_token <= token stops a stale write only AFTER a newer
// holder has written the row: until then the row still carries an older
// token, and the stale holder's write passes. A read-modify-write is
// therefore not protected by a fenced write alone. Holder A (token 1) reads
// 5 and pauses; its lease lapses; B (token 2) reads 5, writes 6 with token
// 2 and A's late write of 6 is fenced: fine. But if B reads 5 and has not
// written yet when A wakes, A's write of 6 (token 1 >= the row's 0) lands,
// and B then writes 6 too: one increment is lost, though every write was
// "fenced". So the register's read claims the row: it moves the row's token
// to the reader's token (a guarded UPDATE that changes nothing else) before
// reading, in one transaction, and is itself fenced. Once B has claimed the
// row, A's write is rejected, and A's own claim is rejected if B's came
// first. Equivalently, do the modification in one guarded statement
// (SET val = val + 1), which needs no separate read. Applications of
// package fence must do one or the other.
//
// # Faults
//
//   - network: internal/pgtest's Proxy (in-process TCP proxy: cut,
//     blackhole, latency);
//     [Netns] (nftables drop and reset rules inside a network namespace
//     created by the test, clients dialling from inside it);
//   - process pause: [StartChild] runs a holder in a child process (the test
//     binary run again, dispatched by [ChildMain]), optionally holding a
//     real leasetable lease, that [Child.Stop] pauses with SIGSTOP and
//     [Child.Cont] resumes;
//   - connection kill: [TerminateBackends] (pg_terminate_backend);
//   - server crash: internal/pgtest's Cluster.Crash and Start;
//   - power loss: [PowerLossFS] holds a cluster's data directory and, on
//     [PowerLossFS.PowerCut], drops every file write not yet fsynced
//     (make powerloss-ci; docs/testing.md);
//   - clock: [FakeClock] moves a server's wall clock through libfaketime;
//   - failover: internal/pgtest's NewStandby (synchronous or asynchronous)
//     and Cluster.Promote;
//   - pooling: internal/pgtest's StartPgBouncer runs a transaction-pooling
//     PgBouncer.
//
// # Adding a locker
//
// A locker joins the suite through a small adapter implementing [Locker]
// and [Holder] (Acquire returns the grant, Token its fencing token, Release
// releases it, with pgfence.ErrNotHeld when it had been lost), and
// [Watched] when it can tell its holder of a loss.
//
// # What is not checked
//
// The suite checks the properties it names, on the histories it records;
// it does not prove them for all schedules. Each check has a negative
// control in the tests showing that it can fail.
package chaos
