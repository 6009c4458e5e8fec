package stats_test

import (
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence/bench/internal/stats"
)

func ms(v ...int) []time.Duration {
	out := make([]time.Duration, len(v))
	for i, x := range v {
		out[i] = time.Duration(x) * time.Millisecond
	}
	return out
}

func TestPercentile(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		samples []time.Duration
		p       float64
		want    time.Duration
	}{
		{"empty", nil, 50, 0},
		{"single", ms(7), 99, 7 * time.Millisecond},
		{"median odd", ms(1, 2, 3, 4, 5), 50, 3 * time.Millisecond},
		{"median even takes lower", ms(1, 2, 3, 4), 50, 2 * time.Millisecond},
		{"p99 of 100", ms(seq(1, 100)...), 99, 99 * time.Millisecond},
		{"p99 of 10 is max", ms(seq(1, 10)...), 99, 10 * time.Millisecond},
		{"p100 is max", ms(1, 5, 9), 100, 9 * time.Millisecond},
		{"tiny p is min", ms(1, 5, 9), 0.001, 1 * time.Millisecond},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			require.Equal(t, tt.want, stats.Percentile(tt.samples, tt.p))
		})
	}
}

func TestPercentilePanicsOnMisuse(t *testing.T) {
	t.Parallel()
	require.Panics(t, func() { stats.Percentile(ms(1, 2), 0) })
	require.Panics(t, func() { stats.Percentile(ms(1, 2), 101) })
	require.Panics(t, func() { stats.Percentile(ms(2, 1), 50) })
}

func seq(from, to int) []int {
	var out []int
	for i := from; i <= to; i++ {
		out = append(out, i)
	}
	return out
}

func TestSummarize(t *testing.T) {
	t.Parallel()
	s := stats.Summarize(ms(5, 1, 4, 2, 3))
	require.Equal(t, stats.Summary{
		N: 5, Min: time.Millisecond, P50: 3 * time.Millisecond, P90: 5 * time.Millisecond,
		P99: 5 * time.Millisecond, Max: 5 * time.Millisecond, Mean: 3 * time.Millisecond,
	}, s)
	require.Equal(t, stats.Summary{}, stats.Summarize(nil))
}

func TestRateAndRatio(t *testing.T) {
	t.Parallel()
	require.InDelta(t, 500.0, stats.Rate(1000, 2*time.Second), 1e-9)
	require.Zero(t, stats.Rate(10, 0))
	require.InDelta(t, 0.5, stats.Ratio(1, 2), 1e-9)
	require.True(t, math.IsNaN(stats.Ratio(1, 0)))
	require.True(t, math.IsNaN(stats.Ratio(math.NaN(), 2)))
}

func TestCDF(t *testing.T) {
	t.Parallel()
	samples := ms(seq(1, 10)...)
	got := stats.CDF(samples, 5)
	require.Equal(t, []stats.CDFPoint{
		{0.2, 2 * time.Millisecond}, {0.4, 4 * time.Millisecond}, {0.6, 6 * time.Millisecond},
		{0.8, 8 * time.Millisecond}, {1, 10 * time.Millisecond},
	}, got)
	require.Len(t, stats.CDF(ms(1, 2), 50), 2)
	require.Nil(t, stats.CDF(nil, 5))
}

func TestMedian(t *testing.T) {
	t.Parallel()
	in := []float64{5, 1, 3}
	require.InDelta(t, 3.0, stats.Median(in), 1e-9)
	require.Equal(t, []float64{5, 1, 3}, in, "input untouched")
	require.InDelta(t, 2.5, stats.Median([]float64{4, 1, 2, 3}), 1e-9)
	require.True(t, math.IsNaN(stats.Median(nil)))
}
