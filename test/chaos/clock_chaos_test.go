//go:build chaos

package chaos_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/test/chaos"
)

const (
	// leaseGrantSQL grants a lease whose expiry is computed on the
	// database clock, as the lease table does.
	leaseGrantSQL = `INSERT INTO pgfence.pgfence_leases (name, owner, fence, expires_at)
		VALUES ($1, 'chaos', pgfence.pgfence_next_token(), pg_catalog.now() + $2::pg_catalog.interval) RETURNING fence`
	// leaseHeldSQL is the lease table's "held" predicate.
	leaseHeldSQL = `SELECT EXISTS (SELECT 1 FROM pgfence.pgfence_leases WHERE name = $1 AND fence = $2 AND expires_at > pg_catalog.now())`
)

func serverOffset(t *testing.T, ctx context.Context, conn *pgx.Conn) time.Duration {
	t.Helper()
	var now time.Time
	require.NoError(t, conn.QueryRow(ctx, "SELECT now()").Scan(&now))
	return time.Until(now)
}

// Server clock jumps with libfaketime: now() follows the jump at once,
// lease expiry judged on the database clock follows it too (a forward jump
// expires a lease early, a backward jump revives it), and within one
// transaction now() stays at the transaction's start.
func TestServerClockJumps(t *testing.T) {
	t.Parallel()
	ctx := ctxFor(t, 2*time.Minute)
	clock, err := chaos.NewFakeClock()
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, clock.Close()) })
	c, s := pgtest.NewCluster(t, &pgtest.ClusterOptions{Env: clock.Env()})
	db := s.NewDB(t)
	conn := connectURL(t, ctx, c.URL(db.Name))

	within := func(got, want time.Duration) {
		t.Helper()
		require.InDelta(t, want.Seconds(), got.Seconds(), 60, "server clock offset %v, want about %v", got, want)
	}
	within(serverOffset(t, ctx, conn), 0)

	var tok int64
	require.NoError(t, conn.QueryRow(ctx, leaseGrantSQL, "clock", "10 minutes").Scan(&tok))
	held := func() bool {
		var ok bool
		require.NoError(t, conn.QueryRow(ctx, leaseHeldSQL, "clock", tok).Scan(&ok))
		return ok
	}
	require.True(t, held())

	// Forward jump past the TTL: the lease is expired at once.
	require.NoError(t, clock.Set(time.Hour))
	within(serverOffset(t, ctx, conn), time.Hour)
	require.False(t, held(), "a forward jump of the database clock must expire the lease")
	t.Log("server clock +1h: now() moved by about +1h and the 10-minute lease reads as expired")

	// Backward jump: the same row reads as held again. Expiry is judged
	// only by the database clock, so a clock stepped back revives a lease
	// (the fencing token, not the clock, is what protects the data).
	require.NoError(t, clock.Set(0))
	within(serverOffset(t, ctx, conn), 0)
	require.True(t, held(), "expiry follows the database clock back")
	t.Log("server clock back to real time: the lease reads as held again")

	// Within a transaction now() is the transaction's start time, while
	// clock_timestamp() follows the jump.
	tx, err := conn.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(context.WithoutCancel(ctx))
	var before, after, wall time.Time
	require.NoError(t, tx.QueryRow(ctx, "SELECT now()").Scan(&before))
	require.NoError(t, clock.Set(2*time.Hour))
	require.NoError(t, tx.QueryRow(ctx, "SELECT now(), clock_timestamp()").Scan(&after, &wall))
	require.Equal(t, before, after, "now() is fixed for the transaction")
	require.InDelta(t, (2 * time.Hour).Seconds(), wall.Sub(before).Seconds(), 60)
	require.NoError(t, tx.Rollback(ctx))
	require.NoError(t, clock.Set(0))

	// Tokens do not depend on the clock: a draw after the jumps is still
	// newer.
	next := nextToken(t, ctx, conn)
	require.Greater(t, next, tok)
}
