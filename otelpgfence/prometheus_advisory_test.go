package otelpgfence_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence"
	"github.com/pgfence/pgfence/advisory"
)

const adv = "pgfence_lock_strategy=advisory"

// TestPrometheusAdvisory: an advisory lock taken, one lost when its
// session is terminated (cause session_ended), one released.
func TestPrometheusAdvisory(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setupProm(t)
	pool := newPool(t, 8)
	locker, err := advisory.New(ctx, pool, &advisory.Config{Observer: b.obs, ApplicationName: "otel-prom-advisory"})
	require.NoError(t, err)
	t.Cleanup(locker.Close)
	t.Cleanup(b.obs.Track(pgfence.StrategyAdvisory, locker))
	require.Zero(t, b.value(t, "pgfence_lock_held", adv))

	job, err := locker.TryAcquire(ctx, "prom-adv", nil)
	require.NoError(t, err)
	require.Equal(t, 1.0, b.value(t, "pgfence_lock_held", adv))
	require.Equal(t, 1.0, b.value(t, "pgfence_lock_acquire_duration_seconds", adv, "pgfence_acquire_result=acquired"))

	// Lost: the session holding the lock is terminated; the holder's
	// check finds it ended.
	var pid int
	// The Locker's own session: other tests' statements hold advisory
	// locks of their own in the same database.
	require.NoError(t, pool.QueryRow(ctx, `SELECT l.pid FROM pg_catalog.pg_locks l
		JOIN pg_catalog.pg_stat_activity a ON a.pid = l.pid
		WHERE l.locktype = 'advisory' AND l.granted AND a.application_name = 'otel-prom-advisory'
		AND l.database = (SELECT oid FROM pg_catalog.pg_database WHERE datname = pg_catalog.current_database())`).Scan(&pid))
	_, err = pool.Exec(ctx, "SELECT pg_catalog.pg_terminate_backend($1)", pid)
	require.NoError(t, err)
	require.ErrorIs(t, job.Renew(ctx), pgfence.ErrLeaseLost)
	require.ErrorIs(t, job.Err(), pgfence.ErrSessionEnded)
	b.eventually(t, 1, "pgfence_lock_losses_total", adv, "pgfence_loss_cause=session_ended")
	b.eventually(t, 0, "pgfence_lock_held", adv)

	again, err := locker.TryAcquire(ctx, "prom-adv", nil)
	require.NoError(t, err)
	require.NoError(t, again.Release(ctx))
	require.Equal(t, 1.0, b.value(t, "pgfence_lock_hold_duration_seconds", adv, "pgfence_lock_end=released"))
	require.Positive(t, b.value(t, "pgfence_operation_duration_seconds", adv, "pgfence_operation=release"))
}
