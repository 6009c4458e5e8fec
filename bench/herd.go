package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgfence/pgfence/advisory"
	"github.com/pgfence/pgfence/bench/internal/report"
	"github.com/pgfence/pgfence/bench/internal/stats"
	"github.com/pgfence/pgfence/internal/notifier"
	"github.com/pgfence/pgfence/internal/sysproc"
	"github.com/pgfence/pgfence/leasetable"
)

// Scenario 11: many waiters. Waiters on one name (and, apart, many names
// with one waiter each), 1ms holds, for both strategies with their default
// Config: the hand-over latency and the work per hand-over, with the
// Lockers in separate processes (workers: herd_worker.go) and in one
// process, so that a thundering herd shows as a slope.

// herdStrategies are the strategies scenario 11 measures.
var herdStrategies = []string{"leasetable", "advisory"}

// The modes of a point.
const (
	herdProcesses = "processes"  // one Locker per worker process
	herdInProcess = "in-process" // one worker process with all the Lockers
)

// herdPoint is one point of scenario 11.
type herdPoint struct {
	Strategy  string
	Mode      string
	Waiters   int // waiters per name, besides its holder
	Names     int
	Processes int // worker processes
	Lockers   int // Lockers in all
	herdMerge
	Notifies   int64 // notifications sent on the strategy's channel during the run, counted by a listener of ours
	Listeners  int64 // LISTEN connections of the Lockers, counted in the middle of the run
	Statements int64 // transactions committed in the database from before the workers started until they exited
	ServerCPU  time.Duration
	ServerOK   bool          // the server's CPU was read (it runs on this machine)
	ClientCPU  time.Duration // the workers' CPU over the run
	Errors     int64
	FirstErr   string
	Load       string
	// Stages cuts the hand-overs at their statements (herd_stages.go);
	// traced at one name with one waiter only.
	Stages herdStages
}

// per divides a count by the point's hand-overs of the whole run.
func (p *herdPoint) per(v float64) float64 { return v / float64(max(p.All, 1)) }

// herdMerge is what the holds of a point say about its hand-overs.
type herdMerge struct {
	// All counts the hand-overs of the whole run (warm-up included),
	// which the work per hand-over is divided by.
	All int
	// Latency summarises the hand-overs whose release started in the
	// measured part of the run (after the warm-up).
	Latency stats.Summary
	// Violations counts holds acquired before an earlier holder of the
	// same name had started to release (two holders at once), or with a
	// token not above the previous holder's; Overlap is the largest
	// overlap.
	Violations int
	Overlap    time.Duration
	// Free counts acquires after a release that nobody was waiting for
	// (every later holder called Acquire after it): no hand-over. An
	// acquire that began after the release but beat a waiter to the lock
	// is a hand-over.
	Free int
	// Holds counts every hold.
	Holds int
	// pairs are the sampled hand-overs: release start and the next
	// holder's Acquire return (UnixNano).
	pairs [][2]int64
}

// mergeHolds orders the holds of each name by when they were acquired and
// measures each hand-over: from the moment the holder started to release
// to the moment the next holder's Acquire returned. Times are wall-clock
// UnixNano from processes on one machine. A hold acquired before the
// latest release start of an earlier one is a violation, reported with
// its overlap and never turned into a sample. Samples are kept when the
// release started within [measureFrom, end].
func mergeHolds(holds []herdHold, measureFrom, end int64) herdMerge {
	m := herdMerge{Holds: len(holds)}
	byName := map[int][]herdHold{}
	for _, h := range holds {
		byName[h.N] = append(byName[h.N], h)
	}
	var samples []time.Duration
	for _, hs := range byName {
		slices.SortFunc(hs, func(a, b herdHold) int {
			if a.Acq != b.Acq {
				return cmpInt64(a.Acq, b.Acq)
			}
			return cmpInt64(a.Rel, b.Rel)
		})
		// minWait[i] is the earliest Acquire call among holds i and later:
		// if it is before a release, someone was waiting then.
		minWait := make([]int64, len(hs))
		for i := len(hs) - 1; i >= 0; i-- {
			minWait[i] = hs[i].Wait
			if i+1 < len(hs) {
				minWait[i] = min(minWait[i], minWait[i+1])
			}
		}
		lastRel, lastToken := hs[0].Rel, hs[0].Token
		for i, h := range hs[1:] {
			switch {
			case h.Acq < lastRel:
				m.Violations++
				m.Overlap = max(m.Overlap, time.Duration(lastRel-h.Acq))
			case h.Token <= lastToken:
				m.Violations++
			case minWait[i+1] > lastRel:
				m.Free++
			default:
				m.All++
				if lastRel >= measureFrom && lastRel <= end {
					samples = append(samples, time.Duration(h.Acq-lastRel))
					m.pairs = append(m.pairs, [2]int64{lastRel, h.Acq})
				}
			}
			lastRel, lastToken = max(lastRel, h.Rel), max(lastToken, h.Token)
		}
	}
	m.Latency = stats.Summarize(samples)
	return m
}

func cmpInt64(a, b int64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// herdRoles places the point's goroutines: on one name, waiters+1
// goroutines round robin over the processes (one Locker each), or over the
// Lockers of one process; on several names, each name's holder and waiter
// in two neighbouring processes. It returns each process's roles.
func herdRoles(mode string, names, waiters, processes, lockers int) [][]herdRole {
	if mode == herdInProcess {
		roles := make([]herdRole, 0, names*(waiters+1))
		for g := range names * (waiters + 1) {
			roles = append(roles, herdRole{ID: g, Name: g / (waiters + 1), Locker: g % lockers})
		}
		return [][]herdRole{roles}
	}
	out := make([][]herdRole, processes)
	g := 0
	for n := range names {
		for i := range waiters + 1 {
			p := (n + i) % processes
			out[p] = append(out[p], herdRole{ID: g, Name: n, Locker: 0})
			g++
		}
	}
	return out
}

// herdListenConns counts the Lockers' listening LISTEN connections:
// leasetable's last ran LISTEN while subscribed (its health check is
// LISTEN too; UNLISTEN once it has no waiter), advisory's carry the
// application_name advisory gives them.
const herdListenConns = `SELECT pg_catalog.count(*) FROM pg_catalog.pg_stat_activity
WHERE datname = pg_catalog.current_database() AND pid <> $1
AND (query LIKE 'LISTEN %' OR application_name = $2)`

// committedXacts reads the database's committed transactions.
const committedXacts = `SELECT xact_commit FROM pg_catalog.pg_stat_database WHERE datname = pg_catalog.current_database()`

// herdWorkerBackends counts the client sessions other than ours.
const herdWorkerBackends = `SELECT pg_catalog.count(*) FROM pg_catalog.pg_stat_activity
WHERE datname = pg_catalog.current_database() AND backend_type = 'client backend' AND pid <> pg_catalog.pg_backend_pid() AND pid <> $1`

// herdScenario is scenario 11.
func (r *runner) herdScenario(ctx context.Context) error {
	c := r.cfg
	fmt.Printf("scenario 11: many waiters: %v waiters on one name, and %d names with one waiter each, over %d Lockers (%d processes, or one); hold %v, %v per point (hard bound %v)\n",
		c.HerdWaiters, c.HerdNames, c.HerdProcesses, c.HerdProcesses, c.HoldShort, c.Duration+c.Warmup, herdHardBound(c))
	dir, err := os.MkdirTemp("", "pgfence-herd-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	cpu := findServerCPU(ctx, r.env.DatabaseURL)
	if !cpu.ok() {
		r.note("11: server CPU not measured: %s", cpu.why)
	}
	loadStart := loadAvg()
	type spec struct {
		strategy, mode string
		names, waiters int
	}
	var specs []spec
	for _, s := range herdStrategies {
		for _, mode := range []string{herdProcesses, herdInProcess} {
			for _, w := range c.HerdWaiters {
				specs = append(specs, spec{s, mode, 1, w})
			}
		}
	}
	for _, s := range herdStrategies {
		specs = append(specs, spec{s, herdProcesses, c.HerdNames, 1})
	}
	// The raw NOTIFY chain first, on the machine as the one-waiter points
	// that follow find it (not after the 10,000-names point, which leaves
	// the load high).
	raw := rawNotifyChain(ctx, r.env.DatabaseURL, c.HoldShort, c.Warmup, c.Duration)
	r.res.HerdRaw = &raw
	if raw.Err != "" {
		r.note("11 raw NOTIFY chain: %s", raw.Err)
	}
	fmt.Printf("  [11] raw NOTIFY chain (one process) hand-overs=%-6d p50=%-9s p99=%-9s release stmt p50=%s acquire stmt p50=%s acquire stmts/ho=%.2f load %s\n",
		raw.Latency.N, report.Duration(raw.Latency.P50), report.Duration(raw.Latency.P99),
		report.Duration(raw.Release.P50), report.Duration(raw.Acquire.P50), raw.perHandover(), loadAvg())
	for i, sp := range specs {
		if err := ctx.Err(); err != nil {
			return err
		}
		p := r.herdPoint(ctx, dir, cpu, i, sp.strategy, sp.mode, sp.names, sp.waiters)
		if p.FirstErr != "" {
			r.note("11 %s %s names=%d waiters=%d: %d errors, first: %s", p.Strategy, p.Mode, p.Names, p.Waiters, p.Errors, p.FirstErr)
		}
		fmt.Printf("  [11] %-10s %-10s names=%-5d waiters=%-4d hand-overs=%-6d p50=%-9s p99=%-9s violations=%d free=%d notif/ho=%.2f (x%d) stmts/ho=%.2f srvCPU/ho=%s cliCPU/ho=%s errors=%d load %s\n",
			p.Strategy, p.Mode, p.Names, p.Waiters, p.Latency.N, report.Duration(p.Latency.P50), report.Duration(p.Latency.P99),
			p.Violations, p.Free, p.per(float64(p.Notifies)), p.Listeners, p.per(float64(p.Statements)),
			herdCPUCell(&p, p.ServerCPU, p.ServerOK), herdCPUCell(&p, p.ClientCPU, true), p.Errors, p.Load)
		r.res.Herd = append(r.res.Herd, p)
	}
	if slices.Contains(c.HerdWaiters, 1) {
		if !r.ownCluster {
			r.note("11: the hand-over without the WAL flush (fsync off) was not measured: the server is not the benchmark's own (-database)")
		} else if nf, err := r.herdNoFlushArm(ctx, dir, cpu, len(specs)); err != nil {
			r.note("11: the hand-over without the WAL flush: %v", err)
		} else {
			r.res.HerdNoFlush = nf
		}
	}
	return writeHerd(c, r.res.Machine, loadStart, loadAvg(), cpu, r.res.Herd, r.res.HerdRaw, r.res.HerdNoFlush)
}

// herdHardBound is how long a point may take at most, from the start of
// its workers: their start-up, the run, and the end of their last holds
// and their Close.
func herdHardBound(c *config) time.Duration {
	return 30*time.Second + c.Warmup + c.Duration + 15*time.Second
}

// herdChild is one running worker process.
type herdChild struct {
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	lines  chan herdWorkerResult // its stdout, decoded
	stderr *tailBuffer
}

// herdPoint runs one point; failures end up in its Errors and FirstErr.
func (r *runner) herdPoint(ctx context.Context, dir string, cpu *serverCPU, idx int, strategy, mode string, names, waiters int) herdPoint {
	c := r.cfg
	p := herdPoint{Strategy: strategy, Mode: mode, Names: names, Waiters: waiters, Processes: c.HerdProcesses, Lockers: c.HerdProcesses}
	lockersPer := 1
	if mode == herdInProcess {
		p.Processes, lockersPer = 1, c.HerdProcesses
	}
	fail := func(err error) herdPoint {
		p.Errors++
		if p.FirstErr == "" {
			p.FirstErr = err.Error()
		}
		p.Load = loadAvg()
		return p
	}
	hard := time.Now().Add(herdHardBound(c))
	ctx, cancel := context.WithDeadline(ctx, hard.Add(5*time.Second))
	defer cancel()

	counters := filepath.Join(dir, fmt.Sprintf("counters-%d", idx))
	if err := createHerdCounters(counters, names, p.Processes); err != nil {
		return fail(err)
	}
	defer os.Remove(counters)

	// Our listener counts what the releases send, on both channels.
	lc, err := pgx.Connect(ctx, r.env.DatabaseURL)
	if err != nil {
		return fail(err)
	}
	defer lc.Close(context.WithoutCancel(ctx))
	for _, ch := range []string{leasetable.NotifyChannel, advisory.NotifyChannel} {
		if _, err := lc.Exec(ctx, "LISTEN "+pgx.Identifier{ch}.Sanitize()); err != nil {
			return fail(err)
		}
	}
	listenerPID := lc.PgConn().PID()
	var counting atomic.Bool
	var notifies atomic.Int64
	lctx, stopListen := context.WithCancel(ctx)
	var lwg sync.WaitGroup
	lwg.Add(1)
	go func() {
		defer lwg.Done()
		for {
			n, err := lc.WaitForNotification(lctx)
			if err != nil {
				return
			}
			if counting.Load() && !strings.HasPrefix(n.Payload, notifier.ProbePrefix) {
				notifies.Add(1)
			}
		}
	}()
	defer func() { stopListen(); lwg.Wait() }()

	var x0 int64
	if err := withConn(ctx, r.env.DatabaseURL, func(c *pgx.Conn) error { return c.QueryRow(ctx, committedXacts).Scan(&x0) }); err != nil {
		return fail(err)
	}

	exe, err := os.Executable()
	if err != nil {
		return fail(err)
	}
	prefix := fmt.Sprintf("s11-%d-%s-%s-%d-%d-", os.Getpid(), strategy, mode, names, waiters)
	roles := herdRoles(mode, names, waiters, p.Processes, lockersPer)
	run := c.Warmup + c.Duration
	var children []*herdChild
	defer func() {
		// Normally every worker has exited by now; any that has not is
		// past its bound.
		for _, ch := range children {
			if ch.cmd.ProcessState == nil {
				_ = ch.cmd.Process.Kill()
				_ = ch.cmd.Wait()
			}
		}
	}()
	for i := range p.Processes {
		job := herdJob{Strategy: strategy, URL: r.env.AppURL(), Lockers: lockersPer, Prefix: prefix, Names: names,
			Counters: counters, Process: i, Procs: p.Processes, Roles: roles[i], Hold: c.HoldShort, Run: run, Hard: hard.UnixNano(),
			Trace: names == 1 && waiters == 1}
		ch, err := startHerdChild(exe, &job)
		if err != nil {
			return fail(fmt.Errorf("start worker %d: %w", i, err))
		}
		children = append(children, ch)
	}
	// Start barrier: every worker has its Lockers open.
	for i, ch := range children {
		select {
		case m, ok := <-ch.lines:
			if !ok || !m.Ready {
				return fail(fmt.Errorf("worker %d not ready: %s%s", i, m.Error, ch.stderr.tail()))
			}
		case <-ctx.Done():
			return fail(fmt.Errorf("worker %d not ready in time", i))
		}
	}
	cpu0, cpuErr := cpu.read()
	counting.Store(true)
	goAt := time.Now()
	for _, ch := range children {
		if _, err := io.WriteString(ch.stdin, "go\n"); err != nil {
			return fail(fmt.Errorf("start: %w", err))
		}
	}
	var listeners atomic.Int64
	mid := time.AfterFunc(run/2, func() {
		_ = withConn(ctx, r.env.DatabaseURL, func(c *pgx.Conn) error {
			var n int64
			err := c.QueryRow(ctx, herdListenConns, listenerPID, advisory.DefaultApplicationName+"-listen").Scan(&n)
			listeners.Store(n)
			return err
		})
	})
	var holds []herdHold
	var stmts []herdStmt
	for i, ch := range children {
		select {
		case m, ok := <-ch.lines:
			if !ok || m.Error != "" {
				mid.Stop()
				return fail(fmt.Errorf("worker %d: no result: %s%s", i, m.Error, ch.stderr.tail()))
			}
			holds = append(holds, m.Holds...)
			stmts = append(stmts, m.Stmts...)
			p.Errors += m.Errors
			if m.FirstErr != "" && p.FirstErr == "" {
				p.FirstErr = m.FirstErr
			}
			p.ClientCPU += m.UserCPU + m.SysCPU
		case <-ctx.Done():
			mid.Stop()
			return fail(fmt.Errorf("worker %d: no result within the hard bound", i))
		}
	}
	cpu1, cpuErr1 := cpu.read()
	if cpuErr == nil && cpuErr1 == nil {
		p.ServerCPU, p.ServerOK = cpu1-cpu0, true
	}
	for i, ch := range children {
		err := ch.cmd.Wait()
		if err != nil {
			p.Errors++
			if p.FirstErr == "" {
				p.FirstErr = fmt.Sprintf("worker %d: %v%s", i, err, ch.stderr.tail())
			}
		}
	}
	// Backends report their counters when they exit: wait for the
	// workers' sessions to be gone.
	_ = withConn(ctx, r.env.DatabaseURL, func(c *pgx.Conn) error {
		for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
			var n int
			if err := c.QueryRow(ctx, herdWorkerBackends, listenerPID).Scan(&n); err != nil || n == 0 {
				return err
			}
		}
		return nil
	})
	time.Sleep(250 * time.Millisecond)
	var x1 int64
	if err := withConn(ctx, r.env.DatabaseURL, func(c *pgx.Conn) error { return c.QueryRow(ctx, committedXacts).Scan(&x1) }); err != nil {
		return fail(err)
	}
	p.herdMerge = mergeHolds(holds, goAt.Add(c.Warmup).UnixNano(), goAt.Add(run).UnixNano())
	if len(stmts) > 0 {
		p.Stages = splitHandovers(p.pairs, stmts)
	}
	p.Notifies, p.Listeners, p.Statements, p.Load = notifies.Load(), listeners.Load(), x1-x0, loadAvg()
	return p
}

// startHerdChild starts a worker process and sends it its job.
func startHerdChild(exe string, job *herdJob) (*herdChild, error) {
	cmd := exec.Command(exe)
	cmd.Env = append(os.Environ(), herdWorkerEnv+"=herd")
	// The worker dies with the benchmark, even if the benchmark is killed.
	cmd.SysProcAttr = &syscall.SysProcAttr{}
	sysproc.SetParentDeathSignal(cmd.SysProcAttr, syscall.SIGKILL)
	ch := &herdChild{cmd: cmd, lines: make(chan herdWorkerResult, 2), stderr: &tailBuffer{max: 4096}}
	cmd.Stderr = ch.stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	ch.stdin = stdin
	go func() {
		defer close(ch.lines)
		br := bufio.NewReaderSize(stdout, 1<<20)
		for {
			line, err := br.ReadBytes('\n')
			if len(bytes.TrimSpace(line)) > 0 {
				var m herdWorkerResult
				if jerr := json.Unmarshal(line, &m); jerr != nil {
					m.Error = "bad output: " + jerr.Error()
				}
				ch.lines <- m
			}
			if err != nil {
				return
			}
		}
	}()
	b, err := json.Marshal(job)
	if err != nil {
		return ch, err
	}
	if _, err := stdin.Write(append(b, '\n')); err != nil {
		return ch, err
	}
	return ch, nil
}

// tailBuffer keeps the last max bytes written to it.
type tailBuffer struct {
	mu  sync.Mutex
	max int
	b   []byte
}

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.b = append(t.b, p...)
	if len(t.b) > t.max {
		t.b = t.b[len(t.b)-t.max:]
	}
	return len(p), nil
}

// tail returns what the worker wrote to stderr, for an error message.
func (t *tailBuffer) tail() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	if s := strings.TrimSpace(string(t.b)); s != "" {
		return "; stderr: " + s
	}
	return ""
}

// herdCPUCell formats CPU time per hand-over in µs.
func herdCPUCell(p *herdPoint, d time.Duration, ok bool) string {
	if !ok {
		return "n/a"
	}
	return strconv.FormatFloat(p.per(float64(d)/float64(time.Microsecond)), 'f', 0, 64)
}

// herdFind returns the point of strategy, mode, one name and waiters.
func herdFind(pts []herdPoint, strategy, mode string, waiters int) *herdPoint {
	for i := range pts {
		if p := &pts[i]; p.Strategy == strategy && p.Mode == mode && p.Names == 1 && p.Waiters == waiters {
			return p
		}
	}
	return nil
}

// herdTargets are issue 18's hand-over targets, from scenario 11's points.
// They are left out when scenario 11 did not run.
func herdTargets(pts []herdPoint, hold time.Duration) []target {
	if len(pts) == 0 {
		return nil
	}
	var out []target
	for _, s := range herdStrategies {
		for _, mode := range []string{herdProcesses, herdInProcess} {
			t := target{What: fmt.Sprintf("%s hand-over at 1 waiter, hold %v, %s", s, hold, herdModeText(mode)),
				Goal: "p50 < 1 ms, p99 < 5 ms", Met: notMeasured, Measured: "n/a"}
			if p := herdFind(pts, s, mode, 1); p != nil && p.Latency.N > 0 {
				t.Measured = fmt.Sprintf("p50 %s, p99 %s (%d hand-overs)", report.Duration(p.Latency.P50), report.Duration(p.Latency.P99), p.Latency.N)
				t.Met = verdict(p.Latency.P50 < time.Millisecond && p.Latency.P99 < 5*time.Millisecond && p.Violations == 0)
			}
			out = append(out, t)
		}
	}
	for _, s := range herdStrategies {
		t := target{What: fmt.Sprintf("%s hand-over p50 at 1,000 waiters vs at 10, separate processes", s),
			Goal: "≤ 2x", Met: notMeasured, Measured: "n/a"}
		a, b := herdFind(pts, s, herdProcesses, 1000), herdFind(pts, s, herdProcesses, 10)
		if a != nil && b != nil && a.Latency.N > 0 && b.Latency.N > 0 {
			ratio := float64(a.Latency.P50) / float64(b.Latency.P50)
			t.Measured = fmt.Sprintf("%.2fx (%s vs %s)", ratio, report.Duration(a.Latency.P50), report.Duration(b.Latency.P50))
			t.Met = verdict(ratio <= 2 && a.Violations == 0 && b.Violations == 0)
		}
		out = append(out, t)
	}
	return out
}

func herdModeText(mode string) string {
	if mode == herdInProcess {
		return "Lockers in one process"
	}
	return "Lockers in separate processes"
}

// writeHerd writes results/herd.md.
func writeHerd(cfg *config, m machineInfo, loadStart, loadEnd string, cpu *serverCPU, pts []herdPoint, raw *rawChainResult, nf *herdNoFlush) error {
	var b strings.Builder
	p := func(format string, args ...any) { fmt.Fprintf(&b, format, args...) }
	p("# Many waiters: hand-over across processes and within one\n\n")
	p("Generated by scenario 11 of `cd bench && go run .` (%v per point after %v warm-up%s). ", cfg.Duration, cfg.Warmup, map[bool]string{true: ", **quick** run", false: ""}[cfg.Quick])
	p("Waiters call `Acquire` on one name (plus its holder), with the default Config of each strategy and %v holds; a holder releases once its hold has passed and another goroutine waits in `Acquire` for the name (at 1 waiter, when the waiter has queued again), and queues again itself once another goroutine took the lock (as in scenario 2), which goroutines of all workers learn through counters in a shared memory file; a hand-over is the time from the moment a holder starts its `Release` to the moment the next holder's `Acquire` returns. ", cfg.HoldShort)
	p("With **separate processes**, the benchmark starts %d worker processes of its own binary, each with its own pgx pool and one Locker, the goroutines spread round robin over them (at 1 waiter, the holder and the waiter are in different processes); **in one process**, one worker process holds %d Lockers, the goroutines spread round robin over them. ", cfg.HerdProcesses, cfg.HerdProcesses)
	p("Each worker records, per hold, the wall-clock times at which it called `Acquire`, `Acquire` returned and it started to release, and the fencing token; the benchmark merges the holds of a name by acquisition time. A hold acquired before an earlier holder started to release, or with a token not above the previous one, is a **violation** (the largest overlap is shown); an acquisition after a release for which no goroutine was waiting yet is no hand-over (shown as \"free\" when any; a goroutine that called `Acquire` after the release but beat the waiters to the lock makes a hand-over). All workers start together, once every one of them has opened its Lockers.\n\n")
	p("Work per hand-over divides the whole run's work (warm-up included) by its hand-overs. **Notifications** are those sent on `%s` and `%s` during the run, counted by a LISTEN connection of the benchmark's own (probes of a LISTEN connection excluded); **deliveries** are notifications × the Lockers' listening LISTEN connections (counted in `pg_stat_activity` halfway through the run; a lease table Locker listens only while a call of it waits, and a second after). **Statements** are the transactions the database committed from before the workers started until their sessions exited (`pg_stat_database.xact_commit`; opening the Lockers adds a few). **Server CPU** is the user+system CPU of the postmaster and all its child processes (backends and background workers, plus the children it reaped) from `/proc`, from the start barrier until every worker reported; **client CPU** is the workers' own (getrusage, over their runs). ",
		leasetable.NotifyChannel, advisory.NotifyChannel)
	if !cpu.ok() {
		p("Server CPU was not measured in this run: %s. ", cpu.why)
	}
	p("\n\nMachine: %s, %d cores; load average %s at the start of this scenario, %s at its end; PostgreSQL %s. The benchmark's workers and PostgreSQL share these cores, and other work ran on the machine.\n\n",
		m.CPU, m.Cores, loadStart, loadEnd, m.Postgres["server_version"])

	header := []string{"hand-overs", "p50", "p99", "violations", "notifications / hand-over", "deliveries / hand-over",
		"statements / hand-over", "server CPU µs / hand-over", "client CPU µs / hand-over", "errors", "load after"}
	row := func(pt *herdPoint) []string {
		ho := report.Thousands(int64(pt.Latency.N))
		if pt.Free > 0 {
			ho += fmt.Sprintf(" (free %d)", pt.Free)
		}
		viol := strconv.Itoa(pt.Violations)
		if pt.Overlap > 0 {
			viol += " (overlap " + report.Duration(pt.Overlap) + ")"
		}
		return []string{ho, report.Duration(pt.Latency.P50), report.Duration(pt.Latency.P99), viol,
			strconv.FormatFloat(pt.per(float64(pt.Notifies)), 'f', 2, 64),
			strconv.FormatFloat(pt.per(float64(pt.Notifies*pt.Listeners)), 'f', 1, 64),
			strconv.FormatFloat(pt.per(float64(pt.Statements)), 'f', 2, 64),
			herdCPUCell(pt, pt.ServerCPU, pt.ServerOK), herdCPUCell(pt, pt.ClientCPU, true),
			strconv.FormatInt(pt.Errors, 10), pt.Load}
	}
	for _, s := range herdStrategies {
		for _, mode := range []string{herdProcesses, herdInProcess} {
			t := &report.Table{Header: append([]string{"waiters"}, header...)}
			for i := range pts {
				if pt := &pts[i]; pt.Strategy == s && pt.Mode == mode && pt.Names == 1 {
					t.Rows = append(t.Rows, append([]string{strconv.Itoa(pt.Waiters)}, row(pt)...))
				}
			}
			if len(t.Rows) == 0 {
				continue
			}
			where := fmt.Sprintf("%d processes, one Locker each", cfg.HerdProcesses)
			if mode == herdInProcess {
				where = fmt.Sprintf("one process, %d Lockers", cfg.HerdProcesses)
			}
			p("## %s, %s\n\n%s\n", s, where, t.Markdown())
		}
	}
	st := &report.Table{Header: append([]string{"strategy", "mode"}, stagesHeader...), TextColumns: 2}
	for i := range pts {
		if pt := &pts[i]; pt.Names == 1 && pt.Waiters == 1 && pt.Stages.N > 0 {
			st.Rows = append(st.Rows, append([]string{pt.Strategy, herdModeText(pt.Mode)}, stagesRow(pt.Stages, pt.Latency)...))
		}
	}
	if len(st.Rows) > 0 {
		p("## Where a one-waiter hand-over goes\n\n")
		p("At one waiter the workers trace their Lockers' lock and unlock statements (a pgx tracer: wall-clock times before each statement is sent and after its answer is read) and each hand-over is cut at them: **before**, from the holder's `Release` call to its release statement being sent; the **release statement**'s round trip (its commit sends the NOTIFY without waiting for a WAL flush); **wake**, from the release's answer to the waiter's acquire statement being sent (the NOTIFY delivered to the waiter's LISTEN connection and the waiter woken; negative when the waiter sent it before the holder had read its own answer; zero for an advisory wait parked in the server, whose statement was sent before the release); the **acquire statement**'s round trip (its token's commit waits for a WAL flush; for a parked wait, from the release's answer to the wait's); **after**, from its answer to `Acquire` returning. Each cell is the median in µs, the mean in brackets; the means add up to the mean hand-over, the medians need not. Only hand-overs whose two statements were found are cut (column cut). Tracing adds two clock reads per statement. Every NOTIFY wakes each LISTEN connection of the database, the benchmark's own (which counts the notifications) included, and the releasing session's commit signals each of them; the release statement's round trip includes that.\n\n%s\n", st.Markdown())
	}
	if raw.ok() {
		rt := &report.Table{Header: []string{"hand-over, one waiter, hold " + report.Duration(cfg.HoldShort), "hand-overs", "p50", "p99",
			"release statement p50", "acquire statement p50", "p50 ÷ raw chain", "p99 ÷ raw chain"}, TextColumns: 1}
		rt.Rows = append(rt.Rows, []string{"raw NOTIFY chain, two goroutines of one process", report.Thousands(int64(raw.Latency.N)),
			report.Duration(raw.Latency.P50), report.Duration(raw.Latency.P99),
			report.Duration(raw.Release.P50), report.Duration(raw.Acquire.P50), "1.00x", "1.00x"})
		for _, mode := range []string{herdProcesses, herdInProcess} {
			if pt := herdFind(pts, "leasetable", mode, 1); pt != nil && pt.Latency.N > 0 {
				rel, acq := "n/a", "n/a"
				if pt.Stages.N > 0 {
					rel, acq = report.Duration(pt.Stages.Release.P50), report.Duration(pt.Stages.Acquire.P50)
				}
				rt.Rows = append(rt.Rows, []string{"leasetable, " + herdModeText(mode), report.Thousands(int64(pt.Latency.N)),
					report.Duration(pt.Latency.P50), report.Duration(pt.Latency.P99), rel, acq,
					report.Ratio(float64(pt.Latency.P50), float64(raw.Latency.P50)),
					report.Ratio(float64(pt.Latency.P99), float64(raw.Latency.P99))})
			}
		}
		p("## The lease table's hand-over without pgfence\n\n")
		p("The **raw NOTIFY chain** is the lease table's hand-over protocol with nothing else: two goroutines of the benchmark's process hand one row back and forth, each with a connection for its statements and a LISTEN connection; the acquire is one `UPDATE` of the free row drawing the token from a sequence (its commit waits for the WAL flush), the release one `UPDATE` that frees the row and sends `pg_notify` in the same statement (its commit does not wait for the flush), in plain SQL on a table of the benchmark's (no function, no search_path pinning, no renewal, no pgfence code in the client), and a refused acquire waits for the notification. One more session listens, as the benchmark's counting connection does in the pgfence points. It is timed like them (from the holder starting its release to the waiter's acquire returning, after %s holds, the holder releasing once the waiter has queued), for %s after %s warm-up, before the pgfence points (next to the lease table's one-waiter points, which come first); %.2f acquire statements per hand-over. What it takes on this machine bounds what any lease table woken by NOTIFY can do here.\n\n%s\n",
			report.Duration(cfg.HoldShort), cfg.Duration, cfg.Warmup, raw.perHandover(), rt.Markdown())
	}
	if nf.ok() {
		p("%s", nf.markdown(cfg.HoldShort, raw, herdFind(pts, "leasetable", herdProcesses, 1)))
	}
	t := &report.Table{Header: append([]string{"strategy", "names", "hand-overs / s", "names ÷ (hand-overs / s)"}, header...)}
	for i := range pts {
		if pt := &pts[i]; pt.Names > 1 {
			rate := float64(pt.Latency.N) / cfg.Duration.Seconds()
			little := "n/a"
			if rate > 0 {
				little = report.Duration(time.Duration(float64(pt.Names) / rate * float64(time.Second)))
			}
			t.Rows = append(t.Rows, append([]string{pt.Strategy, report.Thousands(int64(pt.Names)), report.Rate(rate), little}, row(pt)...))
		}
	}
	if len(t.Rows) > 0 {
		p("## Many names, one waiter each, %d processes\n\nEach name has a holder and one waiter, in two different processes (neighbours in the round robin), so every hand-over crosses processes; all names run at once. Every name always has a hand-over under way, so the point runs at the strategy's full throughput and its latency is that of a queue: by Little's law the mean hand-over is the names in hand-over divided by the hand-overs per second (the column names ÷ (hand-overs / s)), whatever wakes the waiters. It shows the capacity of the Lockers and the server at 10,000 concurrent hand-overs (compare scenario 1's cycles per second), not the wake-up latency, which the one-name tables above measure.\n\n%s\n", cfg.HerdProcesses, t.Markdown())
	}
	p("## Targets (issue 18)\n\n")
	tt := &report.Table{Header: []string{"target", "goal", "measured", "verdict"}, TextColumns: 4}
	for _, tg := range herdTargets(pts, cfg.HoldShort) {
		tt.Rows = append(tt.Rows, []string{tg.What, tg.Goal, tg.Measured, tg.Met})
	}
	p("%s\n", tt.Markdown())
	herdMiss(p, pts, raw, nf, herdTargets(pts, cfg.HoldShort), cfg.HoldShort, m.Cores)
	var errs []string
	for _, pt := range pts {
		if pt.FirstErr != "" {
			errs = append(errs, fmt.Sprintf("- %s, %s, %d names, %d waiters: %d errors, first: %s", pt.Strategy, herdModeText(pt.Mode), pt.Names, pt.Waiters, pt.Errors, pt.FirstErr))
		}
	}
	if len(errs) > 0 {
		p("## Errors\n\n%s\n", strings.Join(errs, "\n"))
	}
	if err := os.MkdirAll(cfg.Out, 0o755); err != nil {
		return err
	}
	path := filepath.Join(cfg.Out, "herd.md")
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		return err
	}
	fmt.Println("wrote", path)
	return nil
}

// herdMiss explains the missed one-waiter hand-over targets of ts with the
// run's figures: what one hand-over cost, and what bounds it. It writes
// nothing when none of them was missed.
func herdMiss(q func(string, ...any), pts []herdPoint, raw *rawChainResult, nf *herdNoFlush, ts []target, hold time.Duration, cores int) {
	var lines []string
	for _, s := range herdStrategies {
		for _, mode := range []string{herdProcesses, herdInProcess} {
			if !missed(ts, fmt.Sprintf("%s hand-over at 1 waiter, hold %v, %s", s, hold, herdModeText(mode))) {
				continue
			}
			p := herdFind(pts, s, mode, 1)
			if p == nil || p.Latency.N == 0 {
				continue
			}
			line := fmt.Sprintf("- %s, %s: p50 %s, p99 %s over %d hand-overs; per hand-over %.1f statements, %s µs of server CPU and %s µs of client CPU.%s",
				s, herdModeText(mode), report.Duration(p.Latency.P50), report.Duration(p.Latency.P99), p.Latency.N,
				p.per(float64(p.Statements)), herdCPUCell(p, p.ServerCPU, p.ServerOK), herdCPUCell(p, p.ClientCPU, true), stagesText(p))
			if s == "leasetable" && raw.ok() {
				line += fmt.Sprintf(" The raw NOTIFY chain (the same protocol in plain SQL, no pgfence; herd.md) ran in this run at p50 %s, p99 %s: leasetable is %s of it at p50.",
					report.Duration(raw.Latency.P50), report.Duration(raw.Latency.P99), report.Ratio(float64(p.Latency.P50), float64(raw.Latency.P50)))
			}
			if s == "leasetable" && mode == herdProcesses && nf.ok() {
				line += fmt.Sprintf(" With fsync off (last in scenario 11; herd.md), so that the grant's WAL flush costs nothing: the raw chain p50 %s, leasetable p50 %s (%s of it), p99 %s.",
					report.Duration(nf.Raw.Latency.P50), report.Duration(nf.Leasetable.Latency.P50),
					report.Ratio(float64(nf.Leasetable.Latency.P50), float64(nf.Raw.Latency.P50)), report.Duration(nf.Leasetable.Latency.P99))
			}
			lines = append(lines, line)
		}
	}
	if len(lines) == 0 {
		return
	}
	q("### hand-over at one waiter (scenario 11)\n\n%s\n\n", strings.Join(lines, "\n"))
	q("With one waiter the hand-overs run one after another, each a chain through the server. For the lease table: the holder's release (one round trip; its commit does not wait for a WAL flush), the NOTIFY's delivery to the waiter's LISTEN connection, and the waiter's acquire, whose durable token waits for a WAL flush. For advisory locks the waiter is parked on a session of its Locker, blocked in pg_advisory_lock: the holder's unlock (one round trip), then the server's grant to the parked session and its token draw, whose commit waits for a WAL flush; no notification. No step waits for a poll or for another waiter, and the statements per hand-over are the few the chain needs; the cut at the statements (in each line above, and in herd.md) shows the two round trips, the release's and the acquire's, taking nearly all of a hand-over and pgfence's own code before, between and after them a small part. So the latency is the round trips, the flush and the CPU they take on the %d cores that the workers and PostgreSQL share here (a NOTIFY commit also signals every LISTEN connection of the database, and waking those processes takes the same cores): compare the server CPU per hand-over across runs on different machines, which moves with the p50. On a server with cores of its own the chain loses the clients' share of that CPU, and a faster flush (NVMe with power-loss protection) shortens the acquire's commit.\n\n", cores)
}
