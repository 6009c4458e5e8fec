package patroni

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/pgfence/pgfence/internal/pgtest"
)

// Options configures a [Cluster].
type Options struct {
	// Synchronous turns on Patroni's synchronous_mode: a commit is
	// acknowledged only once a synchronous standby has flushed it, and only
	// that standby may be promoted.
	Synchronous bool
	// MaxLagOnFailover is Patroni's maximum_lag_on_failover in bytes: a
	// replica further behind the last known primary position is not
	// promoted. Zero means Patroni's default (1 MiB).
	MaxLagOnFailover int64
	// Logf, when set, receives the harness's progress lines.
	Logf func(format string, args ...any)
}

// The shape of every cluster: Patroni's timing and PostgreSQL's replication
// timeouts. wal_sender_timeout and wal_receiver_timeout are short so that a
// replication stream cut by a blackhole is noticed in seconds, not the
// default minute (the primary's Patroni then sees its synchronous standby
// gone).
const (
	ttl                = 10
	loopWait           = 1
	retryTimeout       = 4
	primaryStartTimout = 0
	walTimeout         = "5s"
	// Nodes is the number of Patroni nodes.
	Nodes = 3
	// Database is the database created for the workload.
	Database = "hasuite"
)

// Cluster is etcd plus [Nodes] Patroni nodes of PostgreSQL on loopback, in a
// private temporary directory, all started and stopped by this process. Each
// node's PostgreSQL listens on its own port (clients connect there); its
// Patroni connect_address, through which the other nodes replicate from it
// (and rewind from it), is an in-process [pgtest.Proxy] in front of that
// port, so a test can cut a node's replication without touching clients.
type Cluster struct {
	// Dir is the private directory holding every configuration, data
	// directory and log.
	Dir string
	// Password is the postgres role's password.
	Password string
	// Nodes are the Patroni nodes.
	Nodes []*Node

	opts      Options
	cred      *syscall.Credential
	etcd      *proc
	etcdPort  int
	namespace string
	http      *http.Client
}

// Node is one Patroni node and its PostgreSQL.
type Node struct {
	// Name is the Patroni member name.
	Name string
	// Port is PostgreSQL's port on 127.0.0.1.
	Port int
	// APIPort is Patroni's REST API port on 127.0.0.1.
	APIPort int
	// Replication is the proxy in front of Port that the other nodes
	// replicate through (the node's connect_address).
	Replication *pgtest.Proxy
	// DataDir is PostgreSQL's data directory.
	DataDir string

	dir     string
	config  string
	patroni *proc
	c       *Cluster
}

// Start starts etcd and the nodes, waits until the cluster is healthy
// (see [Cluster.WaitHealthy]) and creates [Database]. ctx bounds it. On
// error everything started is stopped again.
func Start(ctx context.Context, opts *Options) (c *Cluster, err error) {
	for _, tool := range []string{"patroni", "etcd"} {
		if _, err := exec.LookPath(tool); err != nil {
			return nil, fmt.Errorf("patroni: %s not found (apt-get install patroni etcd-server etcd-client python3-etcd python3-psycopg2, or .ci/patroni-setup): %w", tool, err)
		}
	}
	binDir := "/usr/lib/postgresql/15/bin"
	if _, err := os.Stat(filepath.Join(binDir, "postgres")); err != nil {
		return nil, fmt.Errorf("patroni: PostgreSQL 15 server binaries not found in %s: %w", binDir, err)
	}
	c = &Cluster{http: &http.Client{Timeout: 3 * time.Second}}
	if opts != nil {
		c.opts = *opts
	}
	if c.cred, err = serverCredential(); err != nil {
		return nil, err
	}
	var rnd [8]byte
	if _, err := rand.Read(rnd[:]); err != nil {
		return nil, err
	}
	c.Password = hex.EncodeToString(rnd[:])
	c.namespace = "/pgfence-patroni-" + hex.EncodeToString(rnd[:4]) + "/"
	removeStaleDirs()
	if c.Dir, err = os.MkdirTemp("", dirPrefix+"*"); err != nil {
		return nil, fmt.Errorf("patroni: %w", err)
	}
	if err := os.WriteFile(filepath.Join(c.Dir, ownerFile), []byte(strconv.Itoa(os.Getpid())+"\n"), 0o600); err != nil {
		return nil, fmt.Errorf("patroni: %w", err)
	}
	defer func() {
		if err != nil {
			c.Close()
			c = nil
		}
	}()
	if err := c.chown(c.Dir); err != nil {
		return nil, err
	}
	if err := c.startEtcd(ctx); err != nil {
		return nil, err
	}
	for i := 0; i < Nodes; i++ {
		n := &Node{Name: fmt.Sprintf("node%d", i), c: c}
		n.dir = filepath.Join(c.Dir, n.Name)
		n.DataDir = filepath.Join(n.dir, "data")
		if err := os.Mkdir(n.dir, 0o700); err != nil {
			return nil, fmt.Errorf("patroni: %w", err)
		}
		if err := c.chown(n.dir); err != nil {
			return nil, err
		}
		if n.Port, err = freePort(); err != nil {
			return nil, err
		}
		if n.APIPort, err = freePort(); err != nil {
			return nil, err
		}
		if n.Replication, err = pgtest.NewProxy(net.JoinHostPort("127.0.0.1", strconv.Itoa(n.Port))); err != nil {
			return nil, err
		}
		c.Nodes = append(c.Nodes, n)
	}
	for _, n := range c.Nodes {
		if err := n.writeConfig(); err != nil {
			return nil, err
		}
		if err := n.Start(); err != nil {
			return nil, err
		}
	}
	if err := c.WaitHealthy(ctx); err != nil {
		return nil, err
	}
	if err := c.createDatabase(ctx); err != nil {
		return nil, err
	}
	return c, nil
}

func (c *Cluster) logf(format string, args ...any) {
	if c.opts.Logf != nil {
		c.opts.Logf(format, args...)
	}
}

func (c *Cluster) chown(path string) error {
	if c.cred == nil {
		return nil
	}
	if err := os.Chown(path, int(c.cred.Uid), int(c.cred.Gid)); err != nil {
		return fmt.Errorf("patroni: chown %s: %w", path, err)
	}
	return nil
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("patroni: find a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func (c *Cluster) startEtcd(ctx context.Context) error {
	var err error
	if c.etcdPort, err = freePort(); err != nil {
		return err
	}
	peerPort, err := freePort()
	if err != nil {
		return err
	}
	dir := filepath.Join(c.Dir, "etcd")
	client := fmt.Sprintf("http://127.0.0.1:%d", c.etcdPort)
	peer := fmt.Sprintf("http://127.0.0.1:%d", peerPort)
	c.etcd, err = spawn("etcd", c.Dir, filepath.Join(c.Dir, "etcd.log"), c.cred, syscall.SIGKILL,
		"etcd", "--name", "pgfence", "--data-dir", dir,
		"--listen-client-urls", client, "--advertise-client-urls", client,
		"--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
		"--initial-cluster", "pgfence="+peer, "--initial-cluster-state", "new",
		"--logger", "zap", "--log-level", "warn")
	if err != nil {
		return err
	}
	for {
		var health struct {
			Health string `json:"health"`
		}
		if err := c.getJSON(ctx, client+"/health", &health); err == nil && health.Health == "true" {
			return nil
		}
		if !c.etcd.running() {
			return fmt.Errorf("patroni: etcd exited: %v\n%s", c.etcd.err, tail(filepath.Join(c.Dir, "etcd.log"), 20))
		}
		if err := sleepCtx(ctx, 50*time.Millisecond); err != nil {
			return fmt.Errorf("patroni: etcd did not become healthy: %w", err)
		}
	}
}

// writeConfig writes the node's Patroni configuration.
func (n *Node) writeConfig() error {
	c := n.c
	lag := ""
	if c.opts.MaxLagOnFailover > 0 {
		lag = fmt.Sprintf("    maximum_lag_on_failover: %d\n", c.opts.MaxLagOnFailover)
	}
	cfg := fmt.Sprintf(`scope: pgfence
namespace: %[1]s
name: %[2]s
log:
  level: INFO
restapi:
  listen: 127.0.0.1:%[3]d
  connect_address: 127.0.0.1:%[3]d
etcd3:
  hosts: 127.0.0.1:%[4]d
bootstrap:
  dcs:
    ttl: %[5]d
    loop_wait: %[6]d
    retry_timeout: %[7]d
    primary_start_timeout: %[8]d
    synchronous_mode: %[9]t
%[10]s    postgresql:
      use_pg_rewind: true
      use_slots: true
      remove_data_directory_on_rewind_failure: true
      remove_data_directory_on_diverged_timelines: true
      parameters:
        max_connections: 300
        shared_buffers: 32MB
        wal_keep_size: 256MB
        wal_sender_timeout: %[11]s
        wal_receiver_timeout: %[11]s
        fsync: "off"
  initdb:
    - encoding: UTF8
    - locale: C
    - auth-local: trust
    - auth-host: scram-sha-256
  pg_hba:
    - local all all trust
    - host all all 127.0.0.1/32 scram-sha-256
    - host replication replicator 127.0.0.1/32 scram-sha-256
postgresql:
  listen: 127.0.0.1:%[12]d
  connect_address: %[13]s
  data_dir: %[14]s
  bin_dir: /usr/lib/postgresql/15/bin
  pgpass: %[15]s
  authentication:
    superuser:
      username: postgres
      password: %[16]s
    replication:
      username: replicator
      password: %[16]s
  parameters:
    unix_socket_directories: %[17]s
    password_encryption: scram-sha-256
`, c.namespace, n.Name, n.APIPort, c.etcdPort, ttl, loopWait, retryTimeout, primaryStartTimout,
		c.opts.Synchronous, lag, walTimeout, n.Port, n.Replication.Addr(), n.DataDir,
		filepath.Join(n.dir, "pgpass"), c.Password, n.dir)
	n.config = filepath.Join(n.dir, "patroni.yml")
	if err := os.WriteFile(n.config, []byte(cfg), 0o600); err != nil {
		return fmt.Errorf("patroni: %w", err)
	}
	return c.chown(n.config)
}

// Start starts the node's Patroni, which starts (or bootstraps, or clones)
// its PostgreSQL. Patroni is started with a parent-death signal SIGTERM:
// should this process die, Patroni stops its PostgreSQL and exits.
func (n *Node) Start() error {
	if n.patroni.running() {
		return fmt.Errorf("patroni: %s is already running", n.Name)
	}
	p, err := spawn("patroni "+n.Name, n.dir, filepath.Join(n.dir, "patroni.log"), n.c.cred, syscall.SIGTERM,
		"patroni", n.config)
	if err != nil {
		return err
	}
	n.patroni = p
	return nil
}

// Running reports whether the node's Patroni runs.
func (n *Node) Running() bool { return n.patroni.running() }

// KillPostmaster kills the node's postmaster with SIGKILL (Patroni keeps
// running) and waits until it is gone; it returns its pid.
func (n *Node) KillPostmaster() (int, error) {
	pid, err := killPostmaster(n.DataDir, syscall.SIGKILL, 10*time.Second)
	if err == nil && pid == 0 {
		err = fmt.Errorf("patroni: no postmaster running on %s", n.DataDir)
	}
	return pid, err
}

// Crash kills the node's Patroni and then its postmaster with SIGKILL, as a
// machine crash would end them (the PostgreSQL backends exit when they see
// their postmaster gone). Start brings the node back.
func (n *Node) Crash() error {
	n.patroni.stop(syscall.SIGKILL, 0)
	_, err := killPostmaster(n.DataDir, syscall.SIGKILL, 10*time.Second)
	return err
}

// stop stops the node: Patroni with SIGTERM (it stops PostgreSQL, fast
// shutdown), SIGKILL after a grace period, then any postmaster left on its
// data directory with SIGQUIT (immediate shutdown) and SIGKILL.
func (n *Node) stop() {
	n.patroni.stop(syscall.SIGTERM, 15*time.Second)
	if _, err := killPostmaster(n.DataDir, syscall.SIGQUIT, 5*time.Second); err != nil {
		_, _ = killPostmaster(n.DataDir, syscall.SIGKILL, 5*time.Second)
	}
}

// URL is a single-host connection URL for database on the node, as postgres.
func (n *Node) URL(database string) string {
	u := url.URL{Scheme: "postgres", User: url.UserPassword("postgres", n.c.Password),
		Host: net.JoinHostPort("127.0.0.1", strconv.Itoa(n.Port)), Path: "/" + database,
		RawQuery: "sslmode=disable&connect_timeout=2"}
	return u.String()
}

// LogTail returns the last lines of the node's Patroni log (which holds
// PostgreSQL's log too).
func (n *Node) LogTail(lines int) string { return tail(filepath.Join(n.dir, "patroni.log"), lines) }

// URL returns the multi-host URL an application uses: every node, in node
// order, with target_session_attrs=read-write (pgx tries the hosts in order
// and keeps the first that accepts writes) and a connect_timeout so an
// unreachable host costs at most that long per attempt.
func (c *Cluster) URL(database string, connectTimeout time.Duration) string {
	hosts := make([]string, len(c.Nodes))
	for i, n := range c.Nodes {
		hosts[i] = net.JoinHostPort("127.0.0.1", strconv.Itoa(n.Port))
	}
	secs := max(1, int(connectTimeout.Round(time.Second)/time.Second))
	u := url.URL{Scheme: "postgres", User: url.UserPassword("postgres", c.Password),
		Host: strings.Join(hosts, ","), Path: "/" + database,
		RawQuery: fmt.Sprintf("sslmode=disable&target_session_attrs=read-write&connect_timeout=%d", secs)}
	return u.String()
}

// Member is one entry of Patroni's /cluster.
type Member struct {
	Name     string          `json:"name"`
	Role     string          `json:"role"`
	State    string          `json:"state"`
	Timeline int             `json:"timeline"`
	Lag      json.RawMessage `json:"lag"`
}

// Members returns the cluster's members as the first Patroni that answers
// reports them.
func (c *Cluster) Members(ctx context.Context) ([]Member, error) {
	var last error
	for _, n := range c.Nodes {
		if !n.Running() {
			continue
		}
		var out struct {
			Members []Member `json:"members"`
		}
		if err := c.getJSON(ctx, fmt.Sprintf("http://127.0.0.1:%d/cluster", n.APIPort), &out); err != nil {
			last = err
			continue
		}
		return out.Members, nil
	}
	if last == nil {
		last = errors.New("no Patroni is running")
	}
	return nil, fmt.Errorf("patroni: cluster state: %w", last)
}

// Leader returns the node Patroni reports as leader, or nil.
func (c *Cluster) Leader(ctx context.Context) *Node {
	ms, err := c.Members(ctx)
	if err != nil {
		return nil
	}
	for _, m := range ms {
		if m.Role == "leader" && m.State == "running" {
			return c.node(m.Name)
		}
	}
	return nil
}

func (c *Cluster) node(name string) *Node {
	for _, n := range c.Nodes {
		if n.Name == name {
			return n
		}
	}
	return nil
}

// healthy reports whether every node runs, one leads, the others stream
// from it with no lag, and (synchronous mode) one is the synchronous
// standby; else why not.
func (c *Cluster) healthy(ctx context.Context) (bool, string) {
	ms, err := c.Members(ctx)
	if err != nil {
		return false, err.Error()
	}
	if len(ms) != len(c.Nodes) {
		return false, fmt.Sprintf("%d members", len(ms))
	}
	leaders, syncs := 0, 0
	for _, m := range ms {
		switch {
		case m.State != "running" && m.State != "streaming":
			return false, fmt.Sprintf("%s is %s", m.Name, m.State)
		case m.Role == "leader":
			leaders++
		case m.Role == "sync_standby":
			syncs++
		}
		if m.Role != "leader" && string(m.Lag) != "0" {
			return false, fmt.Sprintf("%s lags %s", m.Name, m.Lag)
		}
	}
	if leaders != 1 {
		return false, fmt.Sprintf("%d leaders", leaders)
	}
	if c.opts.Synchronous && syncs == 0 {
		return false, "no synchronous standby yet"
	}
	return true, ""
}

// WaitHealthy waits until the cluster is healthy: every node running, one
// leader, every replica streaming without lag, a synchronous standby in
// synchronous mode.
func (c *Cluster) WaitHealthy(ctx context.Context) error {
	start := time.Now()
	var why string
	for {
		var ok bool
		if ok, why = c.healthy(ctx); ok {
			c.logf("patroni: cluster healthy after %v", time.Since(start).Round(10*time.Millisecond))
			return nil
		}
		for _, n := range c.Nodes {
			if n.patroni != nil && !n.patroni.running() {
				return fmt.Errorf("patroni: %s exited: %v\n%s", n.Name, n.patroni.err, n.LogTail(30))
			}
		}
		if err := sleepCtx(ctx, 100*time.Millisecond); err != nil {
			var logs strings.Builder
			for _, n := range c.Nodes {
				fmt.Fprintf(&logs, "--- %s ---\n%s\n", n.Name, n.LogTail(15))
			}
			return fmt.Errorf("patroni: cluster not healthy (%s): %w\n%s", why, err, logs.String())
		}
	}
}

// Switchover asks Patroni for a switchover away from the current leader
// (Patroni picks the candidate: the synchronous standby in synchronous
// mode) and waits for its answer.
func (c *Cluster) Switchover(ctx context.Context, leader *Node) error {
	body, _ := json.Marshal(map[string]string{"leader": leader.Name})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost,
		fmt.Sprintf("http://127.0.0.1:%d/switchover", leader.APIPort), bytes.NewReader(body))
	if err != nil {
		return err
	}
	resp, err := (&http.Client{Timeout: 30 * time.Second}).Do(req)
	if err != nil {
		return fmt.Errorf("patroni: switchover: %w", err)
	}
	defer resp.Body.Close()
	msg, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("patroni: switchover: %s: %s", resp.Status, msg)
	}
	return nil
}

func (c *Cluster) getJSON(ctx context.Context, u string, v any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return err
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	if resp.StatusCode >= 500 && !json.Valid(b) {
		return fmt.Errorf("%s: %s", u, resp.Status)
	}
	return json.Unmarshal(b, v)
}

// createDatabase creates Database on the leader.
func (c *Cluster) createDatabase(ctx context.Context) error {
	leader := c.Leader(ctx)
	if leader == nil {
		return errors.New("patroni: no leader to create the database on")
	}
	conn, err := connect(ctx, leader.URL("postgres"))
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+Database); err != nil {
		return fmt.Errorf("patroni: create database: %w", err)
	}
	// Wait until every replica has replayed it: pgx does not try the next
	// host of a multi-host URL after a server's "database does not exist".
	for _, n := range c.Nodes {
		for {
			conn, err := connect(ctx, n.URL(Database))
			if err == nil {
				_ = conn.Close(ctx)
				break
			}
			if err := sleepCtx(ctx, 50*time.Millisecond); err != nil {
				return fmt.Errorf("patroni: database not replicated to %s: %w", n.Name, err)
			}
		}
	}
	return nil
}

// Close stops every node and etcd, closes the proxies and removes Dir. It
// signals only the processes this Cluster started: its Patroni and etcd
// children, and the postmasters running on its own data directories.
func (c *Cluster) Close() {
	for _, n := range c.Nodes {
		n.stop()
	}
	if c.etcd != nil {
		c.etcd.stop(syscall.SIGTERM, 5*time.Second)
	}
	for _, n := range c.Nodes {
		if n.Replication != nil {
			_ = n.Replication.Close()
		}
	}
	if c.Dir != "" && os.Getenv("PGFENCE_PATRONI_KEEP") == "" {
		_ = os.RemoveAll(c.Dir)
	}
}

// Logs returns the tail of every node's log, for a failure message.
func (c *Cluster) Logs(lines int) string {
	var b strings.Builder
	for _, n := range c.Nodes {
		fmt.Fprintf(&b, "--- %s (patroni.log, last %d lines) ---\n%s\n", n.Name, lines, n.LogTail(lines))
	}
	return b.String()
}

func tail(path string, lines int) string {
	b, _ := os.ReadFile(path)
	ls := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(ls) > lines {
		ls = ls[len(ls)-lines:]
	}
	return strings.Join(ls, "\n")
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
