//go:build chaos

package chaos_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence"
	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/leasetable"
	"github.com/pgfence/pgfence/test/chaos"
)

// permitRun is one semaphore workload: workers of three Lockers take a
// permit of "sem" (asking for permits), hold it a few milliseconds and
// release it, while the nemesis, if set, runs; a sampler counts the
// permits held on the database clock. It returns the history and the
// largest count sampled.
func permitRun(t *testing.T, ctx context.Context, db *pgtest.DB, permits, grants int, nemesisFault func(rec *chaos.Recorder, i int)) (chaos.History, int) {
	t.Helper()
	rec := chaos.NewRecorder()
	var lockers []*leasetable.Locker
	for i := range 3 {
		pool := db.NewPool(t, func(c *pgxpool.Config) {
			c.MaxConns = 4
			c.ConnConfig.RuntimeParams["application_name"] = "chaos-permit-holder"
		})
		k, err := leasetable.New(ctx, pool, &leasetable.Config{TTL: 600 * time.Millisecond, Owner: fmt.Sprintf("locker-%d", i)})
		require.NoError(t, err)
		t.Cleanup(k.Close)
		lockers = append(lockers, k)
	}
	wctx, stop := context.WithCancel(ctx)
	defer stop()
	var peak atomic.Int64
	var sampler sync.WaitGroup
	sampler.Add(1)
	go func() {
		defer sampler.Done()
		for wctx.Err() == nil {
			var n int64
			if err := db.Pool.QueryRow(wctx, `SELECT count(*) FROM pgfence.pgfence_leases
				WHERE name LIKE 'sem' || chr(31) || '%' AND expires_at > now()`).Scan(&n); err == nil {
				for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
				}
			}
			time.Sleep(2 * time.Millisecond)
		}
	}()
	var wait func() int
	if nemesisFault != nil {
		wait = nemesis(wctx, 40*time.Millisecond, func(i int) { nemesisFault(rec, i) })
	}
	var granted atomic.Int64
	var wg sync.WaitGroup
	for w := range 6 {
		k := lockers[w%3]
		wg.Add(1)
		go func() {
			defer wg.Done()
			rnd := rand.New(rand.NewPCG(uint64(w), 36))
			for wctx.Err() == nil && granted.Load() < int64(grants) {
				p := rec.Invoke(chaos.Op{Process: w, Kind: chaos.Acquire, Name: "sem"})
				l, err := k.AcquirePermit(wctx, "sem", permits, &pgfence.AcquireOpts{WaitTimeout: 3 * time.Second})
				if err != nil {
					p.Complete(chaos.Fail, func(o *chaos.Op) { o.Err = err.Error() })
					continue
				}
				granted.Add(1)
				p.Complete(chaos.Ok, func(o *chaos.Op) { o.Name, o.Token = l.Name(), l.Token() })
				time.Sleep(time.Duration(2+rnd.IntN(6)) * time.Millisecond)
				r := rec.Invoke(chaos.Op{Process: w, Kind: chaos.Release, Name: l.Name(), Token: l.Token(), Lost: l.Err() != nil})
				err = l.Release(context.WithoutCancel(wctx))
				r.Complete(chaos.Classify(err), nil)
			}
		}()
	}
	wg.Wait()
	stop()
	if wait != nil {
		t.Logf("nemesis rounds: %d", wait())
	}
	sampler.Wait()
	return rec.History(), int(peak.Load())
}

// crashedClient takes a permit as a client that crashes at once (never
// renewed nor released; it expires after 200ms), recorded as a grant that
// is never released.
func crashedClient(ctx context.Context, db *pgtest.DB, rec *chaos.Recorder, i int) {
	p := rec.Invoke(chaos.Op{Process: 100 + i, Kind: chaos.Acquire, Name: "sem"})
	var ok bool
	var name *string
	var token *int64
	err := db.Pool.QueryRow(ctx, `SELECT acquired, name, fence FROM pgfence.pgfence_acquire_permit('sem', 2, 'crashed', 200000)`).
		Scan(&ok, &name, &token)
	if err != nil || !ok {
		p.Complete(chaos.Fail, nil)
		return
	}
	p.Complete(chaos.Ok, func(o *chaos.Op) { o.Name, o.Token = *name, *token })
}

// TestPermitsUnderFaults: a semaphore of 2 permits, six workers of three
// Lockers, while the holders' backends are killed (pg_terminate_backend)
// and crashed clients take permits they never give back. Never more than 2
// valid permits (by the history, fenced-out holders not counted, and on
// the database clock), tokens unique and growing per permit.
func TestPermitsUnderFaults(t *testing.T) {
	t.Parallel()
	ctx := ctxFor(t, 2*time.Minute)
	db := pgtest.NewDB(t)
	grants, _ := soak(400, 0)
	killed := 0
	h, peak := permitRun(t, ctx, db, 2, grants, func(rec *chaos.Recorder, i int) {
		if i%3 == 2 {
			crashedClient(ctx, db, rec, i)
			return
		}
		n, _ := chaos.TerminateBackends(ctx, db.Pool, db.Name, "chaos-permit-holder")
		killed += n
	})
	t.Logf("grants %d (crashed clients' included), failed acquires %d, backends terminated %d, peak held on the database clock %d",
		h.Count(chaos.Acquire, chaos.Ok), h.Count(chaos.Acquire, chaos.Fail), killed, peak)
	require.Positive(t, killed)
	require.Empty(t, chaos.CheckPermitCap(h, 2))
	require.Empty(t, chaos.CheckTokensUnique(h))
	require.Empty(t, chaos.CheckTokensIncreasing(h), "per permit, tokens only grow")
	require.LessOrEqual(t, peak, 2)
	require.GreaterOrEqual(t, h.Count(chaos.Acquire, chaos.Ok), 300)
}

// TestPermitsCapOffByOneIsDetected: the negative control. The workers ask
// for 3 permits; checked against a cap of 2, both the history check and
// the database sampler catch it.
func TestPermitsCapOffByOneIsDetected(t *testing.T) {
	t.Parallel()
	ctx := ctxFor(t, 2*time.Minute)
	db := pgtest.NewDB(t)
	h, peak := permitRun(t, ctx, db, 3, 150, nil)
	v := chaos.CheckPermitCap(h, 2)
	t.Logf("violations %d, first: %s; peak held on the database clock %d", len(v), firstOr(v, "none"), peak)
	require.NotEmpty(t, v, "negative control not detected")
	require.Greater(t, peak, 2)
	require.Empty(t, chaos.CheckPermitCap(h, 3))
}

// TestPermitsServerRestart: the semaphore workload while the server is
// crashed (SIGKILL) once and shut down cleanly once, each time for longer
// than the permits' TTL, and started again. Holders lose their permits
// while it is down; after the restart the cap holds and tokens stay unique
// and growing per permit (they survive the crash).
func TestPermitsServerRestart(t *testing.T) {
	t.Parallel()
	ctx := ctxFor(t, 3*time.Minute)
	c, s := pgtest.NewCluster(t, nil)
	db := s.NewDB(t)
	grants, _ := soak(300, 0)
	restarts := 0
	h, peak := permitRun(t, ctx, db, 2, grants, func(_ *chaos.Recorder, i int) {
		if i != 5 && i != 30 {
			return
		}
		var err error
		if i == 5 {
			err = c.Crash(syscall.SIGKILL)
		} else {
			err = c.Stop()
		}
		if err != nil {
			t.Error(err)
			return
		}
		time.Sleep(time.Second) // longer than the 600ms TTL
		if err := c.Start(ctx); err != nil {
			t.Error(err)
			return
		}
		restarts++
	})
	t.Logf("restarts %d, grants %d, failed acquires %d, peak held on the database clock %d",
		restarts, h.Count(chaos.Acquire, chaos.Ok), h.Count(chaos.Acquire, chaos.Fail), peak)
	require.Equal(t, 2, restarts)
	require.Empty(t, chaos.CheckPermitCap(h, 2))
	require.Empty(t, chaos.CheckTokensUnique(h))
	require.Empty(t, chaos.CheckTokensIncreasing(h), "per permit, tokens only grow, across the crash")
	require.LessOrEqual(t, peak, 2)
}
