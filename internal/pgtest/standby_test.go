package pgtest_test

import (
	"context"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence/internal/pgtest"
)

// A write committed on a primary with a synchronous standby survives a
// crash of the primary and the standby's promotion.
func TestStandbyStreamsAndPromotes(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, _ := pgtest.NewCluster(t, nil)
	sb := pgtest.NewStandby(t, c, &pgtest.StandbyOptions{Synchronous: true})

	// The maintenance database: the test's own databases are dropped on the
	// primary at cleanup, which this test crashes for good.
	primary, err := pgx.Connect(ctx, c.URL("postgres"))
	require.NoError(t, err)
	_, err = primary.Exec(ctx, "CREATE TABLE standby_test (v int); INSERT INTO standby_test VALUES (1)")
	require.NoError(t, err)
	var state string
	require.NoError(t, primary.QueryRow(ctx, "SELECT sync_state FROM pg_stat_replication").Scan(&state))
	require.Equal(t, "sync", state)
	_ = primary.Close(ctx)

	require.NoError(t, c.Crash(syscall.SIGKILL))
	require.NoError(t, sb.Promote(ctx))
	conn, err := pgx.Connect(ctx, sb.URL("postgres"))
	require.NoError(t, err)
	defer conn.Close(ctx)
	var n int
	require.NoError(t, conn.QueryRow(ctx, "SELECT count(*) FROM standby_test").Scan(&n))
	require.Equal(t, 1, n)
	_, err = conn.Exec(ctx, "INSERT INTO standby_test VALUES (2)")
	require.NoError(t, err, "the promoted standby accepts writes")
}

func TestNewStandbyRejectsBadOptions(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, _ := pgtest.NewCluster(t, nil)
	_, err := c.NewStandby(ctx, &pgtest.StandbyOptions{Settings: map[string]string{"primary_conninfo": "x"}})
	require.ErrorContains(t, err, "must not set primary_conninfo")
	require.NoError(t, c.Stop())
	_, err = c.NewStandby(ctx, nil)
	require.ErrorContains(t, err, "needs a running primary")
	require.NoError(t, c.Start(ctx))
}
