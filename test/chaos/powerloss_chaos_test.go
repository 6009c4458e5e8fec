//go:build chaos && linux

package chaos_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence/advisory"
	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/leasetable"
	"github.com/pgfence/pgfence/test/chaos"
)

// powerLossSettings are the servers' settings: durable (fsync on, full
// pages after each checkpoint; fsync off for the control), asynchronous
// commit by default, so that no token is durable unless pgfence's draw
// makes it so, and a WAL writer that flushes rarely on its own.
func powerLossSettings(fsync bool) map[string]string {
	s := map[string]string{
		"fsync":              "on",
		"full_page_writes":   "on",
		"synchronous_commit": "off",
		"wal_writer_delay":   "10s",
		"autovacuum":         "off",
	}
	if !fsync {
		s["fsync"] = "off"
	}
	return s
}

// plCluster is a throwaway cluster whose data directory is on a
// PowerLossFS.
type plCluster struct {
	t    *testing.T
	c    *pgtest.Cluster
	db   *pgtest.DB
	fs   *chaos.PowerLossFS
	mu   sync.Mutex
	cuts []chaos.CutStats
}

// newPowerLossCluster starts a cluster with settings and a migrated
// database, stops it cleanly, moves its data directory to a backing
// directory and mounts a PowerLossFS over it at the old place, and starts
// it again: from then on every file of the data directory goes through the
// filesystem.
func newPowerLossCluster(t *testing.T, ctx context.Context, settings map[string]string) *plCluster {
	t.Helper()
	require.NoError(t, chaos.CheckPowerLoss())
	c, s := pgtest.NewCluster(t, &pgtest.ClusterOptions{Settings: settings})
	pc := &plCluster{t: t, c: c}
	// Registered before the database, so that it runs after the database
	// is dropped and before the cluster is destroyed.
	t.Cleanup(func() {
		if err := killServer(c); err != nil {
			t.Error(err)
		}
		if pc.fs != nil {
			require.NoError(t, pc.fs.Unmount())
		}
	})
	pc.db = s.NewDB(t)
	// The registers exist before the filesystem is mounted: a cut never
	// takes them away, only their rows' updates.
	for _, n := range plNames {
		_, err := chaos.NewSQLRegister(ctx, pc.db.Pool, plTable(n), true)
		require.NoError(t, err)
	}
	pc.db.Pool.Reset()
	require.NoError(t, c.Stop())
	backing := filepath.Join(c.Dir, "backing")
	require.NoError(t, os.Rename(c.DataDir, backing))
	var st syscall.Stat_t
	require.NoError(t, syscall.Stat(backing, &st))
	require.NoError(t, os.Mkdir(c.DataDir, 0o700))
	require.NoError(t, os.Chown(c.DataDir, int(st.Uid), int(st.Gid)))
	fs, err := chaos.MountPowerLoss(backing, c.DataDir)
	require.NoError(t, err)
	pc.fs = fs
	require.NoError(t, c.Start(ctx))
	return pc
}

// cut cuts the power: every server process dies at once, the writes not
// yet fsynced are lost, and the server starts again (crash recovery).
func (pc *plCluster) cut(ctx context.Context) error {
	start := time.Now()
	if err := killServer(pc.c); err != nil {
		return err
	}
	killed := time.Now()
	st, err := pc.fs.PowerCut()
	if err != nil {
		return err
	}
	dropped := time.Now()
	defer func() {
		pc.t.Logf("power cut: server killed in %v, %d bytes in %d files dropped in %v, restarted in %v",
			killed.Sub(start).Round(time.Millisecond), st.Bytes, st.Files, dropped.Sub(killed).Round(time.Millisecond),
			time.Since(dropped).Round(time.Millisecond))
	}()
	pc.mu.Lock()
	pc.cuts = append(pc.cuts, st)
	pc.mu.Unlock()
	// With fsync off the server never synced its lock file, which the cut
	// left empty; the server refuses to start on an empty one. Remove it,
	// as an operator would.
	pidFile := filepath.Join(pc.c.DataDir, "postmaster.pid")
	if fi, err := os.Stat(pidFile); err == nil && fi.Size() == 0 {
		if err := os.Remove(pidFile); err != nil {
			return err
		}
	}
	return pc.c.Start(ctx)
}

// dropped sums what the cuts dropped.
func (pc *plCluster) dropped() (cuts, files int, bytes int64) {
	pc.mu.Lock()
	defer pc.mu.Unlock()
	for _, st := range pc.cuts {
		files += st.Files
		bytes += st.Bytes
	}
	return len(pc.cuts), files, bytes
}

// killServer kills the postmaster and every process it started at once
// (SIGKILL; backends lead process groups of their own, so each is killed
// by pid, after SIGSTOP has kept the postmaster from starting more) and
// waits until none of them runs.
func killServer(c *pgtest.Cluster) error {
	pid := c.Pid()
	if pid == 0 {
		return nil
	}
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil && !errors.Is(err, syscall.ESRCH) {
		return fmt.Errorf("stop postmaster %d: %w", pid, err)
	}
	procs := append([]int{pid}, childrenOf(pid)...)
	for _, p := range procs {
		_ = syscall.Kill(p, syscall.SIGKILL)
	}
	if err := c.Crash(syscall.SIGKILL); err != nil {
		return err
	}
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		left := 0
		for _, p := range procs {
			if st, ok := procStat(p); ok && st[0] != "Z" {
				left++
			}
		}
		if left == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%d server processes still run 30s after SIGKILL", left)
		}
	}
}

// procStat returns the fields of /proc/pid/stat after the command name:
// state, ppid, pgrp, ...
func procStat(pid int) ([]string, bool) {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return nil, false
	}
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	return f, len(f) > 2
}

// childrenOf returns the pids of the processes whose parent is pid.
func childrenOf(pid int) []int {
	ents, _ := os.ReadDir("/proc")
	want := strconv.Itoa(pid)
	var out []int
	for _, e := range ents {
		p, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if st, ok := procStat(p); ok && st[1] == want {
			out = append(out, p)
		}
	}
	return out
}

// plNames name the workloads of the power-loss scenarios.
var plNames = []string{"lease", "lease-checked", "advisory-a", "advisory-b", "advisory-c", "advisory-xact", "permit"}

func plTable(name string) string { return "pl_" + strings.ReplaceAll(name, "-", "_") }

// plWorkload is one register and its lock name under the power-loss
// scenario, run by its own workers.
type plWorkload struct {
	name    string
	kind    lockerKind
	lockers []chaos.Locker
	workers int
	reg     chaos.Register
	final   finalReader
	hist    chaos.History
}

// powerLossWorkloads returns every workload of the scenario: leases with
// fenced writes and with lease-checked writes (renewed every 100ms, while
// holders sleep up to 120ms), three names sharing one advisory Locker
// (one session: grants requested together are drawn by one combined
// statement), advisory transaction locks, and the one permit of a
// semaphore taken by two Lockers (whose releases hand it to the other's
// waiting call). Lockers run on lockPool, at the server's asynchronous
// commit; the registers on regPool, at synchronous commit, so an
// acknowledged write is durable.
func powerLossWorkloads(t *testing.T, ctx context.Context, lockPool, regPool, admin *pgxpool.Pool) []*plWorkload {
	t.Helper()
	register := func(table, lease string) (chaos.Register, finalReader) {
		r, err := chaos.NewFenceRegister(ctx, admin, table, lease)
		require.NoError(t, err)
		return r.On(regPool), r
	}
	var ws []*plWorkload
	add := func(name string, kind lockerKind, lockers []chaos.Locker, workers int, lease string) {
		for i, l := range lockers {
			lockers[i] = pausingLocker{l}
		}
		reg, final := register(plTable(name), lease)
		ws = append(ws, &plWorkload{name: name, kind: kind, lockers: lockers, workers: workers, reg: reg, final: final})
	}
	add("lease", kindLease, realLockers(t, kindLease, lockPool, realOpts{Workers: 2}), 2, "")
	add("lease-checked", kindLeaseChecked, realLockers(t, kindLeaseChecked, lockPool, realOpts{Workers: 2}), 2, "pl-lease-checked")

	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	shared, err := advisory.New(cctx, lockPool, &advisory.Config{
		MaxSessions: 1, SessionCheckInterval: 100 * time.Millisecond, QueryTimeout: time.Second,
		MaxPollInterval: 20 * time.Millisecond,
	})
	require.NoError(t, err)
	t.Cleanup(shared.Close)
	for _, n := range []string{"advisory-a", "advisory-b", "advisory-c"} {
		add(n, kindAdvisory, []chaos.Locker{&chaos.PgfenceLocker{L: shared}}, 2, "")
	}
	add("advisory-xact", kindAdvisoryTx, realLockers(t, kindAdvisoryTx, lockPool, realOpts{Workers: 2}), 2, "")
	var permits []chaos.Locker
	for range 2 {
		k, err := leasetable.New(cctx, lockPool, &leasetable.Config{TTL: 300 * time.Millisecond})
		require.NoError(t, err)
		t.Cleanup(k.Close)
		permits = append(permits, &permitLocker{k: k, pool: lockPool})
	}
	add("permit", kindPermit, permits, 2, "")
	return ws
}

// permitLocker takes the one permit of semaphore name. It counts the
// grants that came by hand-over from a release without a flush: their
// lease keeps the old one's expiry, so its row expires less than a TTL
// after it was granted (read right after the grant; one renewed since,
// or unreadable while the server is down, is not counted).
type permitLocker struct {
	k      *leasetable.Locker
	pool   *pgxpool.Pool
	handed atomic.Int64
}

func (p *permitLocker) Acquire(ctx context.Context, name string) (chaos.Holder, error) {
	l, err := p.k.AcquirePermit(ctx, name, 1, nil)
	if err != nil {
		return nil, err
	}
	var short bool
	if p.pool.QueryRow(ctx, `SELECT expires_at - acquired_at < interval '300 milliseconds'
		FROM pgfence.pgfence_leases WHERE name = $1 AND fence = $2`, l.Name(), l.Token()).Scan(&short) == nil && short {
		p.handed.Add(1)
	}
	return l, nil
}

// handedOver counts the permit workload's grants by hand-over.
func handedOver(ws []*plWorkload) int64 {
	var n int64
	for _, w := range ws {
		for _, l := range w.lockers {
			if p, ok := l.(pausingLocker).Locker.(*permitLocker); ok {
				n += p.handed.Load()
			}
		}
	}
	return n
}

// pausingLocker pauses 50ms after a failed Acquire, so that a worker does
// not spin while the server is down.
type pausingLocker struct{ chaos.Locker }

func (l pausingLocker) Acquire(ctx context.Context, name string) (chaos.Holder, error) {
	h, err := l.Locker.Acquire(ctx, name)
	if err != nil {
		sleepCtx(ctx, 50*time.Millisecond)
	}
	return h, err
}

func sleepCtx(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}

// combinedGrants counts the grants of the shared advisory Locker whose
// token shares its block of 1024 with a grant of another name: the grants
// of one combined statement (one pgfence_next_tokens call draws a block).
func combinedGrants(ws []*plWorkload) int {
	names := map[int64]map[string]int{}
	for _, w := range ws {
		if w.kind != kindAdvisory {
			continue
		}
		for _, op := range w.hist {
			if op.Kind == chaos.Acquire && op.Outcome == chaos.Ok {
				b := (op.Token - 1) / 1024
				if names[b] == nil {
					names[b] = map[string]int{}
				}
				names[b][op.Name]++
			}
		}
	}
	n := 0
	for _, byName := range names {
		if len(byName) > 1 {
			for _, c := range byName {
				n += c
			}
		}
	}
	return n
}

// runPowerLoss runs every workload on a cluster on a PowerLossFS: load for
// phase, then a power cut, cuts times, then load for phase again; and
// returns the workloads with their histories and final states.
func runPowerLoss(t *testing.T, ctx context.Context, pc *plCluster, cuts int, phase time.Duration) ([]*plWorkload, []chaos.RegisterState) {
	t.Helper()
	url := pc.c.URL(pc.db.Name)
	lockPool := appPool(t, ctx, url, "powerloss-locker", 16, nil)
	regPool := appPool(t, ctx, url, "powerloss-register", 16, func(cfg *pgxpool.Config) {
		cfg.ConnConfig.RuntimeParams["synchronous_commit"] = "on"
	})
	admin := appPool(t, ctx, url, "powerloss-admin", 2, nil)
	ws := powerLossWorkloads(t, ctx, lockPool, regPool, admin)

	// One recorder, so that the histories share a clock (the model's
	// replay orders grants across names); each workload's processes from
	// 100*i.
	rec := chaos.NewRecorder()
	wctx, stop := context.WithCancel(ctx)
	defer stop()
	var wg sync.WaitGroup
	for i, w := range ws {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := chaos.Run(wctx, chaos.WorkloadConfig{
				Lockers: w.lockers, Register: w.reg, Recorder: rec, Name: "pl-" + w.name, Workers: w.workers,
				ProcessBase: 100 * i, Duration: 3 * time.Minute, MaxSleep: 120 * time.Millisecond,
				OpTimeout: 2 * time.Second, Seed: uint64(i + 1),
			})
			if err != nil {
				t.Errorf("%s: %v", w.name, err)
			}
		}()
	}
	for i := 0; i <= cuts && !t.Failed(); i++ {
		sleepCtx(ctx, phase)
		progress(t, ctx, rec, len(ws))
		if i < cuts {
			if err := pc.cut(ctx); err != nil {
				t.Errorf("power cut %d: %v", i, err)
			}
		}
	}
	stop()
	wg.Wait()
	all := rec.History()
	for i, w := range ws {
		for _, op := range all {
			if op.Process/100 == i {
				w.hist = append(w.hist, op)
			}
		}
	}
	require.False(t, t.Failed())
	n, files, bytes := pc.dropped()
	t.Logf("power cuts: %d; dropped %d bytes not yet fsynced in %d files", n, bytes, files)
	require.Equal(t, cuts, n)
	require.Positive(t, bytes, "the cuts dropped nothing: they proved nothing")

	finals := make([]chaos.RegisterState, len(ws))
	for i, w := range ws {
		finals[i] = finalState(t, ctx, w.final)
	}
	return ws, finals
}

// progress waits (up to a minute) until every workload has had 2 writes
// acknowledged since it was last called, so that each cut has grants and
// writes to lose and each restart is followed by load.
func progress(t *testing.T, ctx context.Context, rec *chaos.Recorder, workloads int) {
	t.Helper()
	from := len(rec.History())
	for deadline := time.Now().Add(time.Minute); ctx.Err() == nil; sleepCtx(ctx, 100*time.Millisecond) {
		acked := make([]int, workloads)
		for _, op := range rec.History()[from:] {
			if op.Kind == chaos.Write && op.Outcome == chaos.Ok {
				acked[op.Process/100]++
			}
		}
		done := true
		for _, n := range acked {
			done = done && n >= 2
		}
		if done {
			return
		}
		if time.Now().After(deadline) {
			t.Errorf("workloads made no progress in a minute: writes acknowledged %v", acked)
			return
		}
	}
}

// merged returns the histories of every workload in one, for the checks
// across names: a transaction lock's grant counts once its transaction
// committed (see chaos.CheckOpts.TxScoped), and reads and writes are named
// after their workload's register.
func merged(ws []*plWorkload) chaos.History {
	var all chaos.History
	for _, w := range ws {
		h := w.hist
		if w.kind == kindAdvisoryTx {
			h = chaos.WithoutUncommittedGrants(h)
		}
		for _, op := range h {
			if op.Kind == chaos.Read || op.Kind == chaos.Write {
				op.Name = "register-" + w.name
			}
			all = append(all, op)
		}
	}
	return all
}

// Power cuts under load on a durable server (fsync on): leases of both
// kinds of write (with renewals and releases), advisory session locks
// whose grants are drawn by combined statements, and advisory transaction
// locks, each guarding its register with fenced writes. Every cut loses
// what was not fsynced. Each history is linearizable: no acknowledged
// fenced write lost, no stale write landed, tokens increasing per name;
// and no token was handed out twice across all of them.
func TestPowerLossWorkloads(t *testing.T) {
	ctx := ctxFor(t, 4*time.Minute)
	pc := newPowerLossCluster(t, ctx, powerLossSettings(true))
	ws, finals := runPowerLoss(t, ctx, pc, 3, 3*time.Second)
	for i, w := range ws {
		h := w.hist
		require.Positive(t, h.Count(chaos.Write, chaos.Ok), "%s: no acknowledged write", w.name)
		t.Logf("%s: acquires ok %d fail %d; writes ok %d unknown %d; fenced %d; ops by holders told of the loss %d",
			w.name, h.Count(chaos.Acquire, chaos.Ok), h.Count(chaos.Acquire, chaos.Fail),
			h.Count(chaos.Write, chaos.Ok), h.Count(chaos.Write, chaos.Unknown),
			countFencedKind(h, chaos.Read)+countFencedKind(h, chaos.Write), countLost(h))
		verdict(t, h, &chaos.CheckOpts{
			Name: "power-loss-" + w.name, Final: &finals[i].Value, Claim: true, TxScoped: w.kind == kindAdvisoryTx,
		}, false)
	}
	combined := combinedGrants(ws)
	t.Logf("advisory: %d grants drawn by combined statements", combined)
	require.Positive(t, combined, "no advisory grants were drawn by one combined statement")
	handed := handedOver(ws)
	t.Logf("permit: %d grants handed over by a release without a flush", handed)
	require.Positive(t, handed, "no permit was handed over without a flush")
	all := merged(ws)
	require.Empty(t, chaos.CheckTokensUnique(all))
	forbidden := chaos.ReplayModel(all, &chaos.CheckOpts{Claim: true})
	t.Logf("power-loss: %d grants across every workload, no token handed out twice; model-replay: scenario=power-loss ops=%d forbidden=%d",
		all.Count(chaos.Acquire, chaos.Ok), len(all), len(forbidden))
	require.Empty(t, forbidden, "the protocol model forbids steps of the merged history")
}

// Negative control: the same cut on a server with fsync off, which never
// makes anything durable: the cut takes the cluster back to where it was
// mounted, and tokens are handed out again and acknowledged writes lost.
func TestPowerLossFsyncOffControl(t *testing.T) {
	ctx := ctxFor(t, 4*time.Minute)
	pc := newPowerLossCluster(t, ctx, powerLossSettings(false))
	ws, finals := runPowerLoss(t, ctx, pc, 1, 3*time.Second)
	for i, w := range ws {
		r, err := chaos.Check(w.hist, &chaos.CheckOpts{
			Name: "negative-control-power-loss-fsync-off-" + w.name, Final: &finals[i].Value, Claim: true,
			TxScoped: w.kind == kindAdvisoryTx, Dir: t.TempDir(),
		})
		require.NoError(t, err)
		t.Logf("%s; first violation: %s", r.Summary(), firstOr(r.Violations, string(r.Linearizability)))
	}
	// The lease workload ran before and after the cut on every schedule.
	verdict(t, ws[0].hist, &chaos.CheckOpts{Name: "negative-control-power-loss-fsync-off", Final: &finals[0].Value, Claim: true}, true)
	all := merged(ws)
	reissued := chaos.CheckTokensUnique(all)
	require.NotEmpty(t, reissued, "fsync off: no token was handed out twice")
	t.Logf("fsync off: %d tokens handed out twice, e.g. %s", len(reissued), reissued[0])
	forbidden := chaos.ReplayModel(all, &chaos.CheckOpts{Claim: true})
	require.NotEmpty(t, forbidden, "fsync off: the model's replay found no forbidden step")
	t.Logf("model-replay: scenario=negative-control-power-loss-fsync-off ops=%d forbidden=%d verdict=violation detected; first: %s",
		len(all), len(forbidden), forbidden[0])
}

// Tokens drawn with pgfence_next_token() between power cuts, at
// asynchronous commit with the WAL writer nearly idle, are never reissued:
// a draw waits for the flush when the WAL covering its token is not on
// disk. Negative control: plain nextval() on the same sequence, the draw
// without that test, is reissued after a cut.
func TestPowerLossTokenDraws(t *testing.T) {
	ctx := ctxFor(t, 3*time.Minute)
	pc := newPowerLossCluster(t, ctx, powerLossSettings(true))
	url := pc.c.URL(pc.db.Name)

	const rounds, perRound = 3, 40
	rec := chaos.NewRecorder()
	for i := 0; i < rounds; i++ {
		conn := connectURL(t, ctx, url)
		drawTokens(t, ctx, rec, conn, i, perRound, "")
		require.NoError(t, pc.cut(ctx))
	}
	drawTokens(t, ctx, rec, connectURL(t, ctx, url), rounds, perRound, "")
	_, files, bytes := pc.dropped()
	t.Logf("pgfence_next_token(): %d cuts dropped %d bytes in %d files", rounds, bytes, files)
	verdict(t, rec.History(), &chaos.CheckOpts{Name: "power-loss-pgfence_next_token"}, false)

	neg := chaos.NewRecorder()
	reissuedRounds := 0
	for i := 0; i < rounds; i++ {
		before := len(chaos.CheckTokensUnique(neg.History()))
		plainNextval(t, ctx, neg, connectURL(t, ctx, url), i, perRound)
		require.NoError(t, pc.cut(ctx))
		plainNextval(t, ctx, neg, connectURL(t, ctx, url), i, 1)
		h := neg.History()
		reissued := len(chaos.CheckTokensUnique(h)) > before
		if reissued {
			reissuedRounds++
		}
		t.Logf("plain nextval() round %d: last token before the cut %d, first after %d, reissued=%v",
			i, h[len(h)-2].Token, h[len(h)-1].Token, reissued)
	}
	t.Logf("plain nextval(): a token was reissued after %d of %d power cuts", reissuedRounds, rounds)
	verdict(t, neg.History(), &chaos.CheckOpts{Name: "negative-control-power-loss-plain-nextval"}, true)
}
