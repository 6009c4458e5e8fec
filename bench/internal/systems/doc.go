// Package systems adapts the lock implementations the benchmark compares to
// harness.System: raw-SQL ceilings issued with pgx, and the peers
// (cirello.io/pglock, bsm/redislock, etcd's concurrency.Mutex).
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
// opened. The database must be a disposable one: Reset truncates them.
package systems
