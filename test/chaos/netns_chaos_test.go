//go:build chaos

package chaos_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/test/chaos"
)

// newNetns creates a namespace whose clients reach db's server through a
// proxy on the host end of the veth pair. It fails (never skips) when
// namespaces are not permitted: CI must run these tests as root.
func newNetns(t *testing.T, ctx context.Context, db *pgtest.DB) (*chaos.Netns, *pgtest.Proxy, func(string) *pgx.ConnConfig) {
	t.Helper()
	ns, err := chaos.NewNetns(ctx)
	require.NoError(t, err, "the nftables fault tests need network namespaces: root with CAP_NET_ADMIN, iproute2 and nftables")
	t.Cleanup(func() { require.NoError(t, ns.Close()) })
	cfg, err := pgx.ParseConfig(db.TCPURL)
	require.NoError(t, err)
	p, err := pgtest.NewProxyOn(ns.HostIP+":0", fmt.Sprintf("%s:%d", cfg.Host, cfg.Port))
	require.NoError(t, err)
	p.Password = cfg.Password
	t.Cleanup(func() { require.NoError(t, p.Close()) })
	connCfg := func(extra string) *pgx.ConnConfig {
		c, err := pgx.ParseConfig(p.URL(db.Name) + "&connect_timeout=2" + extra)
		require.NoError(t, err)
		c.DialFunc = ns.DialContext
		return c
	}
	return ns, p, connCfg
}

func TestNetnsFaults(t *testing.T) {
	t.Parallel()
	ctx := ctxFor(t, 2*time.Minute)
	db := pgtest.NewDB(t)
	ns, p, connCfg := newNetns(t, ctx, db)
	connectNs := func() *pgx.Conn {
		c, err := pgx.ConnectConfig(ctx, connCfg(""))
		require.NoError(t, err)
		t.Cleanup(func() { _ = c.Close(context.Background()) })
		return c
	}
	c := connectNs()
	var addr string
	require.NoError(t, c.QueryRow(ctx, "SELECT inet_client_addr()::text").Scan(&addr))
	// The proxy connects from the host; the client side is in the namespace.
	require.Equal(t, 1, p.Conns())

	// Blackhole: nothing gets through, the outcome is unknown.
	require.NoError(t, ns.Blackhole(ctx, p.Port()))
	qctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	_, err := c.Exec(qctx, "SELECT 1")
	cancel()
	require.Error(t, err)
	require.Equal(t, chaos.Unknown, chaos.Classify(err))
	cctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	_, err = pgx.ConnectConfig(cctx, connCfg(""))
	cancel()
	require.Error(t, err)
	require.NoError(t, ns.Heal(ctx))
	c = connectNs()
	_, err = c.Exec(ctx, "SELECT 1")
	require.NoError(t, err)

	// Reject: the open connection is reset at its next send.
	require.NoError(t, ns.Reject(ctx, p.Port()))
	qctx, cancel = context.WithTimeout(ctx, 30*time.Second)
	_, err = c.Exec(qctx, "SELECT 1")
	cancel()
	require.Error(t, err)
	require.NoError(t, ns.Heal(ctx))
	c = connectNs()
	_, err = c.Exec(ctx, "SELECT 1")
	require.NoError(t, err)
}

// The guarded workload with its register reached from inside a namespace
// while nftables rules alternately reset and blackhole its traffic.
func TestNetnsFaultsGuardedWorkload(t *testing.T) {
	t.Parallel()
	ctx := ctxFor(t, 3*time.Minute)
	db := pgtest.NewDB(t)
	ns, p, connCfg := newNetns(t, ctx, db)
	pcfg, err := pgxpool.ParseConfig("")
	require.NoError(t, err)
	pcfg.ConnConfig = connCfg("")
	pcfg.MaxConns = 6
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	// Created through the host's pool: only the workload takes the
	// faulty path.
	admin, err := chaos.NewSQLRegister(ctx, db.Pool, "chaos_register", true)
	require.NoError(t, err)
	reg := admin.On(pool)
	lk, err := chaos.NewSimLocker(db.Pool, 3*time.Millisecond)
	require.NoError(t, err)

	ops, dur := soak(200, 0)
	wctx, stop := context.WithCancel(ctx)
	wait := nemesis(wctx, 300*time.Millisecond, func(i int) {
		if i%2 == 0 {
			_ = ns.Reject(ctx, p.Port())
		} else {
			_ = ns.Blackhole(ctx, p.Port())
		}
		time.Sleep(100 * time.Millisecond) // the fault's duration
		_ = ns.Heal(ctx)
	})
	h, err := chaos.Run(ctx, chaos.WorkloadConfig{
		Locker: lk, Register: reg, Workers: 4, Ops: ops, Duration: dur,
		MaxSleep: 6 * time.Millisecond, OpTimeout: 2 * time.Second, Seed: 13,
	})
	stop()
	faults := wait()
	require.NoError(t, err)
	require.NoError(t, ns.Heal(ctx))
	final := finalState(t, ctx, admin)
	t.Logf("nftables faults: %d; ok reads %d; failed/unknown register ops: %d/%d", faults, h.Count(chaos.Read, chaos.Ok),
		h.Count(chaos.Read, chaos.Fail)+h.Count(chaos.Write, chaos.Fail),
		h.Count(chaos.Read, chaos.Unknown)+h.Count(chaos.Write, chaos.Unknown))
	require.Positive(t, faults, "no fault was injected during the workload")
	verdict(t, h, &chaos.CheckOpts{Name: "netns-nftables-guarded", Final: &final.Value, Claim: true}, false)
}
