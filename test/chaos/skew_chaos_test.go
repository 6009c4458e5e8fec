//go:build chaos

package chaos_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/test/chaos"
)

const (
	// Expiry judged on the database clock, as the lease table does.
	skewGrantDBClock    = `INSERT INTO pgfence.pgfence_leases (name, owner, fence, expires_at) VALUES ($1, $2, pgfence.pgfence_next_token(), pg_catalog.now() + interval '10 minutes')`
	skewTakeoverDBClock = `UPDATE pgfence.pgfence_leases SET owner = $2, fence = pgfence.pgfence_next_token(), expires_at = pg_catalog.now() + interval '10 minutes'
		WHERE name = $1 AND expires_at <= pg_catalog.now()`
	// Expiry judged on the client's clock ($3): what pgfence must not do.
	skewGrantClientClock    = `INSERT INTO pgfence.pgfence_leases (name, owner, fence, expires_at) VALUES ($1, $2, pgfence.pgfence_next_token(), $3::pg_catalog.timestamptz + interval '10 minutes')`
	skewTakeoverClientClock = `UPDATE pgfence.pgfence_leases SET owner = $2, fence = pgfence.pgfence_next_token(), expires_at = $3::pg_catalog.timestamptz + interval '10 minutes'
		WHERE name = $1 AND expires_at <= $3::pg_catalog.timestamptz`
)

// skewedGrants has client A (clock right) take a 10-minute lease, then
// client B (clock 30 minutes fast) try to take it over as expired. Lock
// grants are recorded for the mutual exclusion check: nobody releases.
func skewedGrants(t *testing.T, ctx context.Context, pool *pgxpool.Pool, grant, takeover string, clientClock bool) chaos.History {
	t.Helper()
	clocks := []time.Duration{0, 30 * time.Minute}
	args := func(p int, name string) []any {
		a := []any{name, []string{"a", "b"}[p]}
		if clientClock {
			a = append(a, time.Now().Add(clocks[p]))
		}
		return a
	}
	rec := chaos.NewRecorder()
	op := rec.Invoke(chaos.Op{Process: 0, Kind: chaos.Acquire, Name: "skew"})
	_, err := pool.Exec(ctx, grant, args(0, "skew")...)
	require.NoError(t, err)
	op.Complete(chaos.Ok, nil)

	op = rec.Invoke(chaos.Op{Process: 1, Kind: chaos.Acquire, Name: "skew"})
	tag, err := pool.Exec(ctx, takeover, args(1, "skew")...)
	require.NoError(t, err)
	if tag.RowsAffected() == 1 {
		op.Complete(chaos.Ok, nil)
	} else {
		op.Complete(chaos.Fail, func(o *chaos.Op) { o.Err = "lease held" })
	}
	return rec.History()
}

// Clock skew between clients: with expiry judged on the database clock, a
// client whose clock runs 30 minutes fast cannot take over a 10-minute
// lease; judged on the clients' clocks (the negative control), it can,
// and two clients hold the lock at once.
func TestClientClockSkew(t *testing.T) {
	t.Parallel()
	ctx := ctxFor(t, time.Minute)
	db := pgtest.NewDB(t)
	h := skewedGrants(t, ctx, db.Pool, skewGrantDBClock, skewTakeoverDBClock, false)
	require.Equal(t, 1, h.Count(chaos.Acquire, chaos.Fail))
	verdict(t, h, &chaos.CheckOpts{Name: "client-clock-skew-db-clock", Exclusive: true}, false)

	_, err := db.Pool.Exec(ctx, "DELETE FROM pgfence.pgfence_leases")
	require.NoError(t, err)
	h = skewedGrants(t, ctx, db.Pool, skewGrantClientClock, skewTakeoverClientClock, true)
	verdict(t, h, &chaos.CheckOpts{Name: "negative-control-client-clock-skew-client-clock", Exclusive: true}, true)
}
