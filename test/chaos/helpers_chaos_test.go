//go:build chaos

package chaos_test

import (
	"context"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence"
	"github.com/pgfence/pgfence/test/chaos"
)

// soakDuration is CHAOS_DURATION (a Go duration), or zero.
func soakDuration() time.Duration {
	if v := os.Getenv("CHAOS_DURATION"); v != "" {
		if d, err := time.ParseDuration(v); err == nil && d > 0 {
			return d
		}
	}
	return 0
}

// soak scales a scenario's bounds: CHAOS_DURATION bounds each workload's
// wall time and lifts its operation bound, CHAOS_OPS replaces the operation
// bound, for long local runs (make chaos); unset, scenarios run their short
// CI schedule.
func soak(ops int, d time.Duration) (int, time.Duration) {
	if sd := soakDuration(); sd > 0 {
		return 0, sd
	}
	if v := os.Getenv("CHAOS_OPS"); v != "" {
		if n, err := strconv.Atoi(v); err == nil && n > 0 {
			return n, d
		}
	}
	return ops, d
}

// verdict checks h, logs the scenario's summary line, and requires the
// verdict: violation when wantViolation (a negative control), else
// linearizable.
func verdict(t *testing.T, h chaos.History, opts *chaos.CheckOpts, wantViolation bool) {
	t.Helper()
	if v := os.Getenv("CHAOS_CHECK_TIMEOUT"); v != "" && opts.Timeout == 0 {
		d, err := time.ParseDuration(v)
		require.NoError(t, err, "CHAOS_CHECK_TIMEOUT")
		opts.Timeout = d
	}
	if opts.Dir == "" {
		// A real failure's visualisation must outlive the test; a negative
		// control's need not.
		opts.Dir = os.TempDir()
		if wantViolation {
			opts.Dir = t.TempDir()
		}
	}
	r, err := chaos.Check(h, opts)
	require.NoError(t, err)
	t.Log(r.Summary())
	// The history replayed through the protocol model's transition rules.
	forbidden := chaos.ReplayModel(h, opts)
	t.Logf("model-replay: scenario=%s ops=%d forbidden=%d", opts.Name, len(h), len(forbidden))
	if !wantViolation {
		require.Empty(t, forbidden, "the protocol model forbids steps of this history:\n%s", r)
	}
	if wantViolation {
		require.Equal(t, "violation detected", r.Verdict(), "negative control not detected:\n%s", r)
		t.Logf("negative control detected as expected; first violation: %s; visualisation: %s", firstOr(r.Violations, string(r.Linearizability)), r.Visualization)
	} else {
		require.True(t, r.OK(), "%s", r)
	}
}

func firstOr(s []string, d string) string {
	if len(s) > 0 {
		return s[0]
	}
	return d
}

// ctxFor bounds a scenario: d, plus the soak duration on long runs.
func ctxFor(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d+soakDuration())
	t.Cleanup(cancel)
	return ctx
}

func nextToken(t *testing.T, ctx context.Context, db pgfence.DB) int64 {
	t.Helper()
	tok, err := chaos.NextToken(ctx, db)
	require.NoError(t, err)
	return tok
}
