package main

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestCombineTargetsAndMiss: scenario 10's target compares the default
// Locker with raw lock/unlock per client count, and a miss is explained
// with the turn time and the bound derived from the run's own figures.
func TestCombineTargetsAndMiss(t *testing.T) {
	pts := []combinePoint{
		// 16 clients: 16,000 cycles/s with 500 xids and 100 flushes per
		// 1,000 grants over 1s; raw ran 32,000: missed.
		{Arm: armAfter, Clients: 16, TP: 16_000, Grants: 1000, Xids: 500, Syncs: 100, Span: time.Second, Cycle: time.Millisecond},
		{Arm: armRaw, Clients: 16, TP: 32_000, Cycle: 50 * time.Microsecond},
		// 64 clients: 40,000 against 36,000: met.
		{Arm: armAfter, Clients: 64, TP: 40_000, Grants: 1000, Xids: 200},
		{Arm: armRaw, Clients: 64, TP: 36_000},
	}
	ts := combineTargets(pts)
	require.Len(t, ts, 2)
	require.Equal(t, verdict(false), ts[0].Met)
	require.Contains(t, ts[0].Measured, "0.50x")
	require.Contains(t, ts[0].Measured, "100 WAL flushes per 1,000 grants")
	require.Equal(t, verdict(true), ts[1].Met)
	require.Contains(t, ts[1].Measured, "1.11x")

	var b strings.Builder
	combineMiss(func(f string, a ...any) { fmt.Fprintf(&b, f, a...) }, pts, ts)
	out := b.String()
	require.Contains(t, out, "At 16 clients")
	require.NotContains(t, out, "At 64 clients", "a met target is not explained")
	require.Contains(t, out, "500 transaction ids and 100 WAL flushes per 1,000 grants (100 flushes per second)")
	require.Contains(t, out, "cycle p50 1.00 ms, against 0.050 ms for raw lock/unlock")

	b.Reset()
	combineMiss(func(f string, a ...any) { fmt.Fprintf(&b, f, a...) }, pts, combineTargets(pts[2:]))
	require.Empty(t, b.String(), "nothing missed, nothing explained")
}
