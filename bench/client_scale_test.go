package main

import (
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence/bench/internal/harness"
)

func curveOf(tps ...float64) []clientsTP {
	var out []clientsTP
	for i, tp := range tps {
		out = append(out, clientsTP{Clients: 1 << i, TP: tp})
	}
	return out
}

func TestKneeOf(t *testing.T) {
	t.Parallel()
	nan := math.NaN()
	tests := []struct {
		name  string
		curve []clientsTP
		want  kneeInfo
		holds bool
	}{
		{"rises then holds", curveOf(100, 190, 350, 600, 800, 790, 700, 680, 650),
			kneeInfo{Knee: 16, Peak: 800, Above: 4, Worst: 256, WorstTP: 650}, true},
		{"collapses", curveOf(100, 190, 350, 600, 800, 700, 500, 300, 200),
			kneeInfo{Knee: 16, Peak: 800, Above: 4, Worst: 256, WorstTP: 200}, false},
		{"dips in the middle", curveOf(100, 800, 500, 700),
			kneeInfo{Knee: 2, Peak: 800, Above: 2, Worst: 4, WorstTP: 500}, false},
		{"exactly the floor", curveOf(100, 1000, 800),
			kneeInfo{Knee: 2, Peak: 1000, Above: 1, Worst: 4, WorstTP: 800}, true},
		{"peak at the largest count", curveOf(100, 200, 400),
			kneeInfo{Knee: 4, Peak: 400}, true},
		{"tie: the lowest count is the knee", curveOf(100, 400, 400, 390),
			kneeInfo{Knee: 2, Peak: 400, Above: 2, Worst: 8, WorstTP: 390}, true},
		{"unmeasured points are skipped", curveOf(nan, 300, nan, 250),
			kneeInfo{Knee: 2, Peak: 300, Above: 1, Worst: 8, WorstTP: 250}, true},
		{"a point with no cycle is a collapse", curveOf(100, 300, 0),
			kneeInfo{Knee: 2, Peak: 300, Above: 1, Worst: 4, WorstTP: 0}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			k, ok := kneeOf(tt.curve)
			require.True(t, ok)
			require.Equal(t, tt.want, k)
			require.Equal(t, tt.holds, k.holds(collapseFloor))
		})
	}

	// Order does not matter.
	c := curveOf(100, 190, 350, 600, 800, 700, 500, 300, 200)
	rev := make([]clientsTP, len(c))
	for i := range c {
		rev[len(c)-1-i] = c[i]
	}
	a, _ := kneeOf(c)
	b, _ := kneeOf(rev)
	require.Equal(t, a, b)
	require.InDelta(t, 0.25, a.worstRatio(), 1e-9)

	_, ok := kneeOf(nil)
	require.False(t, ok)
	_, ok = kneeOf(curveOf(nan, nan))
	require.False(t, ok)
	k, _ := kneeOf(curveOf(1, 2))
	require.True(t, math.IsNaN(k.worstRatio()))
	require.Contains(t, k.describe(), "no larger client count")
}

func TestClientScaleOrderAlternates(t *testing.T) {
	t.Parallel()
	names := func(specs []harness.Spec) []string { return specNames(specs) }
	fwd := names(clientScaleSpecs)
	require.Equal(t, fwd, names(clientScaleOrder(clientScaleSpecs, 0, 2)))
	rev := names(clientScaleOrder(clientScaleSpecs, 1, 2))
	require.Equal(t, fwd[0], rev[len(rev)-1])
	require.Equal(t, fwd[len(fwd)-1], rev[0])
	// The next round starts where the last one would have.
	require.Equal(t, rev, names(clientScaleOrder(clientScaleSpecs, 0, 1)))
	// The specs themselves are left alone.
	require.Equal(t, fwd, names(clientScaleSpecs))
}

func TestFittingCounts(t *testing.T) {
	t.Parallel()
	fit, skipped := fittingCounts(scaleClientCounts, 400-3-1)
	require.Equal(t, scaleClientCounts, fit)
	require.Empty(t, skipped)
	fit, skipped = fittingCounts(scaleClientCounts, 100-3-1)
	require.Equal(t, []int{1, 2, 4, 8, 16, 32, 64}, fit)
	require.Equal(t, []int{128, 256}, skipped)
}

func TestRenderClientScale(t *testing.T) {
	t.Parallel()
	cfg, err := parseFlags([]string{"-quick", "-scenarios", "12"})
	require.NoError(t, err)
	res := &results{Started: time.Date(2026, 12, 1, 13, 0, 0, 0, time.UTC), Elapsed: time.Minute, Args: []string{"-quick", "-scenarios", "12"}}
	res.Machine = machineInfo{CPU: "Test CPU", Cores: 2, Postgres: map[string]string{"max_connections": "400"}}
	cs := &clientScaleResult{Rounds: 1, Counts: []int{1, 2, 4, 8}, MaxConnections: 400, LoadStart: "1.00 1.00 1.00", LoadEnd: "2.00 1.50 1.20",
		Systems: []string{"pgfence-leasetable", "pgfence-advisory", "raw-advisory", "raw-2update"},
		Specs:   []systemInfo{{Name: "pgfence-advisory", Kind: "pgfence", Note: "shown in the Systems table"}, {Name: "raw-2update", Kind: "ceiling", Note: "scenario 12 only"}}}
	res.Systems = []systemInfo{{Name: "pgfence-advisory", Kind: "pgfence", Note: "shown in the Systems table"}}
	curves := map[string][]int64{
		"pgfence-leasetable": {400, 800, 1000, 900},   // holds: 0.90x
		"pgfence-advisory":   {500, 1200, 900, 600},   // collapses: 0.50x
		"raw-advisory":       {900, 1800, 2000, 2100}, // still rising
		"raw-2update":        {450, 900, 1000, 950},
	}
	for _, s := range cs.Systems {
		for i, c := range cs.Counts {
			r := cycles(curves[s][i], time.Second, time.Millisecond, 3*time.Millisecond)
			if s == "pgfence-advisory" && c == 8 {
				r.Errors = 7
			}
			cs.add(s, c, r, "1.5 1.2 1.0")
		}
	}
	cs.Profiles = []scaleProfile{{waitSample: waitSample{System: "pgfence-advisory", Clients: 8, Samples: 10, Active: 40,
		Events: map[string]int{"CPU": 30, "IO:WALSync": 10}}, Throughput: 610}}
	res.ClientScale = cs

	files, err := render(res, cfg)
	require.NoError(t, err)
	md := string(files["latest.md"])
	require.Contains(t, md, "## 12. Client scale")
	require.Contains(t, md, "Measured in this scenario only:\n\n| system | kind | what one cycle does |\n| --- | --- | --- |\n| raw-2update | ceiling | scenario 12 only |\n\n")
	// The matrix, the detail rows with ratios to both ceilings, errors and load.
	require.Contains(t, md, "| 8 | 900 | 600 | 2,100 | 950 |")
	require.Contains(t, md, "| 4 | pgfence-leasetable | 1,000 | 1.00 ms | 3.00 ms | 0 | 0.50x | n/a | 1.00x | 1.5 1.2 1.0 |")
	require.Contains(t, md, "| 8 | pgfence-advisory | 600 | 1.00 ms | 3.00 ms | 7 | 0.29x | n/a | 0.63x |")
	require.Contains(t, md, "| 8 | raw-advisory | 2,100 | 1.00 ms | 3.00 ms | 0 |  |  |  |")
	// Knees.
	require.Contains(t, md, "| pgfence-leasetable | 4 | 1,000 | 1 | 900 at 8 | 0.90x | met |")
	require.Contains(t, md, "| pgfence-advisory | 2 | 1,200 | 2 | 600 at 8 | 0.50x | **missed** |")
	require.Contains(t, md, "| raw-advisory | 8 | 2,100 | 0 | — | n/a | met (peak at the largest count) (ceiling: reported, not a target) |")
	// Targets: one row per pgfence system, with figures.
	require.Contains(t, md, "| pgfence-leasetable, uncontended, 1, 2, 4, 8 clients: no collapse past the knee | every count above the knee ≥ 0.8x the peak | peak 1,000 cycles/s at 4 clients; lowest above it 900 at 8 clients (0.90x the peak, over 1 larger client count) | met |")
	require.Contains(t, md, "| pgfence-advisory, uncontended, 1, 2, 4, 8 clients: no collapse past the knee | every count above the knee ≥ 0.8x the peak | peak 1,200 cycles/s at 2 clients; lowest above it 600 at 8 clients (0.50x the peak, over 2 larger client counts) | **missed** |")
	require.NotContains(t, md, "raw-2update, uncontended")
	// The profile of the largest count.
	require.Contains(t, md, "| pgfence-advisory | CPU 75%, IO:WALSync 25% | 610 | 0 | 10 | 4.0 |")
	require.Contains(t, md, "![Throughput against clients, 1 to 8](scale-clients.svg)")
	// The miss is explained with the run's figures; the system that held is not.
	require.Contains(t, md, "- **pgfence-advisory** (peak 1,200 cycles/s at 2 clients; lowest above it 600 at 8 clients (0.50x the peak, over 2 larger client counts)) may open one lock session per client")
	require.Contains(t, md, "Wait events at 8 clients: pgfence-advisory CPU 75%, IO:WALSync 25%; 4.0 active backends per snapshot; raw-advisory-token not profiled.")
	require.NotContains(t, md, "- **pgfence-leasetable**")

	svg := string(files["scale-clients.svg"])
	require.Equal(t, 4, strings.Count(svg, "<polyline"))
	require.Contains(t, svg, ">pgfence-advisory</text>")
	require.Contains(t, svg, `text-anchor="middle">8</text>`)

	// A run without scenario 12 has neither the section nor its targets.
	other := &results{Machine: res.Machine}
	files, err = render(other, cfg)
	require.NoError(t, err)
	require.NotContains(t, string(files["latest.md"]), "Client scale")
	require.NotContains(t, string(files["latest.md"]), "no collapse")
	require.NotContains(t, files, "scale-clients.svg")
}

func TestRenderScaleMissesLeasetable(t *testing.T) {
	t.Parallel()
	cs := &clientScaleResult{Rounds: 1, Counts: []int{64, 128, 256}, Systems: []string{"pgfence-leasetable", "raw-2update"}}
	for i, c := range cs.Counts {
		cs.add("pgfence-leasetable", c, cycles([]int64{15000, 20000, 12000}[i], time.Second, time.Duration(i+1)*5*time.Millisecond, 40*time.Millisecond), "")
		cs.add("raw-2update", c, cycles([]int64{5000, 4800, 1000}[i], time.Second, time.Millisecond, 3*time.Millisecond), "")
	}
	cs.Profiles = []scaleProfile{{waitSample: waitSample{System: "pgfence-leasetable", Clients: 256, Samples: 100, Active: 100,
		Events: map[string]int{"CPU": 60, "IO:WALSync": 40}}}}
	var b strings.Builder
	renderScaleMisses(func(f string, a ...any) { b.WriteString(fmt.Sprintf(f, a...)) }, cs)
	md := b.String()
	require.Contains(t, md, "- **pgfence-leasetable** (peak 20,000 cycles/s at 128 clients; lowest above it 12,000 at 256 clients (0.60x the peak, over 1 larger client count)) combines")
	require.Contains(t, md, "(cycle p50 10.0 ms at the knee, 15.0 ms at 256 clients)")
	require.Contains(t, md, "Wait events at 256 clients: CPU 60%, IO:WALSync 40%; 1.0 active backends per snapshot.")
	require.Contains(t, md, "raw-2update, which runs every cycle's UPDATEs on its own connection: peak 5,000 cycles/s at 64 clients; lowest above it 1,000 at 256 clients (0.20x the peak")

	// Nothing to explain when every pgfence system holds.
	cs.Points = nil
	for _, c := range cs.Counts {
		cs.add("pgfence-leasetable", c, cycles(int64(c)*100, time.Second, time.Millisecond, 3*time.Millisecond), "")
	}
	b.Reset()
	renderScaleMisses(func(f string, a ...any) { b.WriteString(fmt.Sprintf(f, a...)) }, cs)
	require.Empty(t, b.String())
}
