package leasetable_test

import (
	"context"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence"
	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/leasetable"
)

// cutProxy forwards TCP connections to a server. It can be cut: then it
// drops every open connection and accepts new ones without ever answering,
// like a network partition seen from the client; made to refuse: it drops
// every connection at once, like a server that is down; or made to stall
// the open connections silently while forwarding new ones (stallOpen).
type cutProxy struct {
	l      net.Listener // closed by close
	target string
	wg     sync.WaitGroup

	mu     sync.Mutex
	cut    bool
	refuse bool
	conns  map[net.Conn]struct{}
	links  map[*proxyLink]struct{}
}

// proxyLink is one forwarded connection: the client's and the server's
// side, piped both ways.
type proxyLink struct {
	stalled atomic.Bool
}

func newCutProxy(t *testing.T, target string) *cutProxy {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	p := &cutProxy{l: l, target: target, conns: map[net.Conn]struct{}{}, links: map[*proxyLink]struct{}{}}
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
		lk := &proxyLink{}
		p.mu.Lock()
		p.links[lk] = struct{}{}
		p.mu.Unlock()
		p.wg.Add(2)
		go p.pipe(c, up, lk)
		go p.pipe(up, c, lk)
	}
}

// pipe copies src to dst until src fails, then closes dst. Once lk is
// stalled it reads and drops everything, and closes nothing.
func (p *cutProxy) pipe(dst, src net.Conn, lk *proxyLink) {
	defer p.wg.Done()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 && !lk.stalled.Load() {
			if _, werr := dst.Write(buf[:n]); werr != nil && err == nil {
				err = werr
			}
		}
		if err != nil {
			if !lk.stalled.Load() {
				_ = dst.Close()
			}
			return
		}
	}
}

// stallOpen silently stalls every open connection: from now on nothing
// passes either way and nothing is closed, so neither side learns of it.
// The proxy keeps reading, so TCP acknowledges everything and keepalive
// probes are answered: like a proxy or middlebox that stopped forwarding,
// only a round trip through it notices. New connections are forwarded as
// usual.
func (p *cutProxy) stallOpen() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for lk := range p.links {
		lk.stalled.Store(true)
	}
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

// newDBProxy starts a cutProxy in front of db's server, reached over TCP,
// and returns it with a connection configuration for db through it. The
// configuration has no fallbacks: with sslmode=prefer pgx would fall back
// to a direct connection, bypassing the proxy.
func newDBProxy(t *testing.T, db *pgtest.DB) (*cutProxy, *pgx.ConnConfig) {
	t.Helper()
	cfg, err := pgx.ParseConfig(db.TCPURL)
	require.NoError(t, err)
	proxy := newCutProxy(t, net.JoinHostPort(cfg.Host, strconv.Itoa(int(cfg.Port))))
	cfg.Host, cfg.Port, cfg.Fallbacks = "127.0.0.1", proxy.port(), nil
	return proxy, cfg
}

func TestLossWhenDatabaseIsUnreachable(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.NewDB(t)
	proxy, proxied := newDBProxy(t, db)
	pool := db.NewPool(t, func(c *pgxpool.Config) {
		c.ConnConfig = proxied
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
		"SELECT expires_at > clock_timestamp() FROM pgfence.pgfence_leases WHERE name = 'partitioned'").Scan(&stillHeld))
	require.True(t, stillHeld, "the local deadline must come before the database's expiry")
	waitFor(t, failing, "the failed renewal to be reported")
}

func TestRenewalRetriesUntilTheDatabaseIsBack(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.NewDB(t)
	proxy, proxied := newDBProxy(t, db)
	pool := db.NewPool(t, func(c *pgxpool.Config) { c.ConnConfig = proxied })
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

// listenStall is a hand-over whose waiter's LISTEN connection goes through
// a cutProxy that stalls it silently, while every statement goes to the
// server directly.
type listenStall struct {
	proxy          *cutProxy
	logs           *logWatch
	holder, waiter *leasetable.Locker
}

func setupListenStall(t *testing.T, checkInterval time.Duration) *listenStall {
	t.Helper()
	db := pgtest.NewDB(t)
	proxy, listenCfg := newDBProxy(t, db)
	logs := newLogWatch()
	return &listenStall{
		proxy: proxy,
		logs:  logs,
		// The holder's lease outlives the test: only a wake-up from the
		// LISTEN connection can hand it over in time.
		holder: newLocker(t, db.Pool, &leasetable.Config{TTL: time.Minute}),
		waiter: newLocker(t, db.NewPool(t, nil), &leasetable.Config{
			Logger: logs.logger(), ListenConnConfig: listenCfg, ListenCheckInterval: checkInterval,
		}),
	}
}

// handOver has the waiter wait for a lease the holder holds, stalls the
// waiter's LISTEN connection, has the holder release the lease, and returns
// the waiter's result. The waiter gives up after 5s, far below the holder's
// TTL of a minute.
func (s *listenStall) handOver(t *testing.T) (pgfence.Lease, error) {
	t.Helper()
	ctx := context.Background()
	probe, err := s.holder.TryAcquire(ctx, "probe", nil)
	require.NoError(t, err)
	contended, err := s.holder.TryAcquire(ctx, "contended", nil)
	require.NoError(t, err)

	// A first hand-over starts the listener through the proxy and proves it
	// works. Once the waiter has the probe lease, the listener has woken the
	// waiters present when it connected, so no retry is pending later.
	listening := s.logs.next("LISTEN connection ready")
	waiting := s.logs.next("waiting for lease")
	got := acquireAsync(s.waiter, "probe", 30*time.Second)
	waitFor(t, listening, "the listener")
	waitFor(t, waiting, "the probe's waiter to wait")
	require.NoError(t, probe.Release(ctx))
	r := <-got
	require.NoError(t, r.err, "the probe lease is handed over through the proxy")
	require.NoError(t, r.l.Release(ctx))

	// The connection unsubscribes a second after the wait; the next wait
	// subscribes it again, through the proxy, and then tries again.
	require.Eventually(t, func() bool { return !s.waiter.Stats().Listening }, 30*time.Second, 5*time.Millisecond)
	before := s.logs.count("waiting for lease")
	got = acquireAsync(s.waiter, "contended", 5*time.Second)
	waitListening(t, s.waiter, s.logs, before)
	s.proxy.stallOpen()
	require.NoError(t, contended.Release(ctx))
	r = <-got
	return r.l, r.err
}

func TestListenHealthCheckReplacesAStalledConnection(t *testing.T) {
	t.Parallel()
	s := setupListenStall(t, 200*time.Millisecond)
	s.logs.count("LISTEN connection failed")
	l, err := s.handOver(t)
	require.NoError(t, err, "the health check replaced the stalled connection before the wait timeout")
	require.NoError(t, l.Release(context.Background()))
	require.GreaterOrEqual(t, s.logs.count("LISTEN connection failed"), 1)
	require.Contains(t, s.logs.warnings(), "health check of the LISTEN connection")
}

// Negative control: without the health check the stalled connection
// lingers, the release is missed, and the waiter times out.
func TestListenStallWithoutHealthCheckMissesTheRelease(t *testing.T) {
	t.Parallel()
	s := setupListenStall(t, -1)
	s.logs.count("LISTEN connection failed")
	_, err := s.handOver(t)
	require.ErrorIs(t, err, pgfence.ErrNotAcquired)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.Zero(t, s.logs.count("LISTEN connection failed"), "nothing noticed the stall")
}

// trackingDialer dials TCP and wraps each connection to see, later, whether
// it was closed and whether anything is still reading it.
type trackingDialer struct {
	mu    sync.Mutex
	conns []*trackedConn
	armed atomic.Bool   // once set, every Write signals wrote
	wrote chan struct{} // buffered(1)
}

type trackedConn struct {
	net.Conn
	d       *trackingDialer
	closed  atomic.Bool
	reading atomic.Int32
}

func (d *trackingDialer) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	tc := &trackedConn{Conn: c, d: d}
	d.mu.Lock()
	d.conns = append(d.conns, tc)
	d.mu.Unlock()
	return tc, nil
}

func (c *trackedConn) Read(p []byte) (int, error) {
	c.reading.Add(1)
	defer c.reading.Add(-1)
	return c.Conn.Read(p)
}

func (c *trackedConn) Write(p []byte) (int, error) {
	if c.d.armed.Load() {
		select {
		case c.d.wrote <- struct{}{}:
		default:
		}
	}
	return c.Conn.Write(p)
}

func (c *trackedConn) Close() error {
	c.closed.Store(true)
	return c.Conn.Close()
}

// Closing the Locker while a health check waits on a stalled LISTEN
// connection returns promptly, and leaves nothing behind: pgconn closes a
// connection whose statement was interrupted in a goroutine of its own,
// which, on a connection that no longer answers, keeps reading it for up to
// 15 seconds unless Close waits for it and cuts the connection.
func TestCloseDuringListenHealthCheck(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.NewDB(t)
	proxy, listenCfg := newDBProxy(t, db)
	dialer := &trackingDialer{wrote: make(chan struct{}, 1)}
	listenCfg.DialFunc = dialer.dial
	logs := newLogWatch()
	// The check starts after 2s of silence and may take 2s: Close comes
	// while it waits.
	waiter := newLocker(t, db.NewPool(t, nil), &leasetable.Config{
		Logger: logs.logger(), ListenConnConfig: listenCfg, ListenCheckInterval: 2 * time.Second,
	})
	holder := newLocker(t, db.Pool, &leasetable.Config{TTL: time.Minute})
	_, err := holder.TryAcquire(ctx, "held", nil)
	require.NoError(t, err)

	listening := logs.next("LISTEN connection ready")
	waiting := logs.next("waiting for lease")
	got := acquireAsync(waiter, "held", 0)
	waitFor(t, listening, "the listener")
	waitFor(t, waiting, "the waiter to wait")
	proxy.stallOpen()
	dialer.armed.Store(true)
	waitFor(t, dialer.wrote, "the health check to be sent")

	closed := make(chan struct{})
	go func() {
		waiter.Close()
		close(closed)
	}()
	waitFor(t, closed, "Close")
	r := <-got
	require.ErrorIs(t, r.err, pgfence.ErrClosed)

	dialer.mu.Lock()
	defer dialer.mu.Unlock()
	require.NotEmpty(t, dialer.conns)
	for i, c := range dialer.conns {
		require.True(t, c.closed.Load(), "connection %d is closed when Close returns", i)
		require.Zero(t, c.reading.Load(), "nothing reads connection %d after Close returned", i)
	}
}
