//go:build chaos

package chaos_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence/advisory"
	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/test/chaos"
)

// runReal runs the workload with per-worker lockers and a register.
func runReal(t *testing.T, ctx context.Context, lockers []chaos.Locker, reg chaos.Register, ops int, dur, maxSleep, opTimeout time.Duration, seed uint64) chaos.History {
	t.Helper()
	ops, dur = soak(ops, dur)
	h, err := chaos.Run(ctx, chaos.WorkloadConfig{
		Lockers: lockers, Register: reg, Workers: len(lockers), Ops: ops, Duration: dur,
		MaxSleep: maxSleep, OpTimeout: opTimeout, Seed: seed,
	})
	require.NoError(t, err)
	return h
}

// runUnderFault runs the workload (as runReal, bounded by dur) while fault
// is injected every interval, stops the nemesis, and requires that at least
// one fault was injected: a scenario whose fault never fired proves nothing.
func runUnderFault(t *testing.T, ctx context.Context, lockers []chaos.Locker, reg chaos.Register, interval time.Duration, fault func(i int), dur, maxSleep, opTimeout time.Duration, seed uint64) (chaos.History, int) {
	t.Helper()
	wctx, stop := context.WithCancel(ctx)
	wait := nemesis(wctx, interval, fault)
	h := func() chaos.History {
		// Stop the nemesis even when the workload fails the test.
		defer stop()
		return runReal(t, ctx, lockers, reg, 0, dur, maxSleep, opTimeout, seed)
	}()
	faults := wait()
	require.Positive(t, faults, "no fault was injected during the workload")
	return h, faults
}

func exclusive(kind lockerKind) bool { return kind == kindAdvisory || kind == kindAdvisoryTx }

// Every real locker, no fault: linearizable, and advisory locks are
// mutually exclusive.
func TestRealLockersNoFault(t *testing.T) {
	t.Parallel()
	for _, kind := range allKinds {
		t.Run(string(kind), func(t *testing.T) {
			t.Parallel()
			ctx := ctxFor(t, 2*time.Minute)
			db := pgtest.NewDB(t)
			pool := appPool(t, ctx, db.URL, "chaos-locker", 8, nil)
			reg, fin := realRegister(t, ctx, kind, pool, db.Pool)
			h := runReal(t, ctx, realLockers(t, kind, pool, realOpts{TTL: time.Second}), reg, 80, 0, 5*time.Millisecond, 0, 21)
			checkReal(t, "no-fault", kind, h, finalState(t, ctx, fin), exclusive(kind))
		})
	}
}

// pg_terminate_backend of the holders' backends every 150ms: the lockers'
// pool (leasetable's statements and LISTEN), the advisory lock sessions,
// and the register's pool. Advisory holders must be told their lock was
// lost; leasetable renewals fail and are retried; the register stays
// linearizable.
func TestRealLockersConnectionKill(t *testing.T) {
	t.Parallel()
	for _, kind := range allKinds {
		t.Run(string(kind), func(t *testing.T) {
			t.Parallel()
			ctx := ctxFor(t, 2*time.Minute)
			db := pgtest.NewDB(t)
			pool := appPool(t, ctx, db.URL, "chaos-locker", 8, nil)
			reg, fin := realRegister(t, ctx, kind, pool, db.Pool)
			lockers := realLockers(t, kind, pool, realOpts{})
			killed := 0
			h, _ := runUnderFault(t, ctx, lockers, reg, 150*time.Millisecond, func(int) {
				for _, app := range []string{"chaos-locker", advisory.DefaultApplicationName} {
					if n, err := chaos.TerminateBackends(ctx, db.Pool, db.Name, app); err == nil {
						killed += n
					}
				}
			}, 3*time.Second, 60*time.Millisecond, 2*time.Second, 5)
			t.Logf("backends terminated: %d", killed)
			require.Positive(t, killed)
			if kind == kindAdvisory {
				require.Positive(t, countLost(h), "advisory holders whose session was killed must be told")
			}
			checkReal(t, "connection-kill", kind, h, finalState(t, ctx, fin), false)
		})
	}
}

// The server is crashed (SIGKILL, SIGQUIT) and restarted every second
// under each real locker. No token returned before a crash is handed out
// again (CheckTokensUnique over the whole history, across the crashes),
// and the register stays linearizable.
func TestRealLockersServerCrash(t *testing.T) {
	t.Parallel()
	c, s := pgtest.NewCluster(t, nil)
	for _, kind := range allKinds {
		t.Run(string(kind), func(t *testing.T) {
			ctx := ctxFor(t, 2*time.Minute)
			db := s.NewDB(t)
			pool := appPool(t, ctx, db.URL, "chaos-locker", 8, nil)
			admin := appPool(t, ctx, db.URL, "chaos-admin", 2, nil)
			reg, fin := realRegister(t, ctx, kind, pool, admin)
			lockers := realLockers(t, kind, pool, realOpts{TTL: 500 * time.Millisecond})
			h, crashes := runUnderFault(t, ctx, lockers, reg, time.Second, func(i int) { crash(t, ctx, c, i) },
				3500*time.Millisecond, 10*time.Millisecond, 2*time.Second, 3)
			t.Logf("crashes: %d; tokens granted: %d", crashes, h.Count(chaos.Acquire, chaos.Ok))
			checkReal(t, "server-crash", kind, h, finalState(t, ctx, fin), false)
		})
	}
}

// The lockers' pool and the register's reach the server through the
// in-process proxy, which alternately cuts every connection and blackholes
// for 150ms.
func TestRealLockersProxyFaults(t *testing.T) {
	t.Parallel()
	for _, kind := range allKinds {
		t.Run(string(kind), func(t *testing.T) {
			t.Parallel()
			ctx := ctxFor(t, 2*time.Minute)
			db := pgtest.NewDB(t)
			p, url := newProxy(t, db)
			pool := appPool(t, ctx, url, "chaos-locker", 8, nil)
			reg, fin := realRegister(t, ctx, kind, pool, db.Pool)
			lockers := realLockers(t, kind, pool, realOpts{})
			h, faults := runUnderFault(t, ctx, lockers, reg, 250*time.Millisecond, func(i int) {
				if i%2 == 0 {
					p.Cut()
				} else {
					p.BlackholeFor(150 * time.Millisecond)
				}
			}, 3*time.Second, 20*time.Millisecond, time.Second, 11)
			p.Blackhole(false)
			t.Logf("proxy faults: %d", faults)
			checkReal(t, "proxy-cut-blackhole", kind, h, finalState(t, ctx, fin), false)
		})
	}
}

// The lockers and the register dial from inside a network namespace whose
// nftables rules alternately reset and blackhole their traffic.
func TestRealLockersNetns(t *testing.T) {
	t.Parallel()
	for _, kind := range allKinds {
		t.Run(string(kind), func(t *testing.T) {
			t.Parallel()
			ctx := ctxFor(t, 2*time.Minute)
			db := pgtest.NewDB(t)
			ns, p, connCfg := newNetns(t, ctx, db)
			pool := appPool(t, ctx, db.URL, "", 8, func(c *pgxpool.Config) { c.ConnConfig = connCfg("") })
			reg, fin := realRegister(t, ctx, kind, pool, db.Pool)
			lockers := realLockers(t, kind, pool, realOpts{})
			h, faults := runUnderFault(t, ctx, lockers, reg, 400*time.Millisecond, func(i int) {
				if i%2 == 0 {
					_ = ns.Reject(ctx, p.Port())
				} else {
					_ = ns.Blackhole(ctx, p.Port())
				}
				time.Sleep(150 * time.Millisecond) // the fault's duration
				_ = ns.Heal(ctx)
			}, 3*time.Second, 20*time.Millisecond, time.Second, 13)
			require.NoError(t, ns.Heal(ctx))
			t.Logf("nftables faults: %d", faults)
			checkReal(t, "netns-nftables", kind, h, finalState(t, ctx, fin), false)
		})
	}
}

// The server's wall clock jumps (libfaketime) under a live leasetable
// workload: forward jumps expire leases early (their holders are still
// working: fencing must stop them), backward jumps extend them. The
// register stays linearizable.
func TestRealLeaseServerClockJumps(t *testing.T) {
	t.Parallel()
	clock, err := chaos.NewFakeClock()
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, clock.Close()) })
	c, s := pgtest.NewCluster(t, &pgtest.ClusterOptions{Env: clock.Env()})
	for _, kind := range []lockerKind{kindLease, kindLeaseChecked} {
		t.Run(string(kind), func(t *testing.T) {
			ctx := ctxFor(t, 2*time.Minute)
			db := s.NewDB(t)
			pool := appPool(t, ctx, c.URL(db.Name), "chaos-locker", 8, nil)
			admin := appPool(t, ctx, c.URL(db.Name), "chaos-admin", 2, nil)
			reg, fin := realRegister(t, ctx, kind, pool, admin)
			lockers := realLockers(t, kind, pool, realOpts{})
			offsets := []time.Duration{2 * time.Second, 0, time.Second, -time.Second, 3 * time.Second, 0}
			h, jumps := runUnderFault(t, ctx, lockers, reg, 300*time.Millisecond, func(i int) {
				_ = clock.Set(offsets[i%len(offsets)])
			}, 4*time.Second, 40*time.Millisecond, 2*time.Second, 17)
			require.NoError(t, clock.Set(0))
			t.Logf("server clock jumps: %d (offsets cycling through %v)", jumps, offsets)
			checkReal(t, "server-clock-jumps", kind, h, finalState(t, ctx, fin), false)
		})
	}
}

// spikeRegister delays the proxy (latency) whenever a holder of the slow
// half starts its read-modify-write while no spike is on: the fault hits a
// holder inside its critical section, every time.
type spikeRegister struct {
	chaos.Register
	p      *pgtest.Proxy
	on     atomic.Bool
	spikes atomic.Int64
	wg     sync.WaitGroup
}

func (r *spikeRegister) Read(ctx context.Context, token int64) (int64, int64, error) {
	if r.on.CompareAndSwap(false, true) {
		r.spikes.Add(1)
		r.p.SetLatency(700 * time.Millisecond)
		r.wg.Add(1)
		time.AfterFunc(1500*time.Millisecond, func() {
			defer r.wg.Done()
			r.p.SetLatency(0)
			r.on.Store(false)
		})
	}
	return r.Register.Read(ctx, token)
}

// Half of the workers (their locker and register connections) reach the
// server through the proxy, the other half directly. Each time a proxied
// holder starts its read-modify-write, the proxy delays every chunk by
// 700ms for 1.5s: the delayed holder's lease lapses (its renewals arrive
// too late; an advisory session's liveness check times out and the session
// is closed), a direct worker takes over and writes, and the delayed
// holder's claim or write arrives after that: the fence must reject it.
// With unguarded writes (the negative control) the late write lands and
// the checker must flag the history.
func TestRealLockersProxyLatencySplit(t *testing.T) {
	t.Parallel()
	for _, kind := range []lockerKind{kindLease, kindLeaseChecked, kindAdvisory, kindLeaseUnguarded} {
		t.Run(string(kind), func(t *testing.T) {
			t.Parallel()
			ctx := ctxFor(t, 2*time.Minute)
			db := pgtest.NewDB(t)
			p, url := newProxy(t, db)
			slow := appPool(t, ctx, url, "chaos-slow", 4, nil)
			fast := appPool(t, ctx, db.URL, "chaos-fast", 4, nil)
			slowInner, fin := realRegister(t, ctx, kind, slow, db.Pool)
			slowReg := &spikeRegister{Register: slowInner, p: p}
			t.Cleanup(slowReg.wg.Wait)
			fastReg, _ := realRegister(t, ctx, kind, fast, db.Pool)
			o := realOpts{Workers: 2, TTL: 300 * time.Millisecond}
			lockers := append(realLockers(t, kind, slow, o), realLockers(t, kind, fast, o)...)
			rec := chaos.NewRecorder()
			d := 5 * time.Second
			if kind == kindLeaseUnguarded {
				// The negative control needs a spike in which a direct
				// worker takes over and writes before the late write
				// lands; 5s holds about three spikes, and in one CI run
				// none of them did. Three times as many make a miss rare.
				d = 15 * time.Second
			}
			ops, dur := soak(0, d)
			var errs [2]error
			var wg sync.WaitGroup
			for i, reg := range []chaos.Register{slowReg, fastReg} {
				wg.Add(1)
				go func(i int, reg chaos.Register) {
					defer wg.Done()
					// Process ids 0-1 slow, 2-3 direct: one recorder.
					_, errs[i] = chaos.Run(ctx, chaos.WorkloadConfig{
						Lockers: lockers[2*i : 2*i+2], Register: reg, Recorder: rec, Workers: 2,
						Ops: ops, Duration: dur, MaxSleep: 20 * time.Millisecond, OpTimeout: 10 * time.Second,
						Seed: uint64(31 + i), ProcessBase: 2 * i,
					})
				}(i, reg)
			}
			wg.Wait()
			require.NoError(t, errs[0])
			require.NoError(t, errs[1])
			h := rec.History()
			t.Logf("latency spikes: %d", slowReg.spikes.Load())
			require.Positive(t, slowReg.spikes.Load(), "no latency spike was injected")
			if kind == kindLeaseUnguarded {
				final := finalState(t, ctx, fin)
				verdict(t, h, &chaos.CheckOpts{Name: "negative-control-proxy-latency-split-" + string(kind), Final: &final.Value}, true)
				return
			}
			checkReal(t, "proxy-latency-split", kind, h, finalState(t, ctx, fin), false)
		})
	}
}
