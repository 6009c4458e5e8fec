//go:build chaos

package chaos_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/test/chaos"
)

// newProxy starts a proxy in front of db's server and returns it with a URL
// for db through it.
func newProxy(t *testing.T, db *pgtest.DB) (*pgtest.Proxy, string) {
	t.Helper()
	cfg, err := pgx.ParseConfig(db.TCPURL)
	require.NoError(t, err)
	p, err := pgtest.NewProxy(fmt.Sprintf("%s:%d", cfg.Host, cfg.Port))
	require.NoError(t, err)
	p.Password = cfg.Password
	t.Cleanup(func() { require.NoError(t, p.Close()) })
	return p, p.URL(db.Name) + "&connect_timeout=2"
}

func connect(t *testing.T, ctx context.Context, url string) *pgx.Conn {
	t.Helper()
	c, err := pgx.Connect(ctx, url)
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close(context.Background()) })
	return c
}

func TestProxyFaults(t *testing.T) {
	t.Parallel()
	ctx := ctxFor(t, 2*time.Minute)
	db := pgtest.NewDB(t)
	p, url := newProxy(t, db)

	// Cut: the open connection breaks, a new one works.
	c := connect(t, ctx, url)
	_, err := c.Exec(ctx, "SELECT 1")
	require.NoError(t, err)
	p.Cut()
	_, err = c.Exec(ctx, "SELECT 1")
	require.Error(t, err)
	c = connect(t, ctx, url)
	_, err = c.Exec(ctx, "SELECT 1")
	require.NoError(t, err)

	// Blackhole: the connection stays open but nothing comes back; the
	// outcome of a statement sent into it is unknown.
	p.Blackhole(true)
	qctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	_, err = c.Exec(qctx, "SELECT 1")
	cancel()
	require.Error(t, err)
	require.Equal(t, chaos.Unknown, chaos.Classify(err))
	cctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	_, err = pgx.Connect(cctx, url)
	cancel()
	require.Error(t, err, "a new connection through a blackhole must not complete")
	p.Blackhole(false)
	c = connect(t, ctx, url)
	_, err = c.Exec(ctx, "SELECT 1")
	require.NoError(t, err)

	// Latency: a statement with a deadline shorter than the latency fails,
	// and succeeds once the latency is gone.
	p.SetLatency(3 * time.Second)
	qctx, cancel = context.WithTimeout(ctx, 100*time.Millisecond)
	_, err = c.Exec(qctx, "SELECT 1")
	cancel()
	require.True(t, errors.Is(err, context.DeadlineExceeded) || chaos.Classify(err) == chaos.Unknown, "%v", err)
	p.SetLatency(0)
	c = connect(t, ctx, url)
	_, err = c.Exec(ctx, "SELECT 1")
	require.NoError(t, err)
}

// nemesis runs fault every interval until ctx ends, and returns a function
// waiting for it to stop.
func nemesis(ctx context.Context, interval time.Duration, fault func(i int)) (wait func() int) {
	var wg sync.WaitGroup
	n := 0
	wg.Add(1)
	go func() {
		defer wg.Done()
		tk := time.NewTicker(interval)
		defer tk.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tk.C:
				fault(n)
				n++
			}
		}
	}()
	return func() int { wg.Wait(); return n }
}

// The guarded workload with its register behind the proxy, while the
// proxy alternately cuts every connection and blackholes for a while.
func TestNetworkFaultsGuardedWorkload(t *testing.T) {
	t.Parallel()
	ctx := ctxFor(t, 3*time.Minute)
	db := pgtest.NewDB(t)
	p, url := newProxy(t, db)
	cfg, err := pgxpool.ParseConfig(url)
	require.NoError(t, err)
	cfg.MaxConns = 6
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)

	reg, err := chaos.NewSQLRegister(ctx, db.Pool, "chaos_register", true)
	require.NoError(t, err)
	viaProxy := reg.On(pool)
	lk, err := chaos.NewSimLocker(db.Pool, 3*time.Millisecond)
	require.NoError(t, err)

	ops, dur := soak(150, 0)
	wctx, stop := context.WithCancel(ctx)
	wait := nemesis(wctx, 80*time.Millisecond, func(i int) {
		if i%2 == 0 {
			p.Cut()
		} else {
			p.BlackholeFor(60 * time.Millisecond)
		}
	})
	h, err := chaos.Run(ctx, chaos.WorkloadConfig{
		Locker: lk, Register: viaProxy, Workers: 4, Ops: ops, Duration: dur,
		MaxSleep: 6 * time.Millisecond, OpTimeout: 500 * time.Millisecond, Seed: 11,
	})
	stop()
	faults := wait()
	require.NoError(t, err)
	p.Blackhole(false)
	final := finalState(t, ctx, reg)
	t.Logf("faults injected: %d; unknown writes: %d; fenced: %d",
		faults, h.Count(chaos.Write, chaos.Unknown), countFenced(h))
	require.Positive(t, faults, "no fault was injected during the workload")
	verdict(t, h, &chaos.CheckOpts{Name: "proxy-cut-blackhole-guarded", Final: &final.Value, Claim: true}, false)
}

func countFenced(h chaos.History) int {
	n := 0
	for _, op := range h {
		if op.Fenced {
			n++
		}
	}
	return n
}
