package main

import (
	"time"

	"github.com/pgfence/pgfence/bench/internal/harness"
	"github.com/pgfence/pgfence/bench/internal/stats"
	"github.com/pgfence/pgfence/bench/internal/systems"
)

// cyclePoint is one system at one client count, over every round.
type cyclePoint struct {
	System  string
	Clients int
	Rounds  []harness.CycleResult
}

// cycleAgg is the median over rounds of each figure of a cyclePoint, and the
// total of its errors.
type cycleAgg struct {
	Throughput, BusyRate float64
	CycleP50, CycleP99   time.Duration
	AcqP50, AcqP99       time.Duration
	Errors               int64
}

func (p *cyclePoint) agg() cycleAgg {
	var tp, busy, c50, c99, a50, a99 []float64
	var errs int64
	for i := range p.Rounds {
		r := &p.Rounds[i]
		tp = append(tp, r.Throughput())
		busy = append(busy, stats.Rate(int(r.Busy), r.Elapsed))
		c50 = append(c50, float64(r.Cycle.P50))
		c99 = append(c99, float64(r.Cycle.P99))
		a50 = append(a50, float64(r.Acquire.P50))
		a99 = append(a99, float64(r.Acquire.P99))
		errs += r.Errors
	}
	return cycleAgg{
		Throughput: stats.Median(tp), BusyRate: stats.Median(busy),
		CycleP50: medianDuration(c50), CycleP99: medianDuration(c99),
		AcqP50: medianDuration(a50), AcqP99: medianDuration(a99), Errors: errs,
	}
}

func medianDuration(v []float64) time.Duration {
	m := stats.Median(v)
	if m != m { // NaN: no rounds
		return -1
	}
	return time.Duration(m)
}

// addCycle appends a round's result to the point of (system, clients),
// creating it in first-seen order.
func addCycle(points *[]cyclePoint, system string, clients int, r harness.CycleResult) {
	for i := range *points {
		if p := &(*points)[i]; p.System == system && p.Clients == clients {
			p.Rounds = append(p.Rounds, r)
			return
		}
	}
	*points = append(*points, cyclePoint{System: system, Clients: clients, Rounds: []harness.CycleResult{r}})
}

// pgbenchPoint is one pgbench script at one client count, over every round.
type pgbenchPoint struct {
	Script  string
	Clients int
	Rounds  []systems.PgbenchResult
}

func (p *pgbenchPoint) tps() float64 {
	var v []float64
	for _, r := range p.Rounds {
		v = append(v, r.TPS)
	}
	return stats.Median(v)
}

func (p *pgbenchPoint) latencyAvg() time.Duration {
	var v []float64
	for _, r := range p.Rounds {
		v = append(v, float64(r.LatencyAvg))
	}
	return medianDuration(v)
}

func addPgbench(points *[]pgbenchPoint, script string, clients int, r systems.PgbenchResult) {
	for i := range *points {
		if p := &(*points)[i]; p.Script == script && p.Clients == clients {
			p.Rounds = append(p.Rounds, r)
			return
		}
	}
	*points = append(*points, pgbenchPoint{Script: script, Clients: clients, Rounds: []systems.PgbenchResult{r}})
}

// writePoint is one write path over every round.
type writePoint struct {
	Writer  string
	Clients int
	Rounds  []harness.WriteResult
}

type writeAgg struct {
	Throughput float64
	P50, P99   time.Duration
	Errors     int64
}

func (p *writePoint) agg() writeAgg {
	var tp, p50, p99 []float64
	var errs int64
	for i := range p.Rounds {
		r := &p.Rounds[i]
		tp = append(tp, r.Throughput())
		p50 = append(p50, float64(r.Latency.P50))
		p99 = append(p99, float64(r.Latency.P99))
		errs += r.Errors
	}
	return writeAgg{Throughput: stats.Median(tp), P50: medianDuration(p50), P99: medianDuration(p99), Errors: errs}
}

func addWrite(points *[]writePoint, writer string, clients int, r harness.WriteResult) {
	for i := range *points {
		if p := &(*points)[i]; p.Writer == writer {
			p.Rounds = append(p.Rounds, r)
			return
		}
	}
	*points = append(*points, writePoint{Writer: writer, Clients: clients, Rounds: []harness.WriteResult{r}})
}
