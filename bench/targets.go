package main

import (
	"fmt"
	"math"
	"strconv"
	"time"

	"github.com/pgfence/pgfence/bench/internal/report"
)

// target is one of issue 8's targets with the figure this run measured.
type target struct {
	What     string
	Goal     string
	Measured string
	Met      string // "met", "missed" or "not measured"
}

func verdict(ok bool) string {
	if ok {
		return "met"
	}
	return "**missed**"
}

const notMeasured = "not measured"

// cycleTP returns the median throughput of system at clients in points.
func cycleTP(points []cyclePoint, system string, clients int) float64 {
	for i := range points {
		if points[i].System == system && points[i].Clients == clients {
			return points[i].agg().Throughput
		}
	}
	return math.NaN()
}

func writeTP(points []writePoint, writer string) float64 {
	for i := range points {
		if points[i].Writer == writer {
			return points[i].agg().Throughput
		}
	}
	return math.NaN()
}

func handoverOf(res *results, system string, hold time.Duration) *handoverPoint {
	for i := range res.Handover {
		if h := &res.Handover[i]; h.System == system && h.Hold == hold && h.Latency.N > 0 {
			return h
		}
	}
	return nil
}

func scaleOf(res *results, system string, rows int) *scaleLatency {
	for i := range res.ScaleLat {
		if s := &res.ScaleLat[i]; s.System == system && s.Rows == rows {
			return s
		}
	}
	return nil
}

// ratioTarget compares a/b against min (a/b >= min).
func ratioTarget(what, goal string, a, b, min float64, detail string) target {
	t := target{What: what, Goal: goal, Met: notMeasured, Measured: "n/a"}
	if math.IsNaN(a) || math.IsNaN(b) || b == 0 {
		return t
	}
	r := a / b
	t.Measured = fmt.Sprintf("%.2fx (%s)", r, detail)
	t.Met = verdict(r >= min)
	return t
}

// targets computes every target of issue 8 from the run's results.
func targets(res *results, cfg *config) []target {
	var out []target
	c := 16
	lt, ceil, pgl := cycleTP(res.Uncontended, "pgfence-leasetable", c), cycleTP(res.Uncontended, "raw-2update", c), cycleTP(res.Uncontended, "pglock", c)
	out = append(out,
		ratioTarget("leasetable acquire+release vs the two-UPDATE ceiling, 16 clients", "≥ 0.9x", lt, ceil, 0.9,
			fmt.Sprintf("%s vs %s cycles/s", report.Rate(lt), report.Rate(ceil))),
		ratioTarget("leasetable vs pglock, 16 clients", "≥ 1.45x (stretch ≥ 2x)", lt, pgl, 1.45,
			fmt.Sprintf("%s vs %s cycles/s", report.Rate(lt), report.Rate(pgl))))
	adv, rawAdv := cycleTP(res.Uncontended, "pgfence-advisory", c), cycleTP(res.Uncontended, "raw-advisory", c)
	out = append(out, ratioTarget("advisory (session, with token) vs raw advisory lock/unlock, 16 clients", "≥ 0.7x", adv, rawAdv, 0.7,
		fmt.Sprintf("%s vs %s cycles/s", report.Rate(adv), report.Rate(rawAdv))))
	ax, rawAx := cycleTP(res.Uncontended, "pgfence-advisory-xact", c), cycleTP(res.Uncontended, "raw-advisory-xact", c)
	out = append(out, ratioTarget("advisory-xact (with token) vs raw xact advisory, 16 clients", "≥ 0.7x", ax, rawAx, 0.7,
		fmt.Sprintf("%s vs %s cycles/s", report.Rate(ax), report.Rate(rawAx))))

	for _, sys := range []string{"pgfence-leasetable", "pgfence-advisory", "pgfence-advisory-xact"} {
		for _, hold := range []time.Duration{cfg.HoldShort, cfg.HoldLong} {
			t := target{What: fmt.Sprintf("%s hand-over, hold %v", sys, hold), Goal: "p50 < 3 ms, p99 < 15 ms", Met: notMeasured, Measured: "n/a"}
			if hold == cfg.HoldLong {
				t.Goal = "(reported; targets are for short holds)"
			}
			if h := handoverOf(res, sys, hold); h != nil {
				t.Measured = fmt.Sprintf("p50 %s, p99 %s (%d hand-overs)", report.Duration(h.Latency.P50), report.Duration(h.Latency.P99), h.Latency.N)
				if hold == cfg.HoldShort {
					t.Met = verdict(h.Latency.P50 < 3*time.Millisecond && h.Latency.P99 < 15*time.Millisecond)
				} else {
					t.Met = "—"
				}
			}
			out = append(out, t)
		}
	}

	plain := writeTP(res.Writes, "plain UPDATE")
	for _, w := range []struct {
		name, goal string
		min        float64
	}{
		{"fence.Update", "within 5% (≥ 0.95x)", 0.95},
		{"fence.Update.UnderLease", "within 15% (≥ 0.85x)", 0.85},
	} {
		v := writeTP(res.Writes, w.name)
		out = append(out, ratioTarget(w.name+" vs plain UPDATE, "+strconv.Itoa(cfg.WriteClients)+" clients", w.goal, v, plain, w.min,
			fmt.Sprintf("%s vs %s writes/s", report.Rate(v), report.Rate(plain))))
	}

	if len(cfg.ScaleRows) >= 2 {
		lo, hi := cfg.ScaleRows[0], cfg.ScaleRows[len(cfg.ScaleRows)-1]
		t := target{What: fmt.Sprintf("leasetable acquire p50 with %s vs %s live leases", report.Thousands(int64(hi)), report.Thousands(int64(lo))),
			Goal: "≤ 1.2x", Met: notMeasured, Measured: "n/a"}
		a, b := scaleOf(res, "pgfence-leasetable", hi), scaleOf(res, "pgfence-leasetable", lo)
		if a != nil && b != nil && b.Acquire.P50 > 0 {
			r := float64(a.Acquire.P50) / float64(b.Acquire.P50)
			t.Measured = fmt.Sprintf("%.2fx (%s vs %s; p99 %.2fx)", r, report.Duration(a.Acquire.P50), report.Duration(b.Acquire.P50),
				float64(a.Acquire.P99)/float64(b.Acquire.P99))
			t.Met = verdict(r <= 1.2)
		}
		out = append(out, t)
	}

	t := target{What: "renewal statements per 1,000 leases per interval", Goal: "≤ 1", Met: notMeasured, Measured: "n/a"}
	if rn := res.Renewal; rn != nil {
		v := rn.PerThousandPerInterval()
		t.Measured = fmt.Sprintf("%.3f (%d statements for %s leases over %.1f intervals of %v)", v, rn.Statements, report.Thousands(int64(rn.Leases)), rn.Intervals(), rn.Interval)
		t.Met = verdict(v <= 1 && rn.LostAtEnd == 0)
	}
	out = append(out, t)

	out = append(out, clientScaleTargets(res)...)
	out = append(out, combineTargets(res.Combine)...)
	out = append(out, herdTargets(res.Herd, cfg.HoldShort)...)

	for _, a := range res.AdvisoryConns {
		out = append(out, target{What: fmt.Sprintf("server connections holding %s advisory locks, %s", report.Thousands(int64(a.Locks)), a.Config),
			Goal: "≤ 2", Measured: fmt.Sprintf("%d lock sessions (+ %d idle pool connection the Locker never uses)", a.Sessions, a.PoolConns),
			Met: verdict(a.Sessions <= 2 && a.PgLocks >= int64(a.Locks))})
	}
	return out
}

// renderTargets writes the targets section.
func renderTargets(p func(string, ...any), res *results, cfg *config) {
	ts := targets(res, cfg)
	if len(ts) == 0 {
		return
	}
	p("## Targets (issues 8 and 18)\n\n")
	p("Ratios are of medians over the rounds, measured in this run. Where a target is missed, the cause is profiled under [Why targets were missed](#why-targets-were-missed).\n\n")
	tt := &report.Table{Header: []string{"target", "goal", "measured", "verdict"}, TextColumns: 4}
	for _, t := range ts {
		tt.Rows = append(tt.Rows, []string{t.What, t.Goal, t.Measured, t.Met})
	}
	p("%s\n", tt.Markdown())
}

// clientScaleTargets is scenario 12's target for each pgfence system: no
// collapse past the knee (every client count above the peak's keeps at
// least collapseFloor of the peak throughput).
func clientScaleTargets(res *results) []target {
	cs := res.ClientScale
	if cs == nil {
		return nil
	}
	var out []target
	for _, s := range cs.Systems {
		if !isPgfence(s) {
			continue
		}
		t := target{What: fmt.Sprintf("%s, uncontended, %s clients: no collapse past the knee", s, joinInts(cs.Counts)),
			Goal: fmt.Sprintf("every count above the knee ≥ %.1fx the peak", collapseFloor), Met: notMeasured, Measured: "n/a"}
		if k, ok := kneeOf(cs.curve(s)); ok {
			t.Measured, t.Met = k.describe(), verdict(k.holds(collapseFloor))
		}
		out = append(out, t)
	}
	return out
}
