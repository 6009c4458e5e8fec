// Package pgfence provides distributed locks and fenced writes that live
// entirely inside PostgreSQL, for Go services built on pgx v5.
//
// Every distributed lock is a lease: a holder can pause past it, resume,
// and still believe it holds the lock. pgfence pairs every grant with a
// fencing token, and lets the protected rows reject writes that carry an
// older one.
//
// The strategies are [github.com/pgfence/pgfence/leasetable] (leases in a
// table, expiry on the database clock) and
// [github.com/pgfence/pgfence/advisory] (advisory locks with the same
// tokens); [github.com/pgfence/pgfence/fence] guards the writes and
// [github.com/pgfence/pgfence/leader] elects a leader. The schema is
// installed by [github.com/pgfence/pgfence/migrations]. This package holds
// what they share: [Locker], [Lease], [AcquireOpts], [DB], the events of
// [Observer], and the sentinel errors.
//
// # The contract
//
// TryAcquire returns at once ([ErrNotAcquired] when the lock is held).
// Acquire waits until it holds the lock, ctx ends, or
// [AcquireOpts].WaitTimeout elapses. Do runs a function under the lock and
// cancels its context with cause [ErrLeaseLost] when the lock is lost. A
// caller asking for a lock it already holds gets [ErrAlreadyHeld]. Release
// is idempotent. Both strategies pass one contract test suite.
//
// Tokens come from one sequence that never cycles: every later grant of a
// name has a larger token, no token is handed out twice, and a token a
// caller has seen stays issued after a crash.
//
// # Failure model
//
// While the database clock is before a lease's expiry, no other owner is
// granted it. The holder gives the lock up locally at a deadline computed
// from when its request was sent, minus a margin, so an honest holder stops
// first. A paused holder cannot notice that it is paused: a TTL buys
// progress, fencing buys safety. Once a later holder has written a fenced
// row, an earlier holder's writes to it fail with [ErrFenced]. Expiry is
// judged on the database clock only.
//
// # What is not guaranteed
//
//   - Writes outside the database: pass the token along and have the
//     resource check it.
//   - Writes that are not guarded by package fence or its triggers.
//   - Failover to an asynchronous standby: tokens and leases can be lost.
//   - Session advisory locks behind a transaction-pooling proxy.
//
// docs/design.md in the repository has the full model and the fault
// suite's results.
package pgfence
