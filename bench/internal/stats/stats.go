// Package stats summarises latency samples: nearest-rank percentiles, means
// and throughput, the figures every benchmark table reports.
package stats

import (
	"math"
	"slices"
	"time"
)

// Summary describes a set of latency samples.
type Summary struct {
	N    int           // number of samples
	Min  time.Duration // smallest sample
	P50  time.Duration // median (nearest rank)
	P90  time.Duration // 90th percentile (nearest rank)
	P99  time.Duration // 99th percentile (nearest rank)
	Max  time.Duration // largest sample
	Mean time.Duration // arithmetic mean
}

// Percentile returns the p-th percentile (0 < p <= 100) of sorted samples by
// the nearest-rank method: the smallest sample such that at least p percent
// of the samples are less than or equal to it. It returns 0 for no samples
// and panics when p is outside (0, 100] or the samples are not sorted in
// ascending order, both programming errors.
func Percentile(sorted []time.Duration, p float64) time.Duration {
	if p <= 0 || p > 100 || math.IsNaN(p) {
		panic("stats: percentile outside (0, 100]")
	}
	if len(sorted) == 0 {
		return 0
	}
	if !slices.IsSorted(sorted) {
		panic("stats: samples are not sorted")
	}
	rank := int(math.Ceil(p / 100 * float64(len(sorted))))
	if rank < 1 {
		rank = 1
	}
	return sorted[rank-1]
}

// Summarize sorts samples in place and returns their summary. The zero
// Summary is returned for no samples.
func Summarize(samples []time.Duration) Summary {
	if len(samples) == 0 {
		return Summary{}
	}
	slices.Sort(samples)
	var sum float64
	for _, s := range samples {
		sum += float64(s)
	}
	return Summary{
		N:    len(samples),
		Min:  samples[0],
		P50:  Percentile(samples, 50),
		P90:  Percentile(samples, 90),
		P99:  Percentile(samples, 99),
		Max:  samples[len(samples)-1],
		Mean: time.Duration(sum / float64(len(samples))),
	}
}

// Rate returns count events per second over elapsed; 0 when elapsed is not
// positive.
func Rate(count int, elapsed time.Duration) float64 {
	if elapsed <= 0 {
		return 0
	}
	return float64(count) / elapsed.Seconds()
}

// Ratio returns a/b, or NaN when b is zero or either is NaN, so a missing
// reference shows as "n/a" rather than as an infinite ratio.
func Ratio(a, b float64) float64 {
	if b == 0 || math.IsNaN(a) || math.IsNaN(b) {
		return math.NaN()
	}
	return a / b
}

// CDF returns up to points (fraction, latency) pairs of the empirical
// cumulative distribution of sorted samples, evenly spaced in rank and always
// including the largest sample; fraction is in (0, 1].
func CDF(sorted []time.Duration, points int) []CDFPoint {
	n := len(sorted)
	if n == 0 || points <= 0 {
		return nil
	}
	if points > n {
		points = n
	}
	out := make([]CDFPoint, 0, points)
	for i := 1; i <= points; i++ {
		rank := int(math.Ceil(float64(i) * float64(n) / float64(points)))
		out = append(out, CDFPoint{Fraction: float64(rank) / float64(n), Latency: sorted[rank-1]})
	}
	return out
}

// CDFPoint is one point of an empirical cumulative distribution: Fraction of
// the samples are less than or equal to Latency.
type CDFPoint struct {
	Fraction float64
	Latency  time.Duration
}

// Median returns the median of values (the mean of the two middle values
// for an even count), or NaN for none. values is not modified.
func Median(values []float64) float64 {
	if len(values) == 0 {
		return math.NaN()
	}
	v := slices.Clone(values)
	slices.Sort(v)
	n := len(v)
	if n%2 == 1 {
		return v[n/2]
	}
	return (v[n/2-1] + v[n/2]) / 2
}
