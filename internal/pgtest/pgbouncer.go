package pgtest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/pgfence/pgfence/internal/sysproc"
)

// PgBouncerConfig configures [StartPgBouncer].
type PgBouncerConfig struct {
	// ServerPort is the PostgreSQL server's port on 127.0.0.1. Required.
	ServerPort int
	// Password is the postgres role's password on the server (the test
	// servers ask for it on TCP). PgBouncer asks clients for it too
	// (scram-sha-256), and logs in to the server with it.
	Password string
	// PoolMode is PgBouncer's pool_mode; empty means "transaction".
	PoolMode string
	// PoolSize is the number of server connections per database and user;
	// zero means 2.
	PoolSize int
	// Binary is the pgbouncer executable; empty means "pgbouncer" on PATH
	// or /usr/sbin/pgbouncer.
	Binary string
}

// PgBouncer is a throwaway PgBouncer process on a free loopback port, run as
// the postgres user when this process is root, with its configuration in a
// temporary directory. It dies with this process.
type PgBouncer struct {
	// Port is the port PgBouncer listens on, on 127.0.0.1.
	Port     int
	password string
	dir      string
	cmd      *exec.Cmd
	done     chan struct{}
}

// pgbouncerIni is PgBouncer's configuration: every database of the server,
// the postgres role's password required (scram-sha-256; never trust on TCP),
// no unix socket.
const pgbouncerIni = `[databases]
* = host=127.0.0.1 port=%d

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = %d
unix_socket_dir =
auth_type = scram-sha-256
auth_file = %s
pool_mode = %s
default_pool_size = %d
max_client_conn = 200
ignore_startup_parameters = extra_float_digits
logfile = %s
admin_users = postgres
`

// StartPgBouncer starts PgBouncer in front of the server and waits until it
// accepts connections. Close it when done.
func StartPgBouncer(ctx context.Context, cfg PgBouncerConfig) (*PgBouncer, error) {
	if cfg.ServerPort <= 0 {
		return nil, errors.New("pgtest: PgBouncerConfig.ServerPort is required")
	}
	if cfg.PoolMode == "" {
		cfg.PoolMode = "transaction"
	}
	if cfg.PoolSize == 0 {
		cfg.PoolSize = 2
	}
	bin := cfg.Binary
	if bin == "" {
		if p, err := exec.LookPath("pgbouncer"); err == nil {
			bin = p
		} else {
			bin = "/usr/sbin/pgbouncer"
		}
	}
	if _, err := os.Stat(bin); err != nil {
		return nil, fmt.Errorf("pgtest: pgbouncer not found (apt-get install pgbouncer): %w", err)
	}
	port, err := freeLoopbackPort()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "pgfence-pgbouncer-*")
	if err != nil {
		return nil, fmt.Errorf("pgtest: %w", err)
	}
	b := &PgBouncer{Port: port, password: cfg.Password, dir: dir, done: make(chan struct{})}
	fail := func(err error) (*PgBouncer, error) {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	var cred *syscall.Credential
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			return fail(fmt.Errorf("pgtest: running as root and no postgres user to run pgbouncer as: %w", err))
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		cred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
		if err := os.Chown(dir, uid, gid); err != nil {
			return fail(fmt.Errorf("pgtest: %w", err))
		}
	}
	ini := filepath.Join(dir, "pgbouncer.ini")
	users := filepath.Join(dir, "userlist.txt")
	logf := filepath.Join(dir, "pgbouncer.log")
	if err := os.WriteFile(users, []byte(`"postgres" "`+strings.ReplaceAll(cfg.Password, `"`, `""`)+`"`+"\n"), 0o600); err != nil {
		return fail(fmt.Errorf("pgtest: %w", err))
	}
	if cred != nil {
		// The password file is readable by PgBouncer's user alone.
		if err := os.Chown(users, int(cred.Uid), int(cred.Gid)); err != nil {
			return fail(fmt.Errorf("pgtest: %w", err))
		}
	}
	conf := fmt.Sprintf(pgbouncerIni, cfg.ServerPort, port, users, cfg.PoolMode, cfg.PoolSize, logf)
	if err := os.WriteFile(ini, []byte(conf), 0o644); err != nil {
		return fail(fmt.Errorf("pgtest: %w", err))
	}
	b.cmd = exec.Command(bin, ini)
	b.cmd.Dir = dir
	b.cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred, Setpgid: true}
	sysproc.SetParentDeathSignal(b.cmd.SysProcAttr, syscall.SIGKILL)
	started := make(chan error, 1)
	go func() {
		// The parent-death signal is tied to the creating thread.
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		if err := b.cmd.Start(); err != nil {
			started <- err
			close(b.done)
			return
		}
		started <- nil
		_ = b.cmd.Wait()
		close(b.done)
	}()
	if err := <-started; err != nil {
		return fail(fmt.Errorf("pgtest: start pgbouncer: %w", err))
	}
	for {
		c, err := net.DialTimeout("tcp", b.Addr(), time.Second)
		if err == nil {
			_ = c.Close()
			return b, nil
		}
		select {
		case <-b.done:
			log, _ := os.ReadFile(logf)
			_ = os.RemoveAll(dir)
			return nil, fmt.Errorf("pgtest: pgbouncer exited during start-up:\n%s", log)
		case <-ctx.Done():
			b.Close()
			return nil, ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

func freeLoopbackPort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("pgtest: find a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// Addr returns PgBouncer's host:port.
func (b *PgBouncer) Addr() string { return "127.0.0.1:" + strconv.Itoa(b.Port) }

// URL returns a connection URL for database through PgBouncer. It sets
// pgx's exec mode to one that needs no named prepared statements, which a
// transaction pool cannot keep.
func (b *PgBouncer) URL(database string) string {
	u := url.URL{Scheme: "postgres", User: url.UserPassword("postgres", b.password), Host: b.Addr(), Path: "/" + database,
		RawQuery: "sslmode=disable&default_query_exec_mode=exec"}
	return u.String()
}

// Log returns PgBouncer's log.
func (b *PgBouncer) Log() string {
	log, _ := os.ReadFile(filepath.Join(b.dir, "pgbouncer.log"))
	return string(log)
}

// Close stops PgBouncer (SIGINT, then SIGKILL after 5s) and removes its
// directory.
func (b *PgBouncer) Close() {
	_ = b.cmd.Process.Signal(syscall.SIGINT)
	select {
	case <-b.done:
	case <-time.After(5 * time.Second):
		_ = b.cmd.Process.Kill()
		<-b.done
	}
	_ = os.RemoveAll(b.dir)
}
