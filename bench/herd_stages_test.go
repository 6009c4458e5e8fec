package main

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestHerdStmtKind(t *testing.T) {
	t.Parallel()
	for sql, want := range map[string]int{
		`SELECT acquired, name, owner, fence, acquired_at, expires_at, db_now, secret FROM "pgfence".pgfence_acquire($1, $2, $3)`:             herdStmtAcquire,
		`SELECT fence, durability FROM "pgfence".pgfence_release($1, $2, $3, $4)`:                                                             herdStmtRelease,
		`SELECT r.i, CASE WHEN CASE WHEN r.sh THEN pg_catalog.pg_try_advisory_lock_shared(r.k) ELSE pg_catalog.pg_try_advisory_lock(r.k) END`: herdStmtAcquire,
		`SELECT CASE WHEN NOT pg_catalog.pg_advisory_unlock($1::pg_catalog.int8) THEN false`:                                                  herdStmtRelease,
		// The LISTEN connection's interest locks and a renewal are neither.
		`SELECT k FROM pg_catalog.unnest($1::pg_catalog.int8[]) AS k WHERE pg_catalog.pg_try_advisory_lock_shared(1885824631, 1)`: 0,
		`SELECT pg_catalog.count(*) FILTER (WHERE pg_catalog.pg_advisory_unlock_shared(1885824631, 1))`:                           0,
		`SELECT fence, renewed FROM "pgfence".pgfence_renew($1, $2, $3, $4)`:                                                      0,
	} {
		require.Equal(t, want, herdStmtKind(sql), sql)
	}
}

func TestSplitHandovers(t *testing.T) {
	t.Parallel()
	us := int64(time.Microsecond)
	stmts := []herdStmt{
		// A release statement sent before the first hand-over's release
		// started (an earlier hold's): not its statement.
		{herdStmtRelease, 900 * us, 950 * us},
		// Hand-over 1, from 1000 to 2000: release 1010-1300, acquire
		// 1250-1900 (sent before the holder read its answer).
		{herdStmtRelease, 1010 * us, 1300 * us},
		{herdStmtAcquire, 1250 * us, 1900 * us},
		// An acquire that ended after hand-over 1's Acquire returned.
		{herdStmtAcquire, 1950 * us, 2500 * us},
		// Hand-over 2, from 3000 to 4000: release 3100-3200, a refused
		// acquire that started before the release (not its statement),
		// then the grant 3300-3950.
		{herdStmtRelease, 3100 * us, 3200 * us},
		{herdStmtAcquire, 2990 * us, 3050 * us},
		{herdStmtAcquire, 3300 * us, 3950 * us},
	}
	// Hand-over 3 (5000 to 6000) has no statement of its own.
	st := splitHandovers([][2]int64{{1000 * us, 2000 * us}, {3000 * us, 4000 * us}, {5000 * us, 6000 * us}}, stmts)
	require.Equal(t, 2, st.N)
	// A refused acquire that ended before the release started is no
	// hand-over's: hand-over 2's statement is the grant.
	require.Equal(t, time.Duration(650*time.Microsecond), st.Acquire.Max)
	require.Equal(t, []time.Duration{10 * time.Microsecond, 100 * time.Microsecond}, []time.Duration{st.Before.Min, st.Before.Max})
	require.Equal(t, []time.Duration{100 * time.Microsecond, 290 * time.Microsecond}, []time.Duration{st.Release.Min, st.Release.Max})
	require.Equal(t, []time.Duration{-50 * time.Microsecond, 100 * time.Microsecond}, []time.Duration{st.Wake.Min, st.Wake.Max})
	require.Equal(t, []time.Duration{650 * time.Microsecond, 650 * time.Microsecond}, []time.Duration{st.Acquire.Min, st.Acquire.Max})
	require.Equal(t, []time.Duration{50 * time.Microsecond, 100 * time.Microsecond}, []time.Duration{st.After.Min, st.After.Max})
	// The parts of each hand-over add up to it: the means to the mean.
	require.Equal(t, time.Millisecond, st.Before.Mean+st.Release.Mean+st.Wake.Mean+st.Acquire.Mean+st.After.Mean)

	require.Zero(t, splitHandovers([][2]int64{{1000 * us, 2000 * us}}, nil).N)

	// A parked wait, sent at 500, before the release (1000-1200), answered
	// at 1700: wake 0, acquire 500 (from the release's answer).
	parked := splitHandovers([][2]int64{{1000 * us, 1800 * us}}, []herdStmt{
		{herdStmtAcquire, 500 * us, 1700 * us},
		{herdStmtRelease, 1000 * us, 1200 * us},
	})
	require.Equal(t, 1, parked.N)
	require.Equal(t, []time.Duration{0, 200 * time.Microsecond, 0, 500 * time.Microsecond, 100 * time.Microsecond},
		[]time.Duration{parked.Before.P50, parked.Release.P50, parked.Wake.P50, parked.Acquire.P50, parked.After.P50})

	b, err := json.Marshal([]herdStmt{{herdStmtAcquire, 1, 2}})
	require.NoError(t, err)
	require.JSONEq(t, `[[1,1,2]]`, string(b))
	var back []herdStmt
	require.NoError(t, json.Unmarshal(b, &back))
	require.Equal(t, []herdStmt{{herdStmtAcquire, 1, 2}}, back)
}
