package systems

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence"
	"github.com/pgfence/pgfence/advisory"
	"github.com/pgfence/pgfence/bench/internal/harness"
)

// AdvisoryDefault is pgfence's session advisory locks as an application
// gets them without configuration: one advisory.Locker with the default
// MaxSessions (advisory.DefaultMaxSessions) however many clients share it,
// so concurrent grants queue on its sessions and are combined. Waiting
// Acquires use one single-session Locker each, as in Advisory.
var AdvisoryDefault = harness.Spec{
	Name: "pgfence-advisory-default",
	Kind: harness.Pgfence,
	Note: fmt.Sprintf("advisory.Locker (session locks) with the default MaxSessions (%d) whatever the client count: a session's turn runs its queued unlocks in one statement, then its lock requests, with those made meanwhile, in another (pg_try_advisory_lock + durable tokens, one transaction); new keys fill the oldest session up to 32 acquisitions in flight before another opens; waiting Acquire as pgfence-advisory", advisory.DefaultMaxSessions),
	Open: func(ctx context.Context, env *harness.Env, clients int) (harness.System, error) {
		withSessions := func(n int) newLocker {
			return func(ctx context.Context, pool *pgxpool.Pool) (pgfence.Locker, error) {
				return advisory.New(ctx, pool, &advisory.Config{MaxSessions: n})
			}
		}
		// The Locker dials its own sessions; its pool only checks the
		// install in New.
		return newLockerSystem(ctx, env, 1, withSessions(advisory.DefaultMaxSessions), withSessions(1))
	},
}
