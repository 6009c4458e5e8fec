package main

import (
	"context"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgfence/pgfence/bench/internal/report"
)

// waitSample is what the server's backends were doing during one point:
// wait events sampled from pg_stat_activity, and the statements that took
// the most execution time (pg_stat_statements), for reading why a system
// reaches the throughput it does.
type waitSample struct {
	System     string
	Clients    int
	Samples    int            // pg_stat_activity snapshots taken
	Active     int            // active backend observations over all snapshots
	Events     map[string]int // "type:event" (or "CPU") -> observations
	Statements []stmtStat     // top statements by total execution time
	Plan       string         // EXPLAIN ANALYZE of one write (scenario 4)
	PlanErr    error
}

type stmtStat struct {
	Query  string
	Calls  int64
	MeanMs float64
	Rows   int64
}

// Statements of the profiler.
const (
	// activeWaits groups this database's active client backends by what
	// they wait on; a NULL wait event means running on a CPU.
	activeWaits = `SELECT coalesce(wait_event_type || ':' || wait_event, 'CPU'), count(*)
FROM pg_stat_activity
WHERE datname = current_database() AND backend_type = 'client backend' AND state = 'active'
  AND pid <> pg_backend_pid()
GROUP BY 1`
	// topStatements lists the statements that took the most time since the
	// last reset, in this database.
	topStatements = `SELECT regexp_replace(query, '\s+', ' ', 'g'), calls, mean_exec_time, rows FROM pg_stat_statements
WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
  AND query NOT LIKE '%pg_stat_%'
ORDER BY total_exec_time DESC LIMIT 4`
)

// profiler samples wait events on its own connection until stopped.
type profiler struct {
	url    string
	cancel context.CancelFunc
	done   chan struct{}
	res    waitSample
	pgss   bool
	off    func() // switches statement tracking off again
}

// Statements that switch pg_stat_statements on and off on the benchmark's
// own cluster: it stays off (track = none) outside profiled points, so its
// per-statement cost does not weigh on the other figures.
const (
	pgssTrackTop  = `ALTER SYSTEM SET pg_stat_statements.track = 'top'`
	pgssTrackNone = `ALTER SYSTEM SET pg_stat_statements.track = 'none'`
	reloadConf    = `SELECT pg_reload_conf()`
)

// setPgssTracking turns statement tracking on or off, on a cluster the
// benchmark started only; it reports whether tracking is on.
func (r *runner) setPgssTracking(ctx context.Context, on bool) bool {
	if !r.ownCluster {
		return false
	}
	stmt := pgssTrackNone
	if on {
		stmt = pgssTrackTop
	}
	err := withConn(ctx, r.env.DatabaseURL, func(c *pgx.Conn) error {
		if _, err := c.Exec(ctx, stmt); err != nil {
			return err
		}
		_, err := c.Exec(ctx, reloadConf)
		return err
	})
	if err != nil {
		r.note("pg_stat_statements tracking could not be switched: %v", err)
	}
	if err == nil && on {
		// Backends apply the reload at their next command; give them a
		// moment before the measured window starts.
		time.Sleep(50 * time.Millisecond)
	}
	return err == nil && on
}

// startProfiler switches statement tracking on and starts sampling.
func (r *runner) startProfiler(ctx context.Context, system string, clients int) *profiler {
	tracked := r.setPgssTracking(ctx, true)
	p := startProfiler(ctx, r.env.DatabaseURL, system, clients)
	p.pgss = p.pgss && tracked
	p.off = func() { r.setPgssTracking(ctx, false) }
	return p
}

func startProfiler(ctx context.Context, url, system string, clients int) *profiler {
	ctx, cancel := context.WithCancel(ctx)
	p := &profiler{url: url, cancel: cancel, done: make(chan struct{}),
		res: waitSample{System: system, Clients: clients, Events: map[string]int{}}}
	ready := make(chan struct{})
	go func() {
		defer close(p.done)
		var once sync.Once
		defer once.Do(func() { close(ready) })
		conn, err := pgx.Connect(ctx, url)
		if err != nil {
			return
		}
		defer conn.Close(context.WithoutCancel(ctx))
		_, err = conn.Exec(ctx, pgssReset)
		p.pgss = err == nil
		once.Do(func() { close(ready) })
		tick := time.NewTicker(10 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			rows, err := conn.Query(ctx, activeWaits)
			if err != nil {
				return
			}
			var ev string
			var n int
			_, _ = pgx.ForEachRow(rows, []any{&ev, &n}, func() error {
				p.res.Events[ev] += n
				p.res.Active += n
				return nil
			})
			p.res.Samples++
		}
	}()
	<-ready
	return p
}

// stop ends the sampling and reads the top statements.
func (p *profiler) stop(ctx context.Context) waitSample {
	p.cancel()
	<-p.done
	if p.off != nil {
		defer p.off()
	}
	if p.pgss {
		_ = withConn(ctx, p.url, func(c *pgx.Conn) error {
			rows, err := c.Query(ctx, topStatements)
			if err != nil {
				return err
			}
			var s stmtStat
			_, err = pgx.ForEachRow(rows, []any{&s.Query, &s.Calls, &s.MeanMs, &s.Rows}, func() error {
				p.res.Statements = append(p.res.Statements, s)
				return nil
			})
			return err
		})
	}
	return p.res
}

// topEvents returns the n most frequent wait events with their share of
// the active observations.
func (w *waitSample) topEvents(n int) []string {
	type kv struct {
		k string
		v int
	}
	var all []kv
	for k, v := range w.Events {
		all = append(all, kv{k, v})
	}
	sort.Slice(all, func(i, j int) bool { return all[i].v > all[j].v || (all[i].v == all[j].v && all[i].k < all[j].k) })
	var out []string
	for i := 0; i < len(all) && i < n; i++ {
		out = append(out, strings.TrimSpace(all[i].k)+" "+pct(all[i].v, w.Active))
	}
	return out
}

func pct(a, b int) string {
	if b == 0 {
		return "n/a"
	}
	return strconv.FormatFloat(100*float64(a)/float64(b), 'f', 0, 64) + "%"
}

// renderProfiles writes where the server spent its time in the profiled
// points, and the plans of the write paths.
func renderProfiles(p func(string, ...any), res *results) {
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
