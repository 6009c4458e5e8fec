package main

import (
	"context"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgfence/pgfence/bench/internal/harness"
	"github.com/pgfence/pgfence/bench/internal/report"
	"github.com/pgfence/pgfence/bench/internal/systems"
)

// Scenario 10 measures, in one run, pgfence's session advisory locks, whose
// grants queued on a session are combined into one statement (issue 18),
// against raw lock/unlock with and without a token draw. The figures of the
// package before combining, measured side by side when it landed, are kept
// in results/advisory-combine.md's history note.

// The arms of scenario 10.
const (
	armRaw         = "raw-advisory"
	armRawToken    = "raw-advisory-token"
	armAfter       = "pgfence, MaxSessions 4"
	armAfterByConn = "pgfence, MaxSessions = clients"
)

var combineArms = []string{armRaw, armRawToken, armAfter, armAfterByConn}

// combinePoint is one arm at one client count in one round.
type combinePoint struct {
	Arm      string
	Clients  int
	Round    int
	TP       float64       // cycles/s
	Acquire  time.Duration // p50 of TryAcquire
	Cycle    time.Duration // p50 of a cycle
	Grants   int64         // successful cycles, warm-up included
	Xids     int64         // transaction ids assigned over the point (warm-up included)
	WALBytes int64         // WAL written over the point
	Syncs    int64         // WAL flushes over the point (pg_stat_wal.wal_sync)
	Span     time.Duration // warm-up plus measured time
	// ServerCPU is the CPU time of the cluster's processes over the point
	// (when ServerOK: measured); ClientCPU, of this process (the benchmark
	// and the arm's clients), warm-up included in both.
	ServerCPU, ClientCPU time.Duration
	ServerOK             bool
	Errors               int64
	Load                 string // load average after the point
}

// xidsPer1000 is the point's transaction ids per 1,000 grants.
func (p combinePoint) xidsPer1000() float64 {
	if p.Grants == 0 {
		return math.NaN()
	}
	return float64(p.Xids) * 1000 / float64(p.Grants)
}

// serverCounters reads the next transaction id to be assigned, the WAL
// insert position (bytes since 0/0) and the number of WAL flushes the
// server made (pg_stat_wal, as reported so far: backends report at exit,
// so it is read statsSettle after the point's connections closed); none of
// them assigns a transaction id.
const serverCounters = `SELECT pg_catalog.pg_snapshot_xmax(pg_catalog.pg_current_snapshot())::text::int8,
       pg_catalog.pg_wal_lsn_diff(pg_catalog.pg_current_wal_lsn(), '0/0')::int8,
       (SELECT w.wal_sync FROM pg_catalog.pg_stat_wal w)`

// statsSettle is how long after a point's connections closed its WAL
// flush count is read: their backends report it as they exit, and the WAL
// writer at its next cycle (wal_writer_delay, 200ms by default).
const statsSettle = time.Second

// syncsPer1000 is the point's WAL flushes per 1,000 grants.
func (p combinePoint) syncsPer1000() float64 {
	if p.Grants == 0 {
		return math.NaN()
	}
	return float64(p.Syncs) * 1000 / float64(p.Grants)
}

// coresBusy is the point's CPU time, server and client together, over its
// span: how many of the machine's cores the arm kept busy (NaN when the
// server's CPU was not measured).
func (p combinePoint) coresBusy() float64 {
	if p.Span <= 0 || !p.ServerOK {
		return math.NaN()
	}
	return (p.ServerCPU + p.ClientCPU).Seconds() / p.Span.Seconds()
}

// cpuPerGrant is server (or client) CPU microseconds per grant.
func (p combinePoint) cpuPerGrant(server bool) float64 {
	d := p.ClientCPU
	if server {
		if !p.ServerOK {
			return math.NaN()
		}
		d = p.ServerCPU
	}
	if p.Grants == 0 {
		return math.NaN()
	}
	return float64(d.Microseconds()) / float64(p.Grants)
}

// syncRate is the point's WAL flushes per second.
func (p combinePoint) syncRate() float64 {
	if p.Span <= 0 {
		return math.NaN()
	}
	return float64(p.Syncs) / p.Span.Seconds()
}

// openCombineArm opens arm for clients: the ceilings, and the pgfence
// systems of scenarios 12 and 1 (default MaxSessions, and one session per
// client).
func (r *runner) openCombineArm(ctx context.Context, arm string, clients int) (harness.System, error) {
	spec := map[string]harness.Spec{
		armRaw:         systems.AdvisoryCeiling,
		armRawToken:    systems.AdvisoryTokenCeiling,
		armAfter:       systems.AdvisoryDefault,
		armAfterByConn: systems.Advisory,
	}[arm]
	if spec.Open == nil {
		return nil, fmt.Errorf("no arm %q", arm)
	}
	return spec.Open(ctx, r.env, clients)
}

// combineClients are scenario 10's client counts.
var combineClients = []int{16, 64}

// advisoryCombine is scenario 10.
func (r *runner) advisoryCombine(ctx context.Context) error {
	fmt.Printf("scenario 10: advisory session locks with combined grants, clients %v, %v per point (+%v warm-up), %d rounds\n",
		combineClients, r.cfg.Duration, r.cfg.Warmup, r.cfg.Rounds)
	loadStart := loadAvg()
	cpu := findServerCPU(ctx, r.env.DatabaseURL)
	if !cpu.ok() {
		r.note("10: server CPU not measured: %s", cpu.why)
	}
	var pts []combinePoint
	for round := 1; round <= r.cfg.Rounds; round++ {
		for _, c := range combineClients {
			ns := names("s10-", c)
			arms := slices.Clone(combineArms)
			if round%2 == 0 {
				slices.Reverse(arms) // no arm always runs last
			}
			for _, arm := range arms {
				sys, err := r.openCombineArm(ctx, arm, c)
				if err != nil {
					return fmt.Errorf("open %s: %w", arm, err)
				}
				var xid0, wal0, sync0, xid1, wal1, sync1 int64
				if err := withConn(ctx, r.env.DatabaseURL, func(conn *pgx.Conn) error {
					return conn.QueryRow(ctx, serverCounters).Scan(&xid0, &wal0, &sync0)
				}); err != nil {
					_ = sys.Close()
					return err
				}
				srv0, srvErr := cpu.read()
				u0, s0 := processCPU()
				t0 := time.Now()
				res := harness.RunCycles(ctx, sys, harness.CycleConfig{
					Clients: c, Warmup: r.cfg.Warmup, Duration: r.cfg.Duration,
					Name: func(w, _ int) string { return ns[w] },
				})
				t1 := time.Now()
				u1, s1 := processCPU()
				srv1, srvErr1 := cpu.read()
				err = withConn(ctx, r.env.DatabaseURL, func(conn *pgx.Conn) error {
					return conn.QueryRow(ctx, serverCounters).Scan(&xid1, &wal1, &sync1)
				})
				_ = sys.Close()
				if err != nil {
					return err
				}
				time.Sleep(statsSettle)
				if err := withConn(ctx, r.env.DatabaseURL, func(conn *pgx.Conn) error {
					var x, w int64
					return conn.QueryRow(ctx, serverCounters).Scan(&x, &w, &sync1)
				}); err != nil {
					return err
				}
				r.logCycle("10", arm, c, &res)
				p := combinePoint{Arm: arm, Clients: c, Round: round, TP: res.Throughput(), Acquire: res.Acquire.P50,
					Cycle: res.Cycle.P50, Grants: res.Total, Xids: xid1 - xid0, WALBytes: wal1 - wal0, Syncs: sync1 - sync0, Span: t1.Sub(t0),
					ServerCPU: srv1 - srv0, ServerOK: srvErr == nil && srvErr1 == nil, ClientCPU: u1 - u0 + s1 - s0, Errors: res.Errors, Load: loadAvg()}
				fmt.Printf("       xids/1000 grants %.0f, WAL %.0f B/grant, WAL flushes %.0f/1000 grants (%.0f/s), cores busy %.2f, load %s\n",
					p.xidsPer1000(), float64(p.WALBytes)/float64(max(p.Grants, 1)), p.syncsPer1000(), p.syncRate(), p.coresBusy(), p.Load)
				pts = append(pts, p)
			}
		}
	}
	r.res.Combine = pts
	return writeAdvisoryCombine(r.cfg, r.res.Machine, loadStart, loadAvg(), pts)
}

// combineTargets is issue 18's first target, from scenario 10: session
// advisory locks with durable tokens, the default MaxSessions, at least as
// fast as raw lock/unlock without tokens, at each client count.
func combineTargets(pts []combinePoint) []target {
	if len(pts) == 0 {
		return nil
	}
	var out []target
	for _, c := range combineClients {
		tp := func(arm string) float64 {
			return combineMedian(pts, arm, c, func(p combinePoint) float64 { return p.TP })
		}
		a, b := tp(armAfter), tp(armRaw)
		out = append(out, ratioTarget(fmt.Sprintf("advisory, default MaxSessions (session locks with tokens, combined) vs raw advisory lock/unlock, %d clients (scenario 10)", c),
			"≥ 1.0x", a, b, 1.0, fmt.Sprintf("%s vs %s cycles/s; %.0f xids and %.0f WAL flushes per 1,000 grants", report.Rate(a), report.Rate(b),
				combineMedian(pts, armAfter, c, combinePoint.xidsPer1000), combineMedian(pts, armAfter, c, combinePoint.syncsPer1000))))
	}
	return out
}

// combineMiss explains a missed combineTargets row with the run's figures:
// how many grants a lock statement carried, how long a cycle took, and
// what a cycle must wait for that raw lock/unlock does not.
func combineMiss(q func(string, ...any), pts []combinePoint, ts []target) {
	var rows []string
	for _, c := range combineClients {
		if !missed(ts, fmt.Sprintf("advisory, default MaxSessions (session locks with tokens, combined) vs raw advisory lock/unlock, %d clients", c)) {
			continue
		}
		med := func(arm string, f func(combinePoint) float64) float64 { return combineMedian(pts, arm, c, f) }
		tp := med(armAfter, func(p combinePoint) float64 { return p.TP })
		xids := med(armAfter, combinePoint.xidsPer1000)
		syncs := med(armAfter, combinePoint.syncRate)
		cycle := time.Duration(med(armAfter, func(p combinePoint) float64 { return float64(p.Cycle) }))
		raw := med(armRaw, func(p combinePoint) float64 { return p.TP })
		rawCycle := time.Duration(med(armRaw, func(p combinePoint) float64 { return float64(p.Cycle) }))
		flushes := med(armAfter, combinePoint.syncsPer1000)
		if tp <= 0 || math.IsNaN(tp) {
			continue
		}
		rows = append(rows, fmt.Sprintf("At %d clients the Locker ran %s cycles/s with %.0f transaction ids and %.0f WAL flushes per 1,000 grants (%s flushes per second). A cycle waits for its grant's statement (and for a WAL flush when a draw of that statement wrote the sequence's record), then for its unlock's round trip on the same session: cycle p50 %s, against %s for raw lock/unlock, which writes nothing and ran %s cycles/s. With every client in every turn, throughput is bounded by clients / cycle, and the cycle by two statements on the one session plus the share of a flush. CPU per grant, server + client: %s + %s µs for the Locker, %s + %s µs for raw lock/unlock; cores busy: %s against %s, of %d.",
			c, report.Rate(tp), xids, flushes, report.Rate(syncs), report.Duration(cycle), report.Duration(rawCycle), report.Rate(raw),
			fmtFloat(med(armAfter, func(p combinePoint) float64 { return p.cpuPerGrant(true) }), 1), fmtFloat(med(armAfter, func(p combinePoint) float64 { return p.cpuPerGrant(false) }), 1),
			fmtFloat(med(armRaw, func(p combinePoint) float64 { return p.cpuPerGrant(true) }), 1), fmtFloat(med(armRaw, func(p combinePoint) float64 { return p.cpuPerGrant(false) }), 1),
			fmtFloat(med(armAfter, combinePoint.coresBusy), 2), fmtFloat(med(armRaw, combinePoint.coresBusy), 2), runtime.NumCPU()))
	}
	if len(rows) == 0 {
		return
	}
	q("### advisory with combined grants at few clients\n\n")
	for _, r := range rows {
		q("%s\n\n", r)
	}
	q("Cause: a grant's token must be durable before the caller sees it (a token not flushed could be handed out again after a crash). Since migration 000008 a draw waits for the disk only when the WAL that covers its token is not flushed yet, and since migration 000010 one sequence value covers a statement's tokens (a block of 1024): about once per 32 statements (nextval logs 32 values ahead), so most turns wait for no flush, and raw lock/unlock never does. What remains is that the Locker's callers share one session, whose backend runs their statements one after another (each client's cycle is two of them: its grant, then its unlock), and the statement's token draw (one `pgfence_next_tokens` call for all its tokens since migration 000009, a SECURITY DEFINER function with its own search_path, the price of search_path immunity), while raw lock/unlock spreads two trivial statements per cycle over one backend per client. The CPU columns of results/advisory-combine.md show the consequence: per grant the Locker spends less CPU, server and client together, than raw lock/unlock, but the client and the one session's backend take turns (the client waits for the statement, the backend for the client's next one), so together they keep about one core busy where raw lock/unlock keeps both. The more clients, the more grants per statement (the 64-client rows of scenario 10 pass raw lock/unlock), and a server on its own cores would shorten the statements (here the clients, the benchmark and PostgreSQL share 2 cores); over a network, though, each turn also waits for its two round trips, which raw lock/unlock pays in parallel, one connection per client, so there combining saves CPU rather than time unless the server's cores bound raw lock/unlock: `-write-delay` measures that (results/advisory-combine-write-delay.md). See results/advisory-combine.md for the WAL flushes per 1,000 grants and per second of each arm.\n\n")
}

// combineMedian is the median over rounds of f for arm at clients.
func combineMedian(pts []combinePoint, arm string, clients int, f func(combinePoint) float64) float64 {
	var xs []float64
	for _, p := range pts {
		if p.Arm == arm && p.Clients == clients {
			xs = append(xs, f(p))
		}
	}
	if len(xs) == 0 {
		return math.NaN()
	}
	return medianFloat(xs)
}

// writeAdvisoryCombine writes results/advisory-combine.md.
func writeAdvisoryCombine(cfg *config, m machineInfo, loadStart, loadEnd string, pts []combinePoint) error {
	var b strings.Builder
	p := func(format string, args ...any) { fmt.Fprintf(&b, format, args...) }
	p("# Advisory session locks: combined grants (issue 18)\n\n")
	p("Uncontended TryAcquire + Release cycles, every client on its own name, measured in one run: raw `pg_try_advisory_lock`/`pg_advisory_unlock` on a pool of one connection per client (raw-advisory, no token, no WAL); the same with pgfence's durable token draw in the lock statement (raw-advisory-token: a draw writes WAL, and its commit waits for the flush, only when the WAL that covers its token is not on disk yet, about once per 32 draws, more often when other sessions wrote WAL since: migration 000008); pgfence's `advisory.Locker` (a session's turn runs the unlocks queued while it was busy in one statement, then its lock requests, with those made meanwhile, in another: one round trip, one `pgfence_next_tokens` call drawing all the tokens of a turn (migration 000009) from one sequence value (a block of 1024 consecutive tokens per value: migration 000010), and at most one transaction id and one WAL flush for them, needed about once per 32 turns; new keys fill the oldest session up to 32 acquisitions in flight before another opens), with the default `MaxSessions` (4) and with `MaxSessions` = clients (as scenario 1's pgfence-advisory; below 32 clients it too uses one session, so the two arms differ only in the sessions allowed). raw-advisory-token is the arm where nothing is combined: one statement per grant on a connection of its own, each grant's flush (when it needs one) its own. Arms run one after another, in reverse order every other round; figures are medians over %d round(s) of %v (+%v warm-up). Transaction ids are counted from `pg_current_snapshot()`'s xmax before and after each point and divided by the point's grants (warm-up included in both); WAL flushes are `pg_stat_wal.wal_sync` over the point (read %v after its connections closed, as backends report at exit), per 1,000 grants and per second of the point: a grant needs one when its token's WAL is not on disk yet, and one flush covers every commit written before it, so flushes per second show how close an arm runs to what the disk allows. **Server CPU** is the user+system CPU of the cluster's postmaster and all its child processes (from `/proc`), **client CPU** this process's (getrusage: the arm's clients and the benchmark), both over the point and per grant; **cores busy** is their sum over the point's time, out of the machine's cores: an arm that keeps fewer busy waits on round trips, not on CPU.\n\n",
		cfg.Rounds, cfg.Duration, cfg.Warmup, statsSettle)
	p("Machine: %s, %d cores; load average %s at the start of this scenario, %s at its end (the last column gives it after each point); PostgreSQL %s, fsync=%s, synchronous_commit=%s. The benchmark, its clients and PostgreSQL share these cores, and other work ran on the machine.\n\n",
		m.CPU, m.Cores, loadStart, loadEnd, m.Postgres["server_version"], m.Postgres["fsync"], m.Postgres["synchronous_commit"])
	if cfg.WriteDelay > 0 {
		p("**Every write to PostgreSQL, in every arm, was delayed by %v** (`-write-delay`), as a network round trip delays each statement; Go rounds short sleeps up, so raw-advisory's cycle p50 (two statements) shows the delay that ran.\n\n", cfg.WriteDelay)
	}
	for _, c := range combineClients {
		p("## %d clients\n\n", c)
		t := &report.Table{Header: []string{"arm", "cycles/s", "× raw-advisory", "× raw-advisory-token", "× MaxSessions = clients (median of per-round ratios)", "xids / 1,000 grants", "WAL bytes / grant", "WAL flushes / 1,000 grants", "WAL flushes / s", "server CPU µs / grant", "client CPU µs / grant", "cores busy", "acquire p50", "cycle p50", "errors", "load after (last round)"}, TextColumns: 1}
		tp := func(arm string) float64 {
			return combineMedian(pts, arm, c, func(p combinePoint) float64 { return p.TP })
		}
		for _, arm := range combineArms {
			var byConn string
			if arm == armAfter {
				byConn = pairedRatio(pts, armAfter, armAfterByConn, c)
			}
			var last combinePoint
			var errs int64
			for _, pt := range pts {
				if pt.Arm == arm && pt.Clients == c {
					last = pt
					errs += pt.Errors
				}
			}
			xids := combineMedian(pts, arm, c, combinePoint.xidsPer1000)
			wal := combineMedian(pts, arm, c, func(p combinePoint) float64 { return float64(p.WALBytes) / float64(max(p.Grants, 1)) })
			acq := combineMedian(pts, arm, c, func(p combinePoint) float64 { return float64(p.Acquire) })
			cyc := combineMedian(pts, arm, c, func(p combinePoint) float64 { return float64(p.Cycle) })
			t.Rows = append(t.Rows, []string{arm, report.Rate(tp(arm)), report.Ratio(tp(arm), tp(armRaw)), report.Ratio(tp(arm), tp(armRawToken)), byConn,
				strconv.FormatFloat(xids, 'f', 0, 64), strconv.FormatFloat(wal, 'f', 0, 64),
				strconv.FormatFloat(combineMedian(pts, arm, c, combinePoint.syncsPer1000), 'f', 0, 64),
				report.Rate(combineMedian(pts, arm, c, combinePoint.syncRate)),
				fmtFloat(combineMedian(pts, arm, c, func(p combinePoint) float64 { return p.cpuPerGrant(true) }), 1),
				fmtFloat(combineMedian(pts, arm, c, func(p combinePoint) float64 { return p.cpuPerGrant(false) }), 1),
				fmtFloat(combineMedian(pts, arm, c, combinePoint.coresBusy), 2),
				report.Duration(time.Duration(acq)), report.Duration(time.Duration(cyc)), strconv.FormatInt(errs, 10), last.Load})
		}
		p("%s\n", t.Markdown())
	}
	if err := os.MkdirAll(cfg.Out, 0o755); err != nil {
		return err
	}
	path := filepath.Join(cfg.Out, "advisory-combine.md")
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		return err
	}
	fmt.Println("wrote", path)
	return nil
}

// pairedRatio is the median over rounds of arm's throughput over base's in
// the same round, which the machine's changing load distorts less than a
// ratio of medians.
func pairedRatio(pts []combinePoint, arm, base string, clients int) string {
	byRound := map[int]float64{}
	for _, p := range pts {
		if p.Arm == base && p.Clients == clients && p.TP > 0 {
			byRound[p.Round] = p.TP
		}
	}
	var rs []float64
	for _, p := range pts {
		if b, ok := byRound[p.Round]; ok && p.Arm == arm && p.Clients == clients {
			rs = append(rs, p.TP/b)
		}
	}
	if len(rs) == 0 {
		return "n/a"
	}
	return strconv.FormatFloat(medianFloat(rs), 'f', 2, 64) + "x"
}

// fmtFloat formats v with prec decimals, or "n/a" (as msCell and
// herdCPUCell) when it is not a number (not measured).
func fmtFloat(v float64, prec int) string {
	if math.IsNaN(v) {
		return "n/a"
	}
	return strconv.FormatFloat(v, 'f', prec, 64)
}
