package main

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestMedian(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		in   []time.Duration
		want time.Duration
	}{
		{nil, 0},
		{[]time.Duration{3}, 3},
		{[]time.Duration{5, 1, 3}, 3},
		{[]time.Duration{4, 1, 3, 2}, 2},
	} {
		require.Equal(t, tc.want, median(tc.in), "%v", tc.in)
	}
}

func TestCallCostPairedRatio(t *testing.T) {
	t.Parallel()
	c := callCost{
		OldTimes: []time.Duration{100, 200, 100},
		NewTimes: []time.Duration{110, 300, 90},
	}
	// Batch ratios 1.1, 1.5, 0.9: the median pairs each batch with its own.
	require.InDelta(t, 1.1, c.pairedRatio(), 1e-9)
	require.Zero(t, (&callCost{}).pairedRatio())
	even := callCost{OldTimes: []time.Duration{100, 100}, NewTimes: []time.Duration{100, 200}}
	require.InDelta(t, 1.5, even.pairedRatio(), 1e-9)
}
