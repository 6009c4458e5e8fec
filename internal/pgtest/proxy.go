package pgtest

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"strconv"
	"sync"
	"time"
)

// Proxy is an in-process TCP proxy between clients and a server, for
// network faults: [Proxy.Cut] closes every connection, [Proxy.Blackhole]
// silently drops every byte (connections stay open, as behind a firewall
// that drops packets), [Proxy.SetLatency] delays every chunk forwarded.
//
// A connection that saw bytes dropped is poisoned: its stream lost data, so
// it is closed when the blackhole ends, as TCP would eventually time it out.
type Proxy struct {
	// Password is the postgres role's password, for URL.
	Password string
	ln       net.Listener
	target   string

	mu        sync.Mutex
	conns     map[*proxyConn]struct{}
	blackhole bool
	latency   time.Duration
	timers    []*time.Timer
	closed    bool
	wg        sync.WaitGroup
}

type proxyConn struct {
	client, server net.Conn
	poisoned       bool
}

// NewProxy listens on a free loopback port and forwards to target
// (host:port). Close it when done.
func NewProxy(target string) (*Proxy, error) { return NewProxyOn("127.0.0.1:0", target) }

// NewProxyOn is [NewProxy] listening on listen (host:port; port 0 picks a
// free one), e.g. the host side of a network namespace's veth pair.
func NewProxyOn(listen, target string) (*Proxy, error) {
	if _, _, err := net.SplitHostPort(target); err != nil {
		return nil, fmt.Errorf("pgtest: proxy target: %w", err)
	}
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		return nil, fmt.Errorf("pgtest: proxy listen: %w", err)
	}
	p := &Proxy{ln: ln, target: target, conns: map[*proxyConn]struct{}{}}
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// Addr returns the proxy's listening address.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Port returns the proxy's listening port.
func (p *Proxy) Port() int { return p.ln.Addr().(*net.TCPAddr).Port }

// URL returns a PostgreSQL connection URL for database through the proxy,
// as the postgres role with Password (the test servers ask for it on TCP).
func (p *Proxy) URL(database string) string {
	host := p.ln.Addr().(*net.TCPAddr).IP.String()
	u := url.URL{Scheme: "postgres", User: url.UserPassword("postgres", p.Password),
		Host: net.JoinHostPort(host, strconv.Itoa(p.Port())), Path: "/" + database, RawQuery: "sslmode=disable"}
	return u.String()
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		s, err := net.DialTimeout("tcp", p.target, 5*time.Second)
		if err != nil {
			_ = c.Close()
			continue
		}
		pc := &proxyConn{client: c, server: s}
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			_ = c.Close()
			_ = s.Close()
			return
		}
		p.conns[pc] = struct{}{}
		p.wg.Add(2)
		p.mu.Unlock()
		go p.pipe(pc, c, s)
		go p.pipe(pc, s, c)
	}
}

func (p *Proxy) pipe(pc *proxyConn, from, to net.Conn) {
	defer p.wg.Done()
	defer p.drop(pc)
	buf := make([]byte, 32*1024)
	for {
		n, err := from.Read(buf)
		if n > 0 {
			p.mu.Lock()
			bh, lat := p.blackhole, p.latency
			if bh {
				pc.poisoned = true
			}
			p.mu.Unlock()
			if !bh {
				if lat > 0 {
					time.Sleep(lat)
				}
				if _, werr := to.Write(buf[:n]); werr != nil {
					return
				}
			}
		}
		if err != nil {
			return
		}
	}
}

func (p *Proxy) drop(pc *proxyConn) {
	p.mu.Lock()
	delete(p.conns, pc)
	p.mu.Unlock()
	_ = pc.client.Close()
	_ = pc.server.Close()
}

// Conns returns the number of open proxied connections.
func (p *Proxy) Conns() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.conns)
}

// Cut closes every open connection at once, both ways. New connections are
// still accepted.
func (p *Proxy) Cut() {
	p.mu.Lock()
	conns := make([]*proxyConn, 0, len(p.conns))
	for pc := range p.conns {
		conns = append(conns, pc)
	}
	p.mu.Unlock()
	for _, pc := range conns {
		_ = pc.client.Close()
		_ = pc.server.Close()
	}
}

// Blackhole starts (on) or ends (off) dropping every byte, of open and new
// connections, without closing anything. Ending it closes the connections
// that lost bytes.
func (p *Proxy) Blackhole(on bool) {
	p.mu.Lock()
	p.blackhole = on
	var poisoned []*proxyConn
	if !on {
		for pc := range p.conns {
			if pc.poisoned {
				poisoned = append(poisoned, pc)
			}
		}
	}
	p.mu.Unlock()
	for _, pc := range poisoned {
		_ = pc.client.Close()
		_ = pc.server.Close()
	}
}

// BlackholeFor starts a blackhole and ends it after d.
func (p *Proxy) BlackholeFor(d time.Duration) {
	p.Blackhole(true)
	p.after(d, func() { p.Blackhole(false) })
}

// SetLatency delays every chunk forwarded, either way, by d; zero ends it.
func (p *Proxy) SetLatency(d time.Duration) {
	p.mu.Lock()
	p.latency = d
	p.mu.Unlock()
}

func (p *Proxy) after(d time.Duration, f func()) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return
	}
	p.timers = append(p.timers, time.AfterFunc(d, f))
}

// Close stops accepting, closes every connection and waits for the proxy's
// goroutines to end.
func (p *Proxy) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	for _, t := range p.timers {
		t.Stop()
	}
	p.blackhole = false
	p.mu.Unlock()
	err := p.ln.Close()
	p.Cut()
	p.wg.Wait()
	if errors.Is(err, net.ErrClosed) {
		err = nil
	}
	return err
}

var _ io.Closer = (*Proxy)(nil)
