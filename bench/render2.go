package main

import (
	"fmt"
	"math"
	"strconv"
	"strings"
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
		{"fence.Update.UnderLease", "within 25% (≥ 0.75x)", 0.75},
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
	p("## Targets (issue 8)\n\n")
	p("Ratios are of medians over the rounds, measured in this run. Where a target is missed, the cause is profiled under [Why targets were missed](#why-targets-were-missed).\n\n")
	tt := &report.Table{Header: []string{"target", "goal", "measured", "verdict"}, TextColumns: 4}
	for _, t := range ts {
		tt.Rows = append(tt.Rows, []string{t.What, t.Goal, t.Measured, t.Met})
	}
	p("%s\n", tt.Markdown())
}

// renderPhase2 writes scenarios 6 and 7 and the profiles.
func renderPhase2(p func(string, ...any), res *results) {
	if rn := res.Renewal; rn != nil {
		p("## 6. Renewal cost\n\n")
		p("One leasetable.Locker acquires %s leases (8 goroutines, TTL %v, renewed every %v), then holds them; after one more interval, every statement the Locker's pool runs is counted (a pgx tracer on the pool) for %.1f intervals. pg_stat_statements counts the renewal statement on the server side as a cross-check.\n\n",
			report.Thousands(int64(rn.Leases)), rn.TTL, rn.Interval, rn.Intervals())
		t := &report.Table{Header: []string{"figure", "value"}, TextColumns: 1}
		pgss := "n/a (pg_stat_statements unavailable)"
		if rn.PgssCalls >= 0 {
			pgss = fmt.Sprintf("%d calls, %s rows renewed", rn.PgssCalls, report.Thousands(rn.PgssRows))
		}
		mean := "n/a"
		if rn.Statements > 0 {
			mean = report.Duration(rn.StmtTotalTime / time.Duration(rn.Statements))
		}
		t.Rows = append(t.Rows,
			[]string{"leases held", report.Thousands(int64(rn.Leases))},
			[]string{"time to acquire them", report.Duration(rn.AcquireTime)},
			[]string{"window", fmt.Sprintf("%v (%.1f intervals)", rn.Held.Round(time.Millisecond), rn.Intervals())},
			[]string{"statements issued by the Locker", report.Thousands(rn.Statements)},
			[]string{"statements per second", fmt.Sprintf("%.2f", float64(rn.Statements)/rn.Held.Seconds())},
			[]string{"statements per 1,000 leases per interval", fmt.Sprintf("%.3f", rn.PerThousandPerInterval())},
			[]string{"renewal statement latency (mean, max)", mean + ", " + report.Duration(rn.StmtMax)},
			[]string{"pg_stat_statements, renewal statement", pgss},
			[]string{"leases still held at the end (table)", report.Thousands(rn.LiveAtEnd)},
			[]string{"leases the Locker reported lost", strconv.Itoa(rn.LostAtEnd)},
		)
		p("%s\n", t.Markdown())
	}

	if len(res.AdvisoryConns) > 0 || len(res.Uncontended) > 0 {
		p("## 7. Advisory: connections and throughput\n\n")
	}
	if len(res.AdvisoryConns) > 0 {
		a0 := res.AdvisoryConns[0]
		p("One advisory.Locker takes %s session locks (%d goroutines calling TryLock on distinct Name keys) and holds them; then the client backends of the benchmark database are counted in pg_stat_activity (excluding the counting connection): the lock sessions by their application_name (`pgfence-advisory`), and the rest, which is the one connection of the pool handed to advisory.New (the Locker dials its own sessions and never uses the pool's). pg_locks confirms the locks are granted.\n\n",
			report.Thousands(int64(a0.Locks)), a0.Goroutines)
		t := &report.Table{Header: []string{"Locker config", "locks", "time to lock all", "lock sessions", "other client backends", "advisory locks in pg_locks"}, TextColumns: 1}
		for _, a := range res.AdvisoryConns {
			t.Rows = append(t.Rows, []string{a.Config, report.Thousands(int64(a.Locks)), report.Duration(a.LockTime),
				strconv.FormatInt(a.Sessions, 10), strconv.FormatInt(a.PoolConns, 10), report.Thousands(a.PgLocks)})
		}
		p("%s\n", t.Markdown())
	}
	if len(res.Uncontended) > 0 {
		clients := uniqueClients(res.Uncontended)
		t := &report.Table{Header: []string{"clients", "raw-advisory", "raw-advisory-token", "pgfence-advisory", "× raw-advisory", "raw-advisory-xact", "pgfence-advisory-xact", "× raw-advisory-xact"}}
		any := false
		for _, c := range clients {
			ra, rt, pa := cycleTP(res.Uncontended, "raw-advisory", c), cycleTP(res.Uncontended, "raw-advisory-token", c), cycleTP(res.Uncontended, "pgfence-advisory", c)
			rx, px := cycleTP(res.Uncontended, "raw-advisory-xact", c), cycleTP(res.Uncontended, "pgfence-advisory-xact", c)
			if math.IsNaN(pa) && math.IsNaN(px) {
				continue
			}
			any = true
			t.Rows = append(t.Rows, []string{strconv.Itoa(c), report.Rate(ra), report.Rate(rt), report.Rate(pa), report.Ratio(pa, ra),
				report.Rate(rx), report.Rate(px), report.Ratio(px, rx)})
		}
		if any {
			p("Acquire+release throughput (cycles/s, from scenario 1): pgfence's advisory locks with their fencing token against raw lock/unlock, and against raw-advisory-token, the raw statements plus the same durable token draw.\n\n%s\n", t.Markdown())
		}
	}

	if len(res.WaitEvents) > 0 || len(res.WriteWaits) > 0 {
		p("## Where the server spends the time\n\n")
		p("During the last round of scenario 1 at %d clients, and of scenario 4, pg_stat_activity was sampled every 10ms: the share of active backend observations per wait event (CPU = active, not waiting). pg_stat_statements was reset before each point: its top statements by total execution time follow (mean server-side execution time per call; the client's round trip and the commit's WAL flush are not in it, except for statements that call pgfence_next_token(), whose flush happens at commit).\n\n",
			func() int {
				if len(res.WaitEvents) > 0 {
					return res.WaitEvents[0].Clients
				}
				return 0
			}())
		for _, group := range [][]waitSample{res.WaitEvents, res.WriteWaits} {
			if len(group) == 0 {
				continue
			}
			t := &report.Table{Header: []string{"system", "snapshots", "busiest backends: wait events", "top statements (calls, mean ms)"}, TextColumns: 4}
			for _, w := range group {
				var st []string
				for _, s := range w.Statements {
					st = append(st, fmt.Sprintf("`%s` (%s, %.3f)", shorten(s.Query, 90), report.Thousands(s.Calls), s.MeanMs))
				}
				t.Rows = append(t.Rows, []string{w.System, strconv.Itoa(w.Samples), strings.Join(w.topEvents(4), ", "), strings.Join(st, "<br>")})
			}
			p("%s\n", t.Markdown())
		}
		renderPlans(p, res.WriteWaits)
	}
}

// renderPlans writes the EXPLAIN ANALYZE of one write of each write path:
// a summary table, then the plans in a collapsed block.
func renderPlans(p func(string, ...any), ws []waitSample) {
	t := &report.Table{Header: []string{"write path", "execution time", "WAL", "buffers", "row locks"}, TextColumns: 1}
	var plans strings.Builder
	for _, w := range ws {
		if w.Plan == "" {
			continue
		}
		exec, wal, buf := "", "", ""
		locks := "no"
		for _, l := range strings.Split(w.Plan, "\n") {
			l = strings.TrimSpace(l)
			switch {
			case strings.HasPrefix(l, "Execution Time:"):
				exec = strings.TrimSpace(strings.TrimPrefix(l, "Execution Time:"))
			case strings.HasPrefix(l, "WAL:") && wal == "":
				wal = strings.TrimPrefix(l, "WAL: ")
			case strings.HasPrefix(l, "Buffers:") && buf == "":
				buf = strings.TrimPrefix(l, "Buffers: ")
			case strings.Contains(l, "LockRows"):
				locks = "LockRows (FOR UPDATE/SHARE)"
			}
		}
		t.Rows = append(t.Rows, []string{w.System, exec, wal, buf, locks})
		fmt.Fprintf(&plans, "%s:\n\n```\n%s\n```\n\n", w.System, w.Plan)
	}
	if len(t.Rows) == 0 {
		return
	}
	p("EXPLAIN (ANALYZE, BUFFERS, WAL) of one write of each path after its last round, in a rolled-back transaction (the first WAL and buffer lines are the top node's, which include its children):\n\n%s\n", t.Markdown())
	p("<details><summary>Plans</summary>\n\n%s</details>\n\n", plans.String())
}

func shorten(s string, n int) string {
	s = strings.ReplaceAll(s, "`", "'")
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
