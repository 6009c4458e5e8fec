package chaos

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// Netns is a network namespace created for a test, joined to the host by a
// veth pair on a private /30: the host side is [Netns.HostIP], the
// namespace side [Netns.NsIP]. Clients dial from inside it with
// [Netns.DialContext]; nftables rules inside it ([Netns.Blackhole],
// [Netns.Reject]) then fault their traffic without touching the host's
// rules. It needs root (CAP_NET_ADMIN), ip (iproute2) and nft (nftables).
type Netns struct {
	// Name is the namespace's name under /var/run/netns.
	Name string
	// HostIP is the host end of the veth pair.
	HostIP string
	// NsIP is the namespace end of the veth pair.
	NsIP string

	// closing is cancelled by Close, ending dials still in flight.
	closing context.Context
	cancel  context.CancelFunc
}

// NewNetns creates a namespace and its veth pair. Close deletes both.
func NewNetns(ctx context.Context) (*Netns, error) {
	for _, tool := range []string{"ip", "nft"} {
		if _, err := exec.LookPath(tool); err != nil {
			return nil, fmt.Errorf("chaos: %s not found (apt-get install iproute2 nftables): %w", tool, err)
		}
	}
	var rnd [4]byte
	if _, err := rand.Read(rnd[:]); err != nil {
		return nil, err
	}
	id := hex.EncodeToString(rnd[:])
	// A /30 in 10.77.0.0/16 picked at random: .1 host, .2 namespace.
	third, fourth := int(rnd[0]), int(rnd[1]&0xfc)
	n := &Netns{
		Name:   "pgfc" + id,
		HostIP: fmt.Sprintf("10.77.%d.%d", third, fourth+1),
		NsIP:   fmt.Sprintf("10.77.%d.%d", third, fourth+2),
	}
	n.closing, n.cancel = context.WithCancel(context.Background())
	hostIf, nsIf := "pgfh"+id, "pgfn"+id
	steps := [][]string{
		{"ip", "netns", "add", n.Name},
		{"ip", "link", "add", hostIf, "type", "veth", "peer", "name", nsIf},
		{"ip", "link", "set", nsIf, "netns", n.Name},
		{"ip", "addr", "add", n.HostIP + "/30", "dev", hostIf},
		{"ip", "link", "set", hostIf, "up"},
		{"ip", "netns", "exec", n.Name, "ip", "addr", "add", n.NsIP + "/30", "dev", nsIf},
		{"ip", "netns", "exec", n.Name, "ip", "link", "set", nsIf, "up"},
		{"ip", "netns", "exec", n.Name, "ip", "link", "set", "lo", "up"},
		{"ip", "netns", "exec", n.Name, "nft", "add", "table", "inet", "chaos"},
		{"ip", "netns", "exec", n.Name, "nft", "add", "chain", "inet", "chaos", "out",
			"{ type filter hook output priority 0 ; }"},
		{"ip", "netns", "exec", n.Name, "nft", "add", "chain", "inet", "chaos", "in",
			"{ type filter hook input priority 0 ; }"},
	}
	for i, s := range steps {
		if err := run(ctx, s...); err != nil {
			if i > 0 {
				_ = run(context.WithoutCancel(ctx), "ip", "link", "del", hostIf)
				_ = n.Close()
			}
			return nil, err
		}
	}
	return n, nil
}

func run(ctx context.Context, args ...string) error {
	out, err := exec.CommandContext(ctx, args[0], args[1:]...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("chaos: %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// DialContext dials from inside the namespace; its signature fits
// pgconn.Config.DialFunc. Closing the namespace ends dials in flight.
func (n *Netns) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := context.AfterFunc(n.closing, cancel)
	defer stop()
	type result struct {
		c   net.Conn
		err error
	}
	ch := make(chan result, 1)
	go func() {
		// The socket is created in the namespace of the calling thread:
		// switch a locked thread in, create and connect, switch back. A
		// thread that cannot switch back stays locked, so the runtime
		// retires it with the goroutine.
		runtime.LockOSThread()
		orig, err := os.Open("/proc/thread-self/ns/net")
		if err != nil {
			runtime.UnlockOSThread()
			ch <- result{err: err}
			return
		}
		defer orig.Close()
		target, err := os.Open("/var/run/netns/" + n.Name)
		if err != nil {
			runtime.UnlockOSThread()
			ch <- result{err: err}
			return
		}
		defer target.Close()
		if err := unix.Setns(int(target.Fd()), unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread()
			ch <- result{err: fmt.Errorf("chaos: setns: %w", err)}
			return
		}
		var d net.Dialer
		c, err := d.DialContext(ctx, network, addr)
		if unix.Setns(int(orig.Fd()), unix.CLONE_NEWNET) == nil {
			runtime.UnlockOSThread()
		}
		ch <- result{c, err}
	}()
	r := <-ch
	return r.c, r.err
}

// Reject installs a rule that answers the namespace's TCP traffic to port
// on the host end with a reset: open connections break at their next send,
// new ones are refused.
func (n *Netns) Reject(ctx context.Context, port int) error {
	return run(ctx, "ip", "netns", "exec", n.Name, "nft", "add", "rule", "inet", "chaos", "out",
		"ip", "daddr", n.HostIP, "tcp", "dport", strconv.Itoa(port), "reject", "with", "tcp", "reset")
}

// Blackhole installs rules dropping, silently, all TCP traffic between the
// namespace and port on the host end, both ways.
func (n *Netns) Blackhole(ctx context.Context, port int) error {
	p := strconv.Itoa(port)
	if err := run(ctx, "ip", "netns", "exec", n.Name, "nft", "add", "rule", "inet", "chaos", "out",
		"ip", "daddr", n.HostIP, "tcp", "dport", p, "drop"); err != nil {
		return err
	}
	return run(ctx, "ip", "netns", "exec", n.Name, "nft", "add", "rule", "inet", "chaos", "in",
		"ip", "saddr", n.HostIP, "tcp", "sport", p, "drop")
}

// Heal removes every rule installed by Blackhole and Reject.
func (n *Netns) Heal(ctx context.Context) error {
	if err := run(ctx, "ip", "netns", "exec", n.Name, "nft", "flush", "chain", "inet", "chaos", "out"); err != nil {
		return err
	}
	return run(ctx, "ip", "netns", "exec", n.Name, "nft", "flush", "chain", "inet", "chaos", "in")
}

// Close ends dials in flight and deletes the namespace, which deletes the
// veth pair and the rules.
func (n *Netns) Close() error {
	n.cancel()
	err := run(context.Background(), "ip", "netns", "del", n.Name)
	if err != nil && strings.Contains(err.Error(), "No such file") {
		return nil
	}
	return err
}
