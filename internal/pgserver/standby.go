package pgserver

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
	// PrimaryAddr is the host:port the standby streams from over TCP, e.g. a
	// fault proxy in front of a primary that listens on TCP; empty means
	// the primary's own socket.
	PrimaryAddr string
	// Settings are extra settings for the standby server.
	Settings map[string]string
}

// NewStandby clones c with pg_basebackup (run as the server's user, over
// c's socket) into a new private directory, and starts it as a hot
// streaming standby of c on its own port, listening as c does (socket only,
// or TCP too with c's password). It waits until the primary reports the
// standby streaming (and, when Synchronous, as its synchronous standby). The
// caller must Destroy the standby.
func (c *Cluster) NewStandby(ctx context.Context, opts *StandbyOptions) (*Cluster, error) {
	var o StandbyOptions
	if opts != nil {
		o = *opts
	}
	if c.Pid() == 0 {
		return nil, errors.New("pgserver: NewStandby needs a running primary")
	}
	if o.Settings["primary_conninfo"] != "" || o.Settings["synchronous_standby_names"] != "" {
		return nil, errors.New("pgserver: StandbyOptions.Settings must not set primary_conninfo or synchronous_standby_names")
	}
	for _, k := range accessSettings {
		if _, ok := o.Settings[k]; ok {
			return nil, fmt.Errorf("pgserver: StandbyOptions.Settings must not set %s", k)
		}
	}
	if o.PrimaryAddr != "" && !c.TCP {
		return nil, errors.New("pgserver: StandbyOptions.PrimaryAddr needs a primary that listens on TCP")
	}
	dir, err := makeDir(os.TempDir(), c.cred)
	if err != nil {
		return nil, err
	}
	sb := &Cluster{BinDir: c.BinDir, Dir: dir, DataDir: filepath.Join(dir, "data"), cred: c.cred, TCP: c.TCP, Password: c.Password}
	fail := func(err error) (*Cluster, error) {
		sb.Destroy()
		return nil, err
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
		"-h", c.Dir, "-p", strconv.Itoa(c.Port), "-U", "postgres",
		"-D", sb.DataDir, "-X", "stream", "--checkpoint=fast", "--no-sync")
	bb.SysProcAttr = &syscall.SysProcAttr{Credential: c.cred}
	bb.Dir = dir
	if out, err := bb.CombinedOutput(); err != nil {
		return fail(fmt.Errorf("pgserver: pg_basebackup: %w\n%s", err, out))
	}
	if err := writeOwned(filepath.Join(sb.DataDir, "standby.signal"), nil, c.cred); err != nil {
		return fail(err)
	}
	conninfo := fmt.Sprintf("host=%s port=%d user=postgres application_name=%s connect_timeout=2", quoteKV(c.Dir), c.Port, o.Name)
	if o.PrimaryAddr != "" {
		host, port, err := net.SplitHostPort(o.PrimaryAddr)
		if err != nil {
			return fail(fmt.Errorf("pgserver: primary address: %w", err))
		}
		conninfo = fmt.Sprintf("host=%s port=%s user=postgres password=%s application_name=%s connect_timeout=2",
			quoteKV(host), quoteKV(port), quoteKV(c.Password), o.Name)
	}
	// primary_conninfo goes into postgresql.auto.conf (mode 0600), not on
	// the command line, where ps would show the password to every user.
	if err := appendConf(filepath.Join(sb.DataDir, "postgresql.auto.conf"), "primary_conninfo", conninfo); err != nil {
		return fail(err)
	}
	settings := map[string]string{
		"hot_standby": "on",
		// Report back often, so a standby behind a blackhole is noticed.
		"wal_receiver_status_interval": "1s",
		"wal_receiver_timeout":         "5s",
		"wal_retrieve_retry_interval":  "200ms",
	}
	for k, v := range o.Settings {
		settings[k] = v
	}
	sb.opts = Options{Settings: settings, Env: c.opts.Env, TCP: c.TCP, Password: c.Password}

	if o.Synchronous {
		if err := c.adminExec(ctx, "ALTER SYSTEM SET synchronous_standby_names = "+quoteLiteral(o.Name), "SELECT pg_catalog.pg_reload_conf()"); err != nil {
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
	return "", fmt.Errorf("pgserver: %s not found next to %s nor on PATH", name, c.BinDir)
}

// appendConf appends "name = 'value'" to a server configuration file.
func appendConf(path, name, value string) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		return fmt.Errorf("pgserver: %w", err)
	}
	_, err = fmt.Fprintf(f, "%s = %s\n", name, quoteLiteral(value))
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("pgserver: %w", err)
	}
	return nil
}

// quoteLiteral quotes s as an SQL string literal (standard_conforming_strings
// is on).
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

// quoteKV quotes a value for a libpq keyword/value connection string.
func quoteKV(v string) string {
	out := []byte{'\''}
	for i := 0; i < len(v); i++ {
		if v[i] == '\'' || v[i] == '\\' {
			out = append(out, '\\')
		}
		out = append(out, v[i])
	}
	return string(append(out, '\''))
}

// adminExec runs statements on c's maintenance database over a fresh
// connection on its socket.
func (c *Cluster) adminExec(ctx context.Context, stmts ...string) error {
	conn, err := pgx.Connect(ctx, c.SocketURL("postgres"))
	if err != nil {
		return fmt.Errorf("pgserver: connect to primary: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	for _, s := range stmts {
		if _, err := conn.Exec(ctx, s); err != nil {
			return fmt.Errorf("pgserver: %s: %w", s, err)
		}
	}
	return nil
}

// Replication state of the standby named $1. Reads only.
const replicationStateSQL = `SELECT pg_catalog.count(*) FROM pg_catalog.pg_stat_replication
WHERE application_name = $1 AND state = 'streaming' AND sync_state = $2`

// waitReplication waits until pg_stat_replication on c shows the standby
// name streaming with sync_state want.
func (c *Cluster) waitReplication(ctx context.Context, name, want string) error {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	conn, err := pgx.Connect(ctx, c.SocketURL("postgres"))
	if err != nil {
		return fmt.Errorf("pgserver: connect to primary: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	for {
		var n int
		if err := conn.QueryRow(ctx, replicationStateSQL, name, want).Scan(&n); err != nil {
			return fmt.Errorf("pgserver: wait for standby %s: %w", name, err)
		}
		if n > 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("pgserver: standby %s not streaming (%s) in time: %w", name, want, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// Promote promotes a standby to primary and waits until it accepts writes.
func (c *Cluster) Promote(ctx context.Context) error {
	conn, err := pgx.Connect(ctx, c.SocketURL("postgres"))
	if err != nil {
		return fmt.Errorf("pgserver: connect to standby: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	var ok bool
	if err := conn.QueryRow(ctx, "SELECT pg_catalog.pg_promote(true, 60)").Scan(&ok); err != nil {
		return fmt.Errorf("pgserver: promote: %w", err)
	}
	if !ok {
		return errors.New("pgserver: promote: the standby was not promoted within 60s")
	}
	return nil
}
