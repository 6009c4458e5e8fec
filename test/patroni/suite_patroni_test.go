//go:build patroni

package patroni_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/pgfence/pgfence"
	"github.com/pgfence/pgfence/leasetable"
	"github.com/pgfence/pgfence/migrations"
	"github.com/pgfence/pgfence/test/chaos"
	"github.com/pgfence/pgfence/test/patroni"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		goleak.IgnoreTopFunction("github.com/jackc/pgx/v5/pgxpool.(*Pool).backgroundHealthCheck"))
}

// Leases of the short holders, and of the leases held across each fault.
const (
	shortTTL = time.Second
	longTTL  = 20 * time.Second
	// releasedTTL is the TTL of the lease released during the outage.
	releasedTTL = 10 * time.Second
	// connectTimeout is the URL's connect_timeout.
	connectTimeout = 2 * time.Second
)

// suite is one Patroni cluster with the workload running on it.
type suite struct {
	t     *testing.T
	ctx   context.Context
	mode  string
	c     *patroni.Cluster
	clock *patroni.Clock
	mon   *patroni.Monitor
	w     *patroni.Workload
	stop  context.CancelFunc

	longHolder, longContender *leasetable.Locker
	toldLate                  []string
	// strikes are the times the faults struck.
	strikes []time.Duration
	// forbidden are the steps of the history the protocol model forbids
	// (chaos.ReplayModel), set by finish.
	forbidden []string
}

func newSuite(t *testing.T, synchronous bool, budget time.Duration) *suite {
	ctx, cancel := context.WithTimeout(t.Context(), budget)
	t.Cleanup(cancel)
	s := &suite{t: t, ctx: ctx, mode: "async"}
	if synchronous {
		s.mode = "sync"
	}
	start := time.Now()
	opts := &patroni.Options{Synchronous: synchronous, Logf: t.Logf}
	if !synchronous {
		// A replica this far behind is still promoted: the negative
		// control does not depend on how much the workload wrote during
		// the cut (Patroni's default is 1 MiB).
		opts.MaxLagOnFailover = 64 << 20
	}
	c, err := patroni.Start(ctx, opts)
	require.NoError(t, err)
	s.c = c
	t.Cleanup(func() {
		if t.Failed() {
			t.Log(c.Logs(40))
		}
		c.Close()
	})
	t.Logf("patroni: run=%s cluster of %d nodes up in %v", s.mode, patroni.Nodes, time.Since(start).Round(10*time.Millisecond))

	url := c.URL(patroni.Database, connectTimeout)
	require.NoError(t, migrations.Up(ctx, migrations.Target{URL: url}, nil))
	s.clock = patroni.NewClock()
	s.mon = patroni.StartMonitor(c, s.clock)
	t.Cleanup(s.mon.Stop)
	s.w, err = patroni.NewWorkload(ctx, url, s.clock)
	require.NoError(t, err)
	t.Cleanup(s.w.Close)

	wctx, stop := context.WithCancel(ctx)
	s.stop = stop
	t.Cleanup(func() { stop(); s.w.Stop() })
	for i := 0; i < 6; i++ {
		l, err := s.w.LeaseLocker(ctx, fmt.Sprintf("hasuite-lt-%d", i), shortTTL)
		require.NoError(t, err)
		s.w.Holder(wctx, "leasetable", fmt.Sprintf("short-%d", i%2), l, uint64(i))
	}
	for i := 0; i < 4; i++ {
		l, err := s.w.AdvisoryLocker(ctx, fmt.Sprintf("hasuite-adv-%d", i))
		require.NoError(t, err)
		s.w.Holder(wctx, "advisory", fmt.Sprintf("adv-%d", i%2), l, uint64(100+i))
	}
	s.longHolder, err = s.w.LeaseLocker(ctx, "hasuite-long-holder", longTTL)
	require.NoError(t, err)
	s.longContender, err = s.w.LeaseLocker(ctx, "hasuite-long-contender", longTTL)
	require.NoError(t, err)
	return s
}

// injected is what a fault reports: when it struck (the time strike
// returned; the fault calls strike once, just before it strikes), from when
// a writable node counts as the new primary, and which node may not count.
type injected struct {
	at, from time.Duration
	exclude  int
	note     string
}

// injectFunc injects a fault on a cluster whose leader is old
// (s.c.Nodes[oldIdx]), calling strike just before it strikes.
type injectFunc func(old *patroni.Node, oldIdx int, strike func() time.Duration) injected

// fault runs one fault: on a healthy cluster, with a lease held across
// it, it injects the fault, waits for a writable primary, observes the
// recovery, and logs the figures; repair (optional) makes the cluster
// whole again.
func (s *suite) fault(name string, inject injectFunc, repair func(old *patroni.Node)) {
	t := s.t
	ctx := s.ctx
	hctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	require.NoError(t, s.c.WaitHealthy(hctx))
	cancel()
	old := s.c.Leader(ctx)
	require.NotNil(t, old, "no leader before %s", name)
	oldIdx := slices.Index(s.c.Nodes, old)

	long, err := s.w.StartLongHold(ctx, "long-"+name, longTTL, s.longHolder, s.longContender)
	require.NoError(t, err)
	// A lease released 500ms after the fault struck, while no primary may
	// be writable, and a contender waiting for it.
	rel, err := s.w.StartLongHold(ctx, "released-"+name, releasedTTL, s.longHolder, s.longContender)
	require.NoError(t, err)
	require.NoError(t, sleep(ctx, 1500*time.Millisecond))
	listen0, err := patroni.ListenSessions(ctx, old.URL(patroni.Database))
	require.NoError(t, err)

	relDone := make(chan patroni.LongResult, 1)
	struck := false
	strike := func() time.Duration {
		require.False(t, struck, "%s struck twice", name)
		struck = true
		s.strikes = append(s.strikes, s.clock.Now())
		go func() {
			_ = sleep(ctx, 500*time.Millisecond)
			relDone <- rel.Finish(ctx)
		}()
		return s.clock.Now()
	}

	in := inject(old, oldIdx, strike)
	require.True(t, struck, "%s did not strike", name)
	wctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	wr, err := s.mon.WaitWritable(wctx, in.from, in.exclude)
	cancel()
	require.NoError(t, err, "%s: no primary came back", name)
	newNode := s.c.Nodes[wr.Node]
	writable := wr.Seen.Return

	// The LISTEN connections that were on the old primary, back on the
	// new one; and the first grant there.
	listenBack, slowest := time.Duration(-1), ""
	var listenNow []string
	deadline := writable + 10*time.Second
	for s.clock.Now() < deadline {
		listenNow, _ = patroni.ListenSessions(ctx, newNode.URL(patroni.Database))
		missing := slices.DeleteFunc(slices.Clone(listen0), func(n string) bool { return slices.Contains(listenNow, n) })
		if len(missing) == 1 {
			slowest = missing[0]
		}
		if len(missing) == 0 {
			listenBack = s.clock.Now() - writable
			break
		}
		require.NoError(t, sleep(ctx, 100*time.Millisecond))
	}
	for s.clock.Now() < writable+3*time.Second || (firstGrantAfter(s.w.History(), writable, "") < 0 && s.clock.Now() < deadline) {
		require.NoError(t, sleep(ctx, 100*time.Millisecond))
	}
	lr := long.Finish(ctx)
	end := s.clock.Now()
	rr := <-relDone

	h := s.w.History()
	gap := grantGap(h, in.at, end)
	resumed := firstGrantAfter(h, writable, "")
	ltResumed, advResumed := firstGrantAfter(h, writable, "short-"), firstGrantAfter(h, writable, "adv-")
	ltFails, unavailable, sample := s.acquireFailures(h, in.at, writable+time.Second, "leasetable")
	advFails, advUnavailable, advSample := s.acquireFailures(h, in.at, writable+time.Second, "advisory")
	told, margin := s.advisoryTold(in.at, writable, name)
	t.Logf("patroni: fault=%s mode=%s at=%s old=%s new=%s to_new_primary=%s (became writable in (%s, %s]) no_grants=%s "+
		"grants_resumed_after_writable=%s (leasetable %s, advisory %s) acquire_errors=leasetable %d (ErrUnavailable %d), advisory %d (ErrUnavailable %d) "+
		"listen_back=%s (%d/%d on the new primary; last %s) long_lease=%s handover=%s advisory_told_before_writable=%s (min margin %s)%s",
		name, s.mode, secs(in.at), old.Name, newNode.Name, secs(writable-in.at), secs(wr.Before-in.at), secs(writable-in.at), secs(gap),
		secs(resumed), secs(ltResumed), secs(advResumed), ltFails, unavailable, advFails, advUnavailable,
		secs(listenBack), countIn(listenNow, listen0), len(listen0), orNone(slowest),
		longText(lr), handover(lr), told, secs(margin), in.note)
	t.Logf("patroni: fault=%s release_in_outage: called at +%s, returned at +%s, %s, contender granted %s",
		name, secs(rr.ReleasedAt-in.at), secs(rr.ReleaseReturned-in.at), releaseText(rr), grantedAfter(rr, writable))
	if sample != "" {
		t.Logf("patroni: fault=%s first leasetable acquire error: %s", name, sample)
	}
	if advSample != "" {
		t.Logf("patroni: fault=%s first advisory acquire error: %s", name, advSample)
	}
	if repair != nil {
		repair(old)
	}
}

// advisoryTold checks that every advisory holder holding its lock when the
// fault struck stopped believing it held it before the new primary was
// seen writable; it returns "n/m" and the smallest margin.
func (s *suite) advisoryTold(at, writable time.Duration, fault string) (string, time.Duration) {
	r := patroni.CheckToldBefore(s.w.Holds(), "advisory", at, writable)
	for _, l := range r.Late {
		s.toldLate = append(s.toldLate, fault+": "+l)
	}
	return fmt.Sprintf("%d/%d", r.Told, r.Held), r.MinMargin
}

// finish stops the workload, reads the final state and checks the run.
func (s *suite) finish() *patroni.Violations {
	t := s.t
	s.stop()
	s.w.Stop()
	final, err := s.w.ReadFinal(s.ctx)
	require.NoError(t, err)
	h := s.w.History()
	v := patroni.Check(h, s.w.Holds(), final, s.w.Resources(), s.strikes)
	v.AdvisoryToldLate = s.toldLate
	z := patroni.Zombies(h)
	t.Logf("patroni: run=%s grants=%d writes_acknowledged=%d writes_fenced=%d audit_rows=%d zombies=%d (last write fenced %d, accepted %d, failed or unknown %d)",
		s.mode, h.Count(chaos.Acquire, chaos.Ok), h.Count(chaos.Write, chaos.Ok), fencedCount(h), len(final.Audit),
		z.Zombies, z.Fenced, z.Accepted, z.Other)
	for _, op := range z.Last {
		t.Logf("zombie: %s", op)
	}
	for _, l := range v.AdvisoryBeliefLag {
		t.Logf("advisory holder cut off by a fault, still believing: %s", l)
	}
	t.Logf("patroni: run=%s violations=%d %s advisory_belief_lags=%d", s.mode, v.Total(), v.Counts(), len(v.AdvisoryBeliefLag))
	// The history replayed through the protocol model's transition rules.
	s.forbidden = chaos.ReplayModel(h, nil)
	t.Logf("patroni: run=%s model_replay_ops=%d model_replay_forbidden=%d", s.mode, len(h), len(s.forbidden))
	for i, f := range s.forbidden {
		if i == 5 {
			break
		}
		t.Logf("model forbids: %s", f)
	}
	return v
}

func TestPatroniSynchronous(t *testing.T) {
	s := newSuite(t, true, 7*time.Minute)
	c := s.c

	s.fault("switchover", func(old *patroni.Node, oldIdx int, strike func() time.Duration) injected {
		at := strike()
		require.NoError(t, c.Switchover(s.ctx, old))
		return injected{at: at, from: at, exclude: oldIdx}
	}, nil)

	s.fault("primary-kill", func(old *patroni.Node, oldIdx int, strike func() time.Duration) injected {
		at := strike()
		_, err := old.KillPostmaster()
		require.NoError(t, err)
		return injected{at: at, from: at, exclude: oldIdx}
	}, nil)

	s.fault("node-crash", func(old *patroni.Node, oldIdx int, strike func() time.Duration) injected {
		at := strike()
		require.NoError(t, old.Crash())
		return injected{at: at, from: at, exclude: oldIdx}
	}, func(old *patroni.Node) { require.NoError(t, old.Start()) })

	// The replication of the primary is cut (blackholed), then the node
	// crashes. Patroni drops the synchronous standby once the primary's
	// walsenders time out, so the primary commits alone; after the crash
	// no replica may be promoted (none is known to have every commit),
	// and the primary is back only when its node is.
	s.fault("replication-cut-then-crash", s.cutThenCrash(true), nil)

	v := s.finish()
	require.Zero(t, v.Total(), "synchronous replication must keep every invariant:\n%s", v)
	require.Empty(t, s.forbidden, "the protocol model forbids steps of the synchronous run")
}

// cutThenCrash returns the replication-cut-then-crash fault. In
// synchronous mode the crashed node is restarted after ttl+3s, once it is
// clear that no replica was promoted.
func (s *suite) cutThenCrash(synchronous bool) injectFunc {
	return func(old *patroni.Node, oldIdx int, strike func() time.Duration) injected {
		t := s.t
		cut := s.clock.Now()
		old.Replication.Blackhole(true)
		// Past wal_sender_timeout (5s) and a Patroni loop: in synchronous
		// mode the primary has dropped its synchronous standby and commits
		// alone; in either mode the replicas fall behind.
		require.NoError(t, sleep(s.ctx, 7*time.Second))
		stall := grantGap(s.w.History(), cut, s.clock.Now())
		at := strike()
		require.NoError(t, old.Crash())
		from := s.clock.Now()
		note := fmt.Sprintf(" cut_before_crash=%s no_grants_during_cut=%s", secs(at-cut), secs(stall))
		if !synchronous {
			return injected{at: at, from: from, exclude: oldIdx, note: note}
		}
		require.NoError(t, sleep(s.ctx, 13*time.Second))
		promoted := s.mon.WritableNodes(from, s.clock.Now())
		note += fmt.Sprintf(" replicas_promoted_while_node_down=%d", len(promoted))
		old.Replication.Blackhole(false)
		require.NoError(t, old.Start())
		return injected{at: at, from: from, exclude: -1, note: note}
	}
}

func TestPatroniAsynchronousShowsDanger(t *testing.T) {
	s := newSuite(t, false, 4*time.Minute)
	s.fault("replication-cut-then-crash", s.cutThenCrash(false), nil)
	v := s.finish()
	// The negative control: asynchronous replication loses what the
	// primary committed after the cut, and the checker must say so.
	require.NotZero(t, v.Total(), "asynchronous replication with a cut and a crash must show violations")
	require.NotEmpty(t, s.forbidden, "the protocol model's replay must forbid steps of the asynchronous run")
	t.Logf("patroni: run=async danger detected as expected:\n%s", v)
}

// grantGap is the longest time without a successful grant (of the short
// holders) within [from, to], counting from the last grant before from.
func grantGap(h chaos.History, from, to time.Duration) time.Duration {
	var times []time.Duration
	last := time.Duration(-1)
	for _, op := range h {
		if op.Kind != chaos.Acquire || op.Outcome != chaos.Ok || !short(op.Name) {
			continue
		}
		r := time.Duration(op.Return)
		switch {
		case r < from:
			last = max(last, r)
		case r <= to:
			times = append(times, r)
		}
	}
	slices.Sort(times)
	prev := from
	if last >= 0 {
		prev = last
	}
	gap := time.Duration(0)
	for _, r := range times {
		gap = max(gap, r-prev)
		prev = r
	}
	return max(gap, to-prev)
}

// firstGrantAfter is the time from t to the first successful grant of a
// short holder (whose lock's name starts with prefix) returned after t; -1
// if none.
func firstGrantAfter(h chaos.History, t time.Duration, prefix string) time.Duration {
	best := time.Duration(-1)
	for _, op := range h {
		if op.Kind != chaos.Acquire || op.Outcome != chaos.Ok || !short(op.Name) || !strings.HasPrefix(op.Name, prefix) {
			continue
		}
		if r := time.Duration(op.Return); r > t && (best < 0 || r-t < best) {
			best = r - t
		}
	}
	return best
}

// acquireFailures counts the Acquire calls of strategy that failed, other
// than by waiting out their time for a held lock, in [from, to], and how
// many of them matched pgfence.ErrUnavailable; it returns the first's
// error.
func (s *suite) acquireFailures(h chaos.History, from, to time.Duration, strategy string) (n, unavailable int, first string) {
	for _, op := range h {
		r := time.Duration(op.Return)
		if op.Kind != chaos.Acquire || op.Outcome != chaos.Fail || r < from || r > to ||
			strings.HasPrefix(op.Name, "adv-") != (strategy == "advisory") {
			continue
		}
		if strings.Contains(op.Err, pgfence.ErrNotAcquired.Error()) || strings.Contains(op.Err, context.DeadlineExceeded.Error()) && !strings.Contains(op.Err, "connect") {
			continue
		}
		n++
		if s.w.Unavailable(op.Index) {
			unavailable++
		}
		if first == "" {
			first = strings.Join(strings.Fields(op.Err), " ")
			if len(first) > 300 {
				first = first[:300] + "..."
			}
		}
	}
	return n, unavailable, first
}

// short reports whether name is one of the short holders' locks.
func short(name string) bool {
	return strings.HasPrefix(name, "short-") || strings.HasPrefix(name, "adv-")
}

func fencedCount(h chaos.History) int {
	n := 0
	for _, op := range h {
		if op.Kind == chaos.Write && op.Fenced {
			n++
		}
	}
	return n
}

func orNone(s string) string {
	if s == "" {
		return "none"
	}
	return s
}

func countIn(have, want []string) int {
	n := 0
	for _, w := range want {
		if slices.Contains(have, w) {
			n++
		}
	}
	return n
}

func longText(r patroni.LongResult) string {
	state := "kept"
	if !r.Kept {
		state = "lost"
	}
	s := fmt.Sprintf("%s(writes %d ok, %d failed)", state, r.Writes, r.Failed)
	if r.ReleaseErr != nil && !errors.Is(r.ReleaseErr, pgfence.ErrNotHeld) {
		s += " release_failed"
	}
	return s
}

// releaseText describes the release made during the outage.
func releaseText(r patroni.LongResult) string {
	switch {
	case !r.Kept:
		return "lease lost before the release"
	case r.ReleaseErr != nil && !errors.Is(r.ReleaseErr, pgfence.ErrNotHeld):
		return "release failed"
	}
	return "released"
}

// grantedAfter says when the contender of the lease released in the
// outage was granted it, relative to the new primary being writable.
func grantedAfter(r patroni.LongResult, writable time.Duration) string {
	if !r.Granted {
		return "not within a minute of the release"
	}
	if d := r.GrantedAt - writable; d >= 0 {
		return fmt.Sprintf("%s after the new primary was writable", secs(d))
	}
	return fmt.Sprintf("%s before the new primary was writable", secs(writable-r.GrantedAt))
}

// handover describes the long lease's hand-over to its contender.
func handover(r patroni.LongResult) string {
	switch {
	case !r.Granted:
		return "none"
	case r.HandOver < 0:
		return fmt.Sprintf("%s_before_the_holder_knew", secs(-r.HandOver))
	}
	return secs(r.HandOver)
}

func secs(d time.Duration) string {
	if d < 0 {
		return "none"
	}
	return fmt.Sprintf("%.2fs", d.Seconds())
}

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
