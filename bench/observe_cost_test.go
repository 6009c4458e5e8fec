package main

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestMedianFloat(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		in   []float64
		want float64
	}{
		{nil, 0},
		{[]float64{3}, 3},
		{[]float64{5, 1, 3}, 3},
		{[]float64{4, 1, 3, 2}, 2.5},
	} {
		require.InDelta(t, tc.want, medianFloat(tc.in), 1e-9, "%v", tc.in)
	}
}

func TestObserveCostPairedRatio(t *testing.T) {
	t.Parallel()
	c := observeCost{TP: map[string][]float64{
		armNone: {100, 200, 100},
		armOtel: {90, 220, 100},
	}}
	// Batch ratios 0.9, 1.1, 1.0: each batch is paired with its own.
	require.InDelta(t, 1.0, c.pairedRatio(armOtel), 1e-9)
	require.Zero(t, c.pairedRatio(armNoop), "no batches")
	c.TP[armNone][1] = 0 // a batch without a baseline is left out
	require.InDelta(t, 0.95, c.pairedRatio(armOtel), 1e-9)
}
