package main

import (
	"context"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgfence/pgfence/bench/internal/chart"
	"github.com/pgfence/pgfence/bench/internal/harness"
	"github.com/pgfence/pgfence/bench/internal/report"
	"github.com/pgfence/pgfence/bench/internal/systems"
)

// Scenario 12: client scale. Uncontended acquire+release throughput, every
// client on its own name as in scenario 1, from 1 to 256 clients, for
// pgfence's session strategies and the raw ceilings: where each system's
// throughput peaks (its knee), and whether it holds past it.

// scaleClientCounts are scenario 12's client counts.
var scaleClientCounts = []int{1, 2, 4, 8, 16, 32, 64, 128, 256}

// clientScaleSpecs are scenario 12's systems: pgfence's first, then the
// ceilings their ratios divide by, and raw-advisory-token, the advisory
// ceiling with pgfence's durable token draw (one statement per grant, a
// WAL flush when the draw wrote one), which tells the server's bound from
// the library's.
var clientScaleSpecs = []harness.Spec{
	systems.Leasetable,
	systems.Advisory,
	systems.AdvisoryDefault,
	systems.AdvisoryCeiling,
	systems.AdvisoryTokenCeiling,
	systems.UpdateCeiling,
}

// clientScaleRounds is how many times scenario 12 measures each point. One
// round of 54 points of 5s (+1s warm-up) takes about 6 minutes; a second
// would exceed the scenario's budget of 8 minutes, so the system order
// alternates between client counts instead (no system always runs first or
// last).
const clientScaleRounds = 1

// collapseFloor is the "no collapse past the knee" target: throughput at
// every client count above the knee is at least this share of the peak.
const collapseFloor = 0.8

// scaleProfileDuration bounds the extra, unmeasured point at the largest
// client count during which the server's wait events are sampled.
const scaleProfileDuration = 2 * time.Second

// scaleConnMargin is the connections scenario 12 keeps free besides one per
// client: the Locker's own pool connection and the benchmark's
// bookkeeping (the wait-event sampler, the backend count).
const scaleConnMargin = 4

// clientScaleResult is what scenario 12 measured.
type clientScaleResult struct {
	Rounds         int
	Counts         []int // client counts measured
	Skipped        []int // client counts that did not fit in max_connections
	MaxConnections int
	Systems        []string     // in report order
	Specs          []systemInfo // the systems' descriptions
	Points         []scalePoint
	Profiles       []scaleProfile // one per system at the largest count
	LoadStart      string
	LoadEnd        string
}

// scalePoint is one system at one client count over every round, with the
// machine's load average after each round's point.
type scalePoint struct {
	cyclePoint
	Loads []string
}

// scaleProfile is the wait-event sample of one system's profiled point.
type scaleProfile struct {
	waitSample
	Throughput float64 // cycles/s during the profiled point
	Errors     int64
}

// point returns the point of system at clients, or nil.
func (cs *clientScaleResult) point(system string, clients int) *scalePoint {
	for i := range cs.Points {
		if p := &cs.Points[i]; p.System == system && p.Clients == clients {
			return p
		}
	}
	return nil
}

// add records one round's result and the load after it.
func (cs *clientScaleResult) add(system string, clients int, r harness.CycleResult, load string) {
	if p := cs.point(system, clients); p != nil {
		p.Rounds = append(p.Rounds, r)
		p.Loads = append(p.Loads, load)
		return
	}
	cs.Points = append(cs.Points, scalePoint{
		cyclePoint: cyclePoint{System: system, Clients: clients, Rounds: []harness.CycleResult{r}},
		Loads:      []string{load}})
}

// throughput returns the median throughput of system at clients, NaN when
// not measured.
func (cs *clientScaleResult) throughput(system string, clients int) float64 {
	if p := cs.point(system, clients); p != nil {
		return p.agg().Throughput
	}
	return math.NaN()
}

// curve returns system's throughput at every measured client count.
func (cs *clientScaleResult) curve(system string) []clientsTP {
	var out []clientsTP
	for _, c := range cs.Counts {
		out = append(out, clientsTP{Clients: c, TP: cs.throughput(system, c)})
	}
	return out
}

// clientsTP is a throughput at a client count; TP is NaN when the point
// was not measured.
type clientsTP struct {
	Clients int
	TP      float64
}

// kneeInfo is where a throughput curve peaks and how it holds past it.
type kneeInfo struct {
	Knee  int     // client count of the peak (the lowest, on a tie)
	Peak  float64 // throughput there
	Above int     // measured client counts above the knee
	// Worst is the client count above the knee with the lowest throughput
	// (0 when Above is 0), WorstTP that throughput.
	Worst   int
	WorstTP float64
}

// kneeOf finds the knee of a curve: the client count of the peak
// throughput, and the lowest throughput at a larger client count. Points
// that were not measured (NaN) are skipped; a measured point with no
// successful cycle counts as 0. It reports false when no point was
// measured.
func kneeOf(curve []clientsTP) (kneeInfo, bool) {
	pts := slices.Clone(curve)
	slices.SortFunc(pts, func(a, b clientsTP) int { return a.Clients - b.Clients })
	var k kneeInfo
	found := false
	for _, p := range pts {
		if math.IsNaN(p.TP) {
			continue
		}
		if !found || p.TP > k.Peak {
			k.Knee, k.Peak, found = p.Clients, p.TP, true
		}
	}
	if !found {
		return k, false
	}
	for _, p := range pts {
		if math.IsNaN(p.TP) || p.Clients <= k.Knee {
			continue
		}
		if k.Above == 0 || p.TP < k.WorstTP {
			k.Worst, k.WorstTP = p.Clients, p.TP
		}
		k.Above++
	}
	return k, true
}

// holds reports whether every point above the knee reaches floor times the
// peak (trivially true when the peak is at the largest count).
func (k kneeInfo) holds(floor float64) bool {
	return k.Above == 0 || k.WorstTP >= floor*k.Peak
}

// worstRatio is the lowest throughput above the knee over the peak, NaN
// when there is no point above it or no peak.
func (k kneeInfo) worstRatio() float64 {
	if k.Above == 0 || k.Peak <= 0 {
		return math.NaN()
	}
	return k.WorstTP / k.Peak
}

// describe gives a knee's figures for the report.
func (k kneeInfo) describe() string {
	s := fmt.Sprintf("peak %s cycles/s at %d clients", report.Rate(k.Peak), k.Knee)
	if k.Above == 0 {
		return s + "; no larger client count measured"
	}
	counts := "client counts"
	if k.Above == 1 {
		counts = "client count"
	}
	return s + fmt.Sprintf("; lowest above it %s at %d clients (%s the peak, over %d larger %s)",
		report.Rate(k.WorstTP), k.Worst, report.Ratio(k.worstRatio(), 1), k.Above, counts)
}

// clientScaleOrder returns the systems in the order they run at the
// count-th client count of round round: reversed every other time, so no
// system always runs first, or last, after the previous count's points.
func clientScaleOrder(specs []harness.Spec, count, round int) []harness.Spec {
	out := slices.Clone(specs)
	if (count+round)%2 == 1 {
		slices.Reverse(out)
	}
	return out
}

// fittingCounts splits counts into those whose points fit in the server's
// free connections (each needs one per client plus scaleConnMargin) and
// those that do not.
func fittingCounts(counts []int, free int) (fit, skipped []int) {
	for _, c := range counts {
		if c+scaleConnMargin <= free {
			fit = append(fit, c)
		} else {
			skipped = append(skipped, c)
		}
	}
	return fit, skipped
}

// Statements of scenario 12's connection bookkeeping.
const (
	connSettings = `SELECT current_setting('max_connections')::int, current_setting('superuser_reserved_connections')::int,
       (SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend' AND pid <> pg_backend_pid())::int`
	clientBackends = `SELECT count(*)::int FROM pg_stat_activity WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()`
)

// waitBackends waits, for at most timeout, until the server has at most n
// client backends besides the caller's: a closed pool's connections exit
// asynchronously, and the next point must not find them still counted
// against max_connections.
func waitBackends(ctx context.Context, url string, n int, timeout time.Duration) error {
	return withConn(ctx, url, func(c *pgx.Conn) error {
		deadline := time.Now().Add(timeout)
		for {
			var have int
			if err := c.QueryRow(ctx, clientBackends).Scan(&have); err != nil {
				return err
			}
			if have <= n {
				return nil
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("%d client backends still open after %v (want at most %d)", have, timeout, n)
			}
			time.Sleep(20 * time.Millisecond)
		}
	})
}

// prime makes every client complete one cycle on its own name, all at
// once, so that the pool connections and lock sessions a point uses are
// open before its warm-up starts (dialing 256 sessions takes longer than a
// quick run's warm-up). It returns the first failure.
func prime(ctx context.Context, sys harness.System, ns []string) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	errs := make([]error, len(ns))
	var wg sync.WaitGroup
	for w, name := range ns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rel, err := sys.TryAcquire(ctx, name)
			if err == nil {
				err = rel(ctx)
			}
			errs[w] = err
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// clientScale is scenario 12.
func (r *runner) clientScale(ctx context.Context) error {
	specs := clientScaleSpecs
	if len(r.cfg.Systems) > 0 {
		specs = slices.DeleteFunc(slices.Clone(specs), func(s harness.Spec) bool { return !slices.Contains(r.cfg.Systems, s.Name) })
	}
	if len(specs) == 0 {
		r.note("12: none of %s named in -systems", strings.Join(specNames(clientScaleSpecs), ", "))
		return nil
	}
	var maxConns, reserved, inUse int
	if err := withConn(ctx, r.env.DatabaseURL, func(c *pgx.Conn) error {
		return c.QueryRow(ctx, connSettings).Scan(&maxConns, &reserved, &inUse)
	}); err != nil {
		return err
	}
	cs := &clientScaleResult{Rounds: clientScaleRounds, MaxConnections: maxConns, Systems: specNames(specs), LoadStart: loadAvg()}
	for _, s := range specs {
		cs.Specs = append(cs.Specs, systemInfo{Name: s.Name, Kind: string(s.Kind), Note: s.Note})
	}
	cs.Counts, cs.Skipped = fittingCounts(scaleClientCounts, maxConns-reserved-inUse)
	if len(cs.Skipped) > 0 {
		r.note("12: client counts %v skipped: max_connections %d (%d reserved, %d in use) leaves too few connections", cs.Skipped, maxConns, reserved, inUse)
	}
	r.res.ClientScale = cs
	fmt.Printf("scenario 12: client scale, uncontended acquire+release at %v clients, %d system(s), %v per point (+%v warm-up), %d round(s); max_connections %d\n",
		cs.Counts, len(specs), r.cfg.Duration, r.cfg.Warmup, cs.Rounds, maxConns)

	// point opens s for clients, primes it and runs one point; profile, when
	// set, samples the server's wait events during it.
	point := func(s harness.Spec, clients int, duration time.Duration, profile bool) (harness.CycleResult, *waitSample, error) {
		ns := names("s12-", clients)
		sys, err := r.open(ctx, s, clients, ns)
		if err != nil {
			return harness.CycleResult{}, nil, err
		}
		if err := prime(ctx, sys, ns); err != nil {
			r.note("12 %s clients=%d: priming cycle failed: %v", s.Name, clients, err)
		}
		var prof *profiler
		if profile {
			// Wait events only: with pg_stat_statements tracking on, 256
			// backends spend half their time on its lock
			// (LWLock:pg_stat_statements), which would hide what bounds
			// the system.
			prof = startProfiler(ctx, r.env.DatabaseURL, s.Name, clients)
		}
		res := harness.RunCycles(ctx, sys, harness.CycleConfig{
			Clients: clients, Warmup: r.cfg.Warmup, Duration: duration,
			Name: func(w, _ int) string { return ns[w] },
		})
		var ws *waitSample
		if prof != nil {
			w := prof.stop(ctx)
			ws = &w
		}
		_ = sys.Close()
		if err := waitBackends(ctx, r.env.DatabaseURL, inUse, 10*time.Second); err != nil {
			r.note("12 %s clients=%d: %v", s.Name, clients, err)
		}
		return res, ws, ctx.Err()
	}

	for round := 1; round <= cs.Rounds; round++ {
		for i, c := range cs.Counts {
			for _, s := range clientScaleOrder(specs, i, round) {
				res, _, err := point(s, c, r.cfg.Duration, false)
				if err != nil {
					return err
				}
				load := loadAvg()
				r.logCycle("12", s.Name, c, &res)
				fmt.Printf("       load %s\n", load)
				cs.add(s.Name, c, res, load)
			}
		}
	}

	// Where the time goes at the largest count, in points of their own so
	// that sampling does not weigh on the measured ones.
	if len(cs.Counts) > 0 {
		c := slices.Max(cs.Counts)
		for _, s := range specs {
			res, ws, err := point(s, c, min(r.cfg.Duration, scaleProfileDuration), true)
			if err != nil {
				return err
			}
			fmt.Printf("  [12] profile %-26s clients=%d %9.0f cycles/s  events %s\n", s.Name, c, res.Throughput(), strings.Join(ws.topEvents(3), ", "))
			cs.Profiles = append(cs.Profiles, scaleProfile{waitSample: *ws, Throughput: res.Throughput(), Errors: res.Errors})
		}
	}
	cs.LoadEnd = loadAvg()
	return nil
}

func specNames(specs []harness.Spec) []string {
	var out []string
	for _, s := range specs {
		out = append(out, s.Name)
	}
	return out
}

// scaleCeilings are the ceilings each pgfence system's ratios divide by.
var scaleCeilings = []string{"raw-advisory", "raw-advisory-token", "raw-2update"}

// isPgfence reports whether system is one of pgfence's (the ceilings are
// not compared to themselves, nor held to the collapse target).
func isPgfence(system string) bool { return strings.HasPrefix(system, "pgfence-") }

// renderClientScale writes scenario 12's section and its chart.
func renderClientScale(p func(string, ...any), res *results, cfg *config, files map[string][]byte) {
	cs := res.ClientScale
	if cs == nil || len(cs.Points) == 0 {
		return
	}
	p("## 12. Client scale\n\n")
	p("Uncontended TryAcquire → Release cycles, every client on its own name (as in scenario 1), at %s clients. pgfence-advisory has MaxSessions = clients (as scenario 1); pgfence-advisory-default keeps the default MaxSessions whatever the client count. Both fill their oldest session up to 32 acquisitions in flight before another opens, so concurrent grants queue on a session and are combined; they differ only past 128 clients. Each point: the system is opened, every client completes one unmeasured cycle (so that pool connections and lock sessions are open), then %v of warm-up and %v measured; the systems run one after another, in reverse order every other client count, %d round(s) (figures are medians over rounds). The server allows %d connections; each point opens at most one per client plus the Locker's own.",
		joinInts(cs.Counts), cfg.Warmup, cfg.Duration, cs.Rounds, cs.MaxConnections)
	if len(cs.Skipped) > 0 {
		p(" Not measured, for want of connections: %s clients.", joinInts(cs.Skipped))
	}
	p(" Load average %s at the start of the scenario, %s at its end (the detail table gives it after each point).\n\n", cs.LoadStart, cs.LoadEnd)
	// Systems that only this scenario measures are not in the Systems table.
	st := &report.Table{Header: []string{"system", "kind", "what one cycle does"}, TextColumns: 3}
	for _, s := range cs.Specs {
		if !slices.ContainsFunc(res.Systems, func(o systemInfo) bool { return o.Name == s.Name }) {
			st.Rows = append(st.Rows, []string{s.Name, s.Kind, s.Note})
		}
	}
	if len(st.Rows) > 0 {
		p("Measured in this scenario only:\n\n%s\n", st.Markdown())
	}

	// Cycles per second: client counts down, systems across.
	mt := &report.Table{Header: append([]string{"clients"}, cs.Systems...)}
	for _, c := range cs.Counts {
		row := []string{strconv.Itoa(c)}
		for _, s := range cs.Systems {
			row = append(row, report.Rate(cs.throughput(s, c)))
		}
		mt.Rows = append(mt.Rows, row)
	}
	p("Cycles per second:\n\n%s\n", mt.Markdown())

	kt := &report.Table{Header: []string{"system", "knee (clients)", "peak cycles/s", "client counts above the knee", "lowest above the knee", "lowest / peak", "no collapse (≥ " + strconv.FormatFloat(collapseFloor, 'f', 1, 64) + "x the peak)"}, TextColumns: 1}
	for _, s := range cs.Systems {
		k, ok := kneeOf(cs.curve(s))
		if !ok {
			kt.Rows = append(kt.Rows, []string{s, "n/a", "n/a", "0", "n/a", "n/a", notMeasured})
			continue
		}
		lowest, v := "—", verdict(k.holds(collapseFloor))
		if k.Above > 0 {
			lowest = fmt.Sprintf("%s at %d", report.Rate(k.WorstTP), k.Worst)
		} else {
			v = "met (peak at the largest count)"
		}
		if !isPgfence(s) {
			v += " (ceiling: reported, not a target)"
		}
		kt.Rows = append(kt.Rows, []string{s, strconv.Itoa(k.Knee), report.Rate(k.Peak), strconv.Itoa(k.Above), lowest, report.Ratio(k.worstRatio(), 1), v})
	}
	p("Knees: the client count of each system's peak throughput, and the lowest throughput at a larger count:\n\n%s\n", kt.Markdown())

	dt := &report.Table{Header: []string{"clients", "system", "cycles/s", "cycle p50", "cycle p99", "errors", "× raw-advisory", "× raw-advisory-token", "× raw-2update", "load after"}, TextColumns: 2}
	for _, c := range cs.Counts {
		for _, s := range cs.Systems {
			pt := cs.point(s, c)
			if pt == nil {
				continue
			}
			a := pt.agg()
			row := []string{strconv.Itoa(c), s, report.Rate(a.Throughput), report.Duration(a.CycleP50), report.Duration(a.CycleP99), errCell(a.Errors)}
			for _, ceil := range scaleCeilings {
				cell := ""
				if isPgfence(s) {
					cell = report.Ratio(a.Throughput, cs.throughput(ceil, c))
				}
				row = append(row, cell)
			}
			dt.Rows = append(dt.Rows, append(row, strings.Join(pt.Loads, "; ")))
		}
	}
	p("Every point (latencies are of a whole successful cycle; errors are failed calls, not busy locks; load is the 1-, 5- and 15-minute load average after the point):\n\n%s\n", dt.Markdown())

	lc := &chart.Line{Title: "Uncontended acquire+release throughput against clients", XLabel: "clients (distinct names, log2 scale)",
		YLabel: "cycles per second", XLog2: true}
	for _, c := range cs.Counts {
		lc.XTicks = append(lc.XTicks, float64(c))
	}
	for _, s := range cs.Systems {
		ser := chart.Series{Name: s}
		for _, pt := range cs.curve(s) {
			if !math.IsNaN(pt.TP) && pt.TP > 0 {
				ser.Points = append(ser.Points, chart.Point{X: float64(pt.Clients), Y: pt.TP})
			}
		}
		lc.Series = append(lc.Series, ser)
	}
	if svg, err := lc.SVG(); err == nil {
		files["scale-clients.svg"] = svg
		p("![Throughput against clients, 1 to %d](scale-clients.svg)\n\n", slices.Max(cs.Counts))
	}

	if len(cs.Profiles) > 0 {
		pt := &report.Table{Header: []string{"system", "wait events", "cycles/s (profiled)", "errors", "snapshots", "active backends per snapshot"}, TextColumns: 2}
		for _, w := range cs.Profiles {
			active := "n/a"
			if w.Samples > 0 {
				active = strconv.FormatFloat(float64(w.Active)/float64(w.Samples), 'f', 1, 64)
			}
			pt.Rows = append(pt.Rows, []string{w.System, strings.Join(w.topEvents(5), ", "), report.Rate(w.Throughput), errCell(w.Errors), strconv.Itoa(w.Samples), active})
		}
		p("Where the server's time goes at %d clients: one more point per system (%v after the warm-up, not in the figures above), pg_stat_activity sampled every 10ms: the share of active backend observations per wait event (CPU = active, not waiting). pg_stat_statements stays off: at this many backends its own lock would dominate the wait events.\n\n%s\n",
			cs.Profiles[0].Clients, min(cfg.Duration, scaleProfileDuration), pt.Markdown())
	}
	renderScaleMisses(p, cs)
}

// profileOf returns system's profiled point, or nil.
func (cs *clientScaleResult) profileOf(system string) *waitSample {
	for i := range cs.Profiles {
		if cs.Profiles[i].System == system {
			return &cs.Profiles[i].waitSample
		}
	}
	return nil
}

// renderScaleMisses explains, with this run's figures, each pgfence
// system that fell below the floor past its knee, next to the ceiling that
// does the same work per grant.
func renderScaleMisses(p func(string, ...any), cs *clientScaleResult) {
	if len(cs.Counts) == 0 {
		return
	}
	top := slices.Max(cs.Counts)
	events := func(system string) string {
		w := cs.profileOf(system)
		if w == nil || w.Active == 0 {
			return "not profiled"
		}
		return fmt.Sprintf("%s; %.1f active backends per snapshot", strings.Join(w.topEvents(3), ", "), float64(w.Active)/float64(max(w.Samples, 1)))
	}
	fall := func(system string) string {
		k, ok := kneeOf(cs.curve(system))
		if !ok {
			return "not measured"
		}
		return k.describe()
	}
	tp := func(system string) string { return report.Rate(cs.throughput(system, top)) }
	ratio := func(a, b string) string { return report.Ratio(cs.throughput(a, top), cs.throughput(b, top)) }
	var b strings.Builder
	for _, s := range cs.Systems {
		k, ok := kneeOf(cs.curve(s))
		if !isPgfence(s) || !ok || k.holds(collapseFloor) {
			continue
		}
		switch s {
		case "pgfence-advisory":
			fmt.Fprintf(&b, "- **pgfence-advisory** (%s) may open one lock session per client (new keys go to another session once 32 acquisitions are in flight on every open one). At %d clients it ran %s cycles/s (%s raw-advisory-token's figure); raw-advisory-token itself: %s. Wait events at %d clients: pgfence-advisory %s; raw-advisory-token %s. Past 32 acquisitions in flight per session it opens more sessions, up to one per client, each running statements of its own (and a draw on one makes the draws of the others flush until its record is on disk), where the default stops at 4. The same Locker with the default MaxSessions (pgfence-advisory-default) ran %s cycles/s at %d clients (%s pgfence-advisory), its queued grants combined into one statement (and at most one flush) per session turn.\n",
				fall(s), top, tp(s), ratio(s, "raw-advisory-token"), fall("raw-advisory-token"), top, events(s), events("raw-advisory-token"),
				tp("pgfence-advisory-default"), top, ratio("pgfence-advisory-default", s))
		case "pgfence-leasetable":
			fmt.Fprintf(&b, "- **pgfence-leasetable** (%s) combines the concurrent acquires, and the concurrent releases, of its Locker into one statement each, with one statement of each kind in flight: past the knee a batch takes longer as it grows (cycle p50 %s at the knee, %s at %d clients) and its pool's other connections stay idle. Wait events at %d clients: %s. raw-2update, which runs every cycle's UPDATEs on its own connection: %s.\n",
				fall(s), report.Duration(cs.point(s, k.Knee).agg().CycleP50), report.Duration(scaleP50(cs, s, top)), top, top, events(s), fall("raw-2update"))
		default:
			fmt.Fprintf(&b, "- **%s**: %s. Wait events at %d clients: %s.\n", s, fall(s), top, events(s))
		}
	}
	if b.Len() > 0 {
		p("Why a pgfence system falls past its knee in this run (figures from the tables above; on a machine shared with other work, compare with the ceilings measured beside it):\n\n%s\n", b.String())
	}
}

// scaleP50 is the median cycle p50 of system at clients, or -1.
func scaleP50(cs *clientScaleResult, system string, clients int) time.Duration {
	if pt := cs.point(system, clients); pt != nil {
		return pt.agg().CycleP50
	}
	return -1
}

func joinInts(xs []int) string {
	var s []string
	for _, x := range xs {
		s = append(s, strconv.Itoa(x))
	}
	return strings.Join(s, ", ")
}
