package leasetable_test

import (
	"context"
	"io"
	"net"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence"
	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/leasetable"
)

// cutProxy forwards TCP connections to a server. It can be cut: then it
// drops every open connection and accepts new ones without ever answering,
// like a network partition seen from the client; or made to refuse: it drops
// every connection at once, like a server that is down.
type cutProxy struct {
	l      net.Listener // closed by close
	target string
	wg     sync.WaitGroup

	mu     sync.Mutex
	cut    bool
	refuse bool
	conns  map[net.Conn]struct{}
}

func newCutProxy(t *testing.T, target string) *cutProxy {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	p := &cutProxy{l: l, target: target, conns: map[net.Conn]struct{}{}}
	p.wg.Add(1)
	go p.serve()
	t.Cleanup(p.close)
	return p
}

// close stops the proxy and closes every connection. It is idempotent.
func (p *cutProxy) close() {
	_ = p.l.Close()
	p.cutOff()
	p.wg.Wait()
}

func (p *cutProxy) port() uint16 { return uint16(p.l.Addr().(*net.TCPAddr).Port) }

// track records c, to be closed when the proxy is cut or closed.
func (p *cutProxy) track(c net.Conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.conns[c] = struct{}{}
}

func (p *cutProxy) serve() {
	defer p.wg.Done()
	for {
		c, err := p.l.Accept()
		if err != nil {
			return
		}
		p.track(c)
		p.mu.Lock()
		cut, refuse := p.cut, p.refuse
		p.mu.Unlock()
		if cut {
			continue // held open, never answered
		}
		if refuse {
			_ = c.Close()
			continue
		}
		up, err := net.Dial("tcp", p.target)
		if err != nil {
			_ = c.Close()
			continue
		}
		p.track(up)
		p.wg.Add(2)
		go p.pipe(c, up)
		go p.pipe(up, c)
	}
}

func (p *cutProxy) pipe(dst, src net.Conn) {
	defer p.wg.Done()
	_, _ = io.Copy(dst, src)
	_ = dst.Close()
}

// setRefuse drops all open connections and closes new ones at once while
// on; when off, the proxy forwards again.
func (p *cutProxy) setRefuse(on bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.refuse = on
	if on {
		for c := range p.conns {
			_ = c.Close()
		}
	}
}

// cutOff drops all open connections; new ones hang.
func (p *cutProxy) cutOff() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut = true
	for c := range p.conns {
		_ = c.Close()
	}
}

func TestLossWhenDatabaseIsUnreachable(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.NewDB(t)
	cfg := db.Pool.Config().ConnConfig
	proxy := newCutProxy(t, net.JoinHostPort(cfg.Host, strconv.Itoa(int(cfg.Port))))
	pool := db.NewPool(t, func(c *pgxpool.Config) {
		c.ConnConfig.Host, c.ConnConfig.Port = "127.0.0.1", proxy.port()
		// Connection attempts into the cut proxy hang; bound them so that
		// closing the pool does not wait long for them.
		c.ConnConfig.ConnectTimeout = time.Second
	})
	// Close the proxy before the pool: pgx cancels timed-out queries through
	// a new connection, and closing the pool waits for that to fail.
	t.Cleanup(proxy.close)
	logs := newLogWatch()
	k := newLocker(t, pool, &leasetable.Config{
		TTL: 2 * time.Second, RenewInterval: 300 * time.Millisecond, SafetyMargin: 800 * time.Millisecond,
		Logger: logs.logger(), DisableListen: true,
	})

	l, err := k.TryAcquire(ctx, "partitioned", nil)
	require.NoError(t, err)
	// Negative control: renewals go through the proxy while it forwards.
	waitFor(t, logs.next("lease renewed"), "a renewal")
	waitFor(t, logs.next("lease renewed"), "a second renewal")
	require.NoError(t, l.Err())

	failing := logs.next("renewal failed")
	proxy.cutOff()
	waitFor(t, l.Done(), "the lease to be given up")
	require.ErrorIs(t, l.Err(), pgfence.ErrLeaseLost)
	require.ErrorContains(t, l.Err(), "local deadline")
	// Seen directly, the database still holds the lease: the holder gave up
	// before anyone else could be granted it.
	var stillHeld bool
	require.NoError(t, db.Pool.QueryRow(ctx,
		"SELECT expires_at > clock_timestamp() FROM pgfence_leases WHERE name = 'partitioned'").Scan(&stillHeld))
	require.True(t, stillHeld, "the local deadline must come before the database's expiry")
	waitFor(t, failing, "the failed renewal to be reported")
}

func TestRenewalRetriesUntilTheDatabaseIsBack(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.NewDB(t)
	cfg := db.Pool.Config().ConnConfig
	proxy := newCutProxy(t, net.JoinHostPort(cfg.Host, strconv.Itoa(int(cfg.Port))))
	pool := db.NewPool(t, func(c *pgxpool.Config) {
		c.ConnConfig.Host, c.ConnConfig.Port = "127.0.0.1", proxy.port()
	})
	t.Cleanup(proxy.close)
	logs := newLogWatch()
	k := newLocker(t, pool, &leasetable.Config{
		TTL: 10 * time.Second, RenewInterval: 200 * time.Millisecond, Logger: logs.logger(), DisableListen: true,
	})
	l, err := k.TryAcquire(ctx, "flaky", nil)
	require.NoError(t, err)
	waitFor(t, logs.next("lease renewed"), "a renewal")

	logs.count("renewal failed")
	proxy.setRefuse(true)
	for range 3 {
		waitFor(t, logs.next("renewal failed"), "a failed renewal")
	}
	proxy.setRefuse(false)
	waitFor(t, logs.next("lease renewed"), "a renewal after the outage")
	require.NoError(t, l.Err(), "the outage was shorter than the local deadline")
	// Retries are spaced (RenewInterval/4), not a busy loop.
	require.Less(t, logs.count("renewal failed"), 100)
	info, ok, err := k.Get(ctx, "flaky")
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, l.Token(), info.Token)
	require.NoError(t, l.Release(ctx))
}
