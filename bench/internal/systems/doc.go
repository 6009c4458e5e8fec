// Package systems adapts the lock implementations the benchmark compares to
// harness.System: raw-SQL ceilings issued with pgx, pgfence's own strategies
// (leasetable, advisory session and transaction locks, and the fence
// builder's write paths), and the peers (cirello.io/pglock, bsm/redislock,
// etcd's concurrency.Mutex).
//
// # pgfence
//
// Both session strategies go through one adapter over pgfence.Locker,
// releasing with the pgfence.Lease it returned. TryAcquire goes through one
// shared Locker, as a service would use it. A waiting Acquire takes a Locker
// of its own from a set (one per concurrent waiter), so every hand-over
// passes between Lockers as between processes, never through one Locker's
// in-process bookkeeping. They connect as the application role when the run
// has one (harness.Env.AppURL).
//
// # Ceilings
//
// A ceiling issues the fewest raw statements a design of its kind needs per
// acquire+release cycle, with nothing else around them: two single-row
// UPDATEs on a lease table shaped like pgfence_leases, or
// pg_try_advisory_lock plus pg_advisory_unlock. No library doing the same
// work in as many round trips can beat it on the same server.
//
// # Tables
//
// The ceilings and pglock keep their rows in tables of their own
// (bench_ceiling_leases, locks, bench_accounts*), created when the system is
// opened; pgfence-leasetable uses pgfence.pgfence_leases, which it resets
// and fills as the owner. The database must be a disposable one: Reset
// truncates them.
package systems
