package pgtest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// StandbyOptions configures [Cluster.NewStandby].
type StandbyOptions struct {
	// Name is the standby's application_name, which synchronous_standby_names
	// refers to; empty means "standby" plus its port.
	Name string
	// Synchronous makes the primary wait for this standby at commit: the
	// primary's synchronous_standby_names is set to Name (with ALTER SYSTEM
	// and a reload, so the primary's Settings must not set it).
	Synchronous bool
	// PrimaryAddr is the host:port the standby streams from, e.g. a fault
	// proxy in front of the primary; empty means the primary itself.
	PrimaryAddr string
	// Settings are extra settings for the standby server.
	Settings map[string]string
}

// NewStandby clones c with pg_basebackup (run as the server's user) into a
// new temporary data directory, and starts it as a hot streaming standby of
// c on its own port. It waits until the primary reports the standby
// streaming (and, when Synchronous, as its synchronous standby). The caller
// must Destroy the standby; [NewStandby] does that for a test.
func (c *Cluster) NewStandby(ctx context.Context, opts *StandbyOptions) (*Cluster, error) {
	var o StandbyOptions
	if opts != nil {
		o = *opts
	}
	if c.Pid() == 0 {
		return nil, errors.New("pgtest: NewStandby needs a running primary")
	}
	if o.Settings["primary_conninfo"] != "" || o.Settings["synchronous_standby_names"] != "" {
		return nil, errors.New("pgtest: StandbyOptions.Settings must not set primary_conninfo or synchronous_standby_names")
	}
	cred, uid, gid, err := serverCredential()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", dirPrefix+"*")
	if err != nil {
		return nil, fmt.Errorf("pgtest: %w", err)
	}
	sb := &Cluster{BinDir: c.BinDir, Dir: dir, DataDir: filepath.Join(dir, "data"), cred: cred}
	fail := func(err error) (*Cluster, error) {
		sb.Destroy()
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(dir, "owner.pid"), []byte(strconv.Itoa(os.Getpid())), 0o644); err != nil {
		return fail(fmt.Errorf("pgtest: %w", err))
	}
	if uid >= 0 {
		if err := os.Chown(dir, uid, gid); err != nil {
			return fail(fmt.Errorf("pgtest: chown %s: %w", dir, err))
		}
	}
	if sb.Port, err = freePort(); err != nil {
		return fail(err)
	}
	if o.Name == "" {
		o.Name = "standby" + strconv.Itoa(sb.Port)
	}
	basebackup, err := c.clientBinary("pg_basebackup")
	if err != nil {
		return fail(err)
	}
	bb := exec.CommandContext(ctx, basebackup,
		"-h", "127.0.0.1", "-p", strconv.Itoa(c.Port), "-U", "postgres",
		"-D", sb.DataDir, "-X", "stream", "--checkpoint=fast", "--no-sync")
	bb.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	bb.Dir = dir
	if out, err := bb.CombinedOutput(); err != nil {
		return fail(fmt.Errorf("pgtest: pg_basebackup: %w\n%s", err, out))
	}
	if err := os.WriteFile(filepath.Join(sb.DataDir, "standby.signal"), nil, 0o600); err != nil {
		return fail(fmt.Errorf("pgtest: %w", err))
	}
	if uid >= 0 {
		_ = os.Chown(filepath.Join(sb.DataDir, "standby.signal"), uid, gid)
	}
	addr := o.PrimaryAddr
	if addr == "" {
		addr = net.JoinHostPort("127.0.0.1", strconv.Itoa(c.Port))
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return fail(fmt.Errorf("pgtest: primary address: %w", err))
	}
	settings := map[string]string{
		"primary_conninfo": fmt.Sprintf("host=%s port=%s user=postgres application_name=%s connect_timeout=2", host, port, o.Name),
		"hot_standby":      "on",
		// Report back often, so a standby behind a blackhole is noticed.
		"wal_receiver_status_interval": "1s",
		"wal_receiver_timeout":         "5s",
		"wal_retrieve_retry_interval":  "200ms",
	}
	for k, v := range o.Settings {
		settings[k] = v
	}
	sb.opts = ClusterOptions{Settings: settings, Env: c.opts.Env}

	if o.Synchronous {
		if err := c.adminExec(ctx, "ALTER SYSTEM SET synchronous_standby_names = "+quoteLiteral(o.Name), "SELECT pg_reload_conf()"); err != nil {
			return fail(err)
		}
	}
	if err := sb.Start(ctx); err != nil {
		return fail(err)
	}
	want := "async"
	if o.Synchronous {
		want = "sync"
	}
	if err := c.waitReplication(ctx, o.Name, want); err != nil {
		return fail(err)
	}
	return sb, nil
}

// clientBinary finds a PostgreSQL client program of the server's version:
// next to postgres, next to the file postgres links to, or on PATH.
func (c *Cluster) clientBinary(name string) (string, error) {
	dirs := []string{c.BinDir}
	if real, err := filepath.EvalSymlinks(filepath.Join(c.BinDir, "postgres")); err == nil {
		dirs = append(dirs, filepath.Dir(real))
	}
	for _, d := range dirs {
		p := filepath.Join(d, name)
		if st, err := os.Stat(p); err == nil && !st.IsDir() && st.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	if p, err := exec.LookPath(name); err == nil {
		return p, nil
	}
	return "", fmt.Errorf("pgtest: %s not found next to %s nor on PATH", name, c.BinDir)
}

func quoteLiteral(s string) string {
	out := []byte{'\''}
	for i := 0; i < len(s); i++ {
		if s[i] == '\'' {
			out = append(out, '\'')
		}
		out = append(out, s[i])
	}
	return string(append(out, '\''))
}

// adminExec runs statements on c's maintenance database over a fresh
// connection.
func (c *Cluster) adminExec(ctx context.Context, stmts ...string) error {
	conn, err := pgx.Connect(ctx, c.URL("postgres"))
	if err != nil {
		return fmt.Errorf("pgtest: connect to primary: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	for _, s := range stmts {
		if _, err := conn.Exec(ctx, s); err != nil {
			return fmt.Errorf("pgtest: %s: %w", s, err)
		}
	}
	return nil
}

// waitReplication waits until pg_stat_replication on c shows the standby
// name streaming with sync_state want.
func (c *Cluster) waitReplication(ctx context.Context, name, want string) error {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	conn, err := pgx.Connect(ctx, c.URL("postgres"))
	if err != nil {
		return fmt.Errorf("pgtest: connect to primary: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	for {
		var n int
		err := conn.QueryRow(ctx, `SELECT count(*) FROM pg_stat_replication
			WHERE application_name = $1 AND state = 'streaming' AND sync_state = $2`, name, want).Scan(&n)
		if err != nil {
			return fmt.Errorf("pgtest: wait for standby %s: %w", name, err)
		}
		if n > 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("pgtest: standby %s not streaming (%s) in time: %w", name, want, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// Promote promotes a standby to primary and waits until it accepts writes.
func (c *Cluster) Promote(ctx context.Context) error {
	conn, err := pgx.Connect(ctx, c.URL("postgres"))
	if err != nil {
		return fmt.Errorf("pgtest: connect to standby: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	var ok bool
	if err := conn.QueryRow(ctx, "SELECT pg_promote(true, 60)").Scan(&ok); err != nil {
		return fmt.Errorf("pgtest: promote: %w", err)
	}
	if !ok {
		return errors.New("pgtest: promote: the standby was not promoted within 60s")
	}
	return nil
}

// NewStandby starts a streaming standby of c for a test (see
// [Cluster.NewStandby]) and destroys it when t ends.
func NewStandby(t testing.TB, c *Cluster, opts *StandbyOptions) *Cluster {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	sb, err := c.NewStandby(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("pgtest: standby log tail:\n%s", sb.LogTail())
		}
		sb.Destroy()
	})
	return sb
}
