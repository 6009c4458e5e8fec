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
	Note: fmt.Sprintf("advisory.Locker (session locks) with the default MaxSessions (%d) whatever the client count: the lock requests queued on a busy session run in one statement (pg_try_advisory_lock + durable tokens), its queued unlocks in another, both in one round trip and one transaction; waiting Acquire as pgfence-advisory", advisory.DefaultMaxSessions),
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
