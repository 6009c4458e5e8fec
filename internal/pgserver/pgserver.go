package pgserver

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgfence/pgfence/internal/sysproc"
)

// Options configures a throwaway cluster. The zero value is usable: a
// server on its private unix socket only.
type Options struct {
	// Settings are extra server settings, passed as -c name=value. They are
	// applied after the package's defaults, so they can override them, but
	// not the settings that decide who can connect (listen_addresses, port,
	// unix_socket_directories, unix_socket_permissions): use TCP and Port.
	Settings map[string]string
	// AutoConfSettings are server settings written to the data directory's
	// postgresql.auto.conf at initdb instead of the command line, so that
	// ALTER SYSTEM and a reload can change them while the server runs
	// (a setting on the command line outranks the configuration files).
	// They override the package's defaults and Settings, and are subject
	// to the same restriction on the access settings.
	AutoConfSettings map[string]string
	// Env is added to the server's environment, e.g. LD_PRELOAD and
	// FAKETIME for libfaketime.
	Env []string
	// TCP makes the server listen on 127.0.0.1 too, where it requires the
	// postgres role's password (scram-sha-256). Without it the server
	// listens only on its private unix socket.
	TCP bool
	// Port is the TCP port with TCP, else the number in the socket's file
	// name; 0 picks a free one.
	Port int
	// Password is the postgres role's password; empty means a random one.
	Password string
}

// Cluster is a PostgreSQL server run from the local server binaries in a
// temporary data directory, owned by this process. It exposes the controls
// that fault tests need: stop, crash, restart on the same data directory and
// port, and the postmaster's pid.
type Cluster struct {
	BinDir  string // directory of initdb and postgres
	Dir     string // private directory (0700) holding data/, postgres.log and the socket
	DataDir string // the data directory
	Port    int    // TCP port on 127.0.0.1 (with TCP), and the socket's number
	// TCP reports whether the server listens on 127.0.0.1.
	TCP bool
	// Password is the postgres role's password, required on TCP.
	Password string

	opts Options
	cred *syscall.Credential

	mu   sync.Mutex
	proc *serverProc
}

type serverProc struct {
	pid  int
	done chan struct{} // closed when the postmaster has exited
	err  error         // its exit status, valid after done
}

// Fast settings for a throwaway server. fsync and full_page_writes are off:
// they only matter when the operating system crashes; a crash of the server
// process (SIGKILL, SIGQUIT) keeps everything written to the kernel, so
// crash-recovery tests stay meaningful. synchronous_commit is left at its
// default (on) so commit semantics are the production ones.
var defaultSettings = map[string]string{
	"fsync":                               "off",
	"full_page_writes":                    "off",
	"max_connections":                     "400",
	"shared_buffers":                      "64MB",
	"max_wal_size":                        "1GB",
	"log_min_messages":                    "warning",
	"log_line_prefix":                     "%m [%p] %d ",
	"deadlock_timeout":                    "1s",
	"max_locks_per_transaction":           "256",
	"autovacuum_naptime":                  "10s",
	"idle_in_transaction_session_timeout": "0",
	"password_encryption":                 "scram-sha-256",
}

// accessSettings decide who can connect; Options.Settings may not set them.
var accessSettings = []string{"listen_addresses", "port", "unix_socket_directories", "unix_socket_permissions"}

// FindBinDir returns a directory holding initdb and postgres: from PG_BINDIR,
// from PATH, or the newest /usr/lib/postgresql/*/bin. It returns "" when none
// is found.
func FindBinDir() string {
	if d := os.Getenv("PG_BINDIR"); d != "" && hasServerBinaries(d) {
		return d
	}
	if p, err := exec.LookPath("postgres"); err == nil {
		if d := filepath.Dir(p); hasServerBinaries(d) {
			return d
		}
	}
	matches, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Slice(matches, func(i, j int) bool { return versionOf(matches[i]) > versionOf(matches[j]) })
	for _, d := range matches {
		if hasServerBinaries(d) {
			return d
		}
	}
	return ""
}

func versionOf(binDir string) int {
	v, _ := strconv.Atoi(filepath.Base(filepath.Dir(binDir)))
	return v
}

func hasServerBinaries(dir string) bool {
	for _, name := range []string{"initdb", "postgres"} {
		st, err := os.Stat(filepath.Join(dir, name))
		if err != nil || st.IsDir() || st.Mode()&0o111 == 0 {
			return false
		}
	}
	return true
}

// StartCluster initialises a new cluster in a private temporary directory
// and starts it; ctx bounds initdb and the start. Call Destroy when done.
func StartCluster(ctx context.Context, binDir string, opts *Options) (*Cluster, error) {
	if binDir == "" {
		return nil, errors.New("pgserver: no PostgreSQL server binaries (initdb, postgres) found")
	}
	c := &Cluster{BinDir: binDir}
	if opts != nil {
		c.opts = *opts
	}
	for _, k := range accessSettings {
		_, inAuto := c.opts.AutoConfSettings[k]
		if _, ok := c.opts.Settings[k]; ok || inAuto {
			return nil, fmt.Errorf("pgserver: Options.Settings and AutoConfSettings must not set %s: use Options.TCP and Options.Port", k)
		}
	}
	c.TCP = c.opts.TCP
	c.Password = c.opts.Password
	if c.Password == "" {
		var b [16]byte
		if _, err := rand.Read(b[:]); err != nil {
			return nil, fmt.Errorf("pgserver: %w", err)
		}
		c.Password = hex.EncodeToString(b[:])
	}
	cred, err := serverCredential()
	if err != nil {
		return nil, err
	}
	c.cred = cred
	removeStaleDirs(os.TempDir())

	if c.Dir, err = makeDir(os.TempDir(), cred); err != nil {
		return nil, err
	}
	c.DataDir = filepath.Join(c.Dir, "data")
	if err := c.initdb(ctx); err != nil {
		c.Destroy()
		return nil, err
	}

	c.Port = c.opts.Port
	for attempt := 0; ; attempt++ {
		if c.opts.Port == 0 {
			if c.Port, err = freePort(); err != nil {
				c.Destroy()
				return nil, err
			}
		}
		err = c.Start(ctx)
		if err == nil {
			return c, nil
		}
		if c.opts.Port != 0 || attempt >= 4 || !strings.Contains(err.Error(), "could not bind") {
			c.Destroy()
			return nil, err
		}
	}
}

// initdb creates the data directory: trust on the private socket only, the
// password (scram-sha-256) on TCP, for replication too.
func (c *Cluster) initdb(ctx context.Context) error {
	pwfile := filepath.Join(c.Dir, "pwfile")
	if err := writeOwned(pwfile, []byte(c.Password+"\n"), c.cred); err != nil {
		return err
	}
	defer os.Remove(pwfile)
	cmd := exec.CommandContext(ctx, filepath.Join(c.BinDir, "initdb"),
		"-D", c.DataDir, "-U", "postgres", "--pwfile", pwfile,
		"--auth-local=trust", "--auth-host=scram-sha-256", "-E", "UTF8",
		"--locale=C", "--no-sync", "--no-instructions")
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: c.cred}
	cmd.Dir = c.Dir
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("pgserver: initdb: %w\n%s", err, out)
	}
	keys := make([]string, 0, len(c.opts.AutoConfSettings))
	for k := range c.opts.AutoConfSettings {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		if err := appendConf(filepath.Join(c.DataDir, "postgresql.auto.conf"), k, c.opts.AutoConfSettings[k]); err != nil {
			return err
		}
	}
	return nil
}

// writeOwned writes a file readable only by the server's user.
func writeOwned(path string, b []byte, cred *syscall.Credential) error {
	if err := os.WriteFile(path, b, 0o600); err != nil {
		return fmt.Errorf("pgserver: %w", err)
	}
	if cred != nil {
		if err := os.Chown(path, int(cred.Uid), int(cred.Gid)); err != nil {
			return fmt.Errorf("pgserver: chown %s: %w", path, err)
		}
	}
	return nil
}

// serverCredential returns the credential to run the server with: none when
// not root; the postgres user's when root, since initdb and postgres refuse
// to run as root.
func serverCredential() (*syscall.Credential, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	u, err := user.Lookup("postgres")
	if err != nil {
		return nil, fmt.Errorf("pgserver: running as root, and there is no postgres user to run the server as: %w", err)
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, nil
}

// serverUID is the uid the server runs as.
func serverUID(cred *syscall.Credential) int {
	if cred == nil {
		return os.Geteuid()
	}
	return int(cred.Uid)
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("pgserver: find a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// URL returns a connection URL for database on this cluster: on 127.0.0.1
// with the password when the cluster listens on TCP, else on its socket.
func (c *Cluster) URL(database string) string {
	if !c.TCP {
		return c.SocketURL(database)
	}
	u := url.URL{
		Scheme:   "postgres",
		User:     url.UserPassword("postgres", c.Password),
		Host:     net.JoinHostPort("127.0.0.1", strconv.Itoa(c.Port)),
		Path:     "/" + database,
		RawQuery: "sslmode=disable",
	}
	return u.String()
}

// SocketURL returns a connection URL for database on this cluster's private
// unix socket, where no password is needed.
func (c *Cluster) SocketURL(database string) string {
	q := url.Values{"host": {c.Dir}, "port": {strconv.Itoa(c.Port)}, "sslmode": {"disable"}}
	u := url.URL{Scheme: "postgres", User: url.User("postgres"), Path: "/" + database, RawQuery: q.Encode()}
	return u.String()
}

// Pid returns the postmaster's pid, or 0 when the server is not running.
func (c *Cluster) Pid() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.proc == nil {
		return 0
	}
	select {
	case <-c.proc.done:
		return 0
	default:
		return c.proc.pid
	}
}

// Start starts the server on the cluster's data directory and port and waits
// until it accepts connections. After a crash the server runs recovery
// first. Start retries for a while (60s, or until ctx's deadline when it
// has a later one) when the previous server's processes are still exiting.
func (c *Cluster) Start(ctx context.Context) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.proc != nil {
		select {
		case <-c.proc.done:
		default:
			return errors.New("pgserver: server is already running")
		}
	}
	deadline := time.Now().Add(60 * time.Second)
	if d, ok := ctx.Deadline(); ok && d.After(deadline) {
		deadline = d // a recovery that fsyncs every file (through FUSE, say) may need longer
	}
	for {
		p, err := c.spawn()
		if err != nil {
			return err
		}
		err = c.waitReady(ctx, p, deadline)
		if err == nil {
			c.proc = p
			return nil
		}
		// Not ready: make sure it is gone before deciding what to do. p is
		// the process this call started.
		_ = syscall.Kill(p.pid, syscall.SIGQUIT)
		<-p.done
		log := c.logTail()
		if strings.Contains(log, "pre-existing shared memory block") && time.Now().Before(deadline) {
			// Backends of a crashed postmaster are still exiting.
			select {
			case <-time.After(100 * time.Millisecond):
				continue
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		return fmt.Errorf("%w\n--- postgres.log (tail) ---\n%s", err, log)
	}
}

// serverArgs returns the postmaster's arguments: the data directory, the
// settings, and the access settings last so nothing overrides them.
func (c *Cluster) serverArgs() []string {
	args := []string{"-D", c.DataDir}
	settings := map[string]string{}
	for k, v := range defaultSettings {
		settings[k] = v
	}
	for k, v := range c.opts.Settings {
		settings[k] = v
	}
	for k := range c.opts.AutoConfSettings {
		delete(settings, k) // from postgresql.auto.conf
	}
	keys := make([]string, 0, len(settings))
	for k := range settings {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		args = append(args, "-c", k+"="+settings[k])
	}
	listen := ""
	if c.TCP {
		listen = "127.0.0.1"
	}
	return append(args,
		"-c", "listen_addresses="+listen,
		"-c", "port="+strconv.Itoa(c.Port),
		"-c", "unix_socket_directories="+c.Dir,
		"-c", "unix_socket_permissions=0700")
}

// spawn starts the postmaster from a goroutine locked to its OS thread, so
// the parent-death signal (which Linux ties to the creating thread) fires
// only when this process itself dies. The goroutine keeps the thread until
// the postmaster exits.
func (c *Cluster) spawn() (*serverProc, error) {
	logFile, err := os.OpenFile(filepath.Join(c.Dir, "postgres.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, fmt.Errorf("pgserver: %w", err)
	}
	cmd := exec.Command(filepath.Join(c.BinDir, "postgres"), c.serverArgs()...)
	cmd.Stdout = logFile
	cmd.Stderr = logFile
	cmd.Dir = c.Dir
	cmd.Env = append(os.Environ(), c.opts.Env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Credential: c.cred,
		Setpgid:    true,
	}
	sysproc.SetParentDeathSignal(cmd.SysProcAttr, syscall.SIGQUIT)

	p := &serverProc{done: make(chan struct{})}
	started := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		defer logFile.Close()
		if err := cmd.Start(); err != nil {
			started <- fmt.Errorf("pgserver: start postgres: %w", err)
			close(p.done)
			return
		}
		p.pid = cmd.Process.Pid
		started <- nil
		p.err = cmd.Wait()
		close(p.done)
	}()
	if err := <-started; err != nil {
		return nil, err
	}
	return p, nil
}

func (c *Cluster) waitReady(ctx context.Context, p *serverProc, deadline time.Time) error {
	connString := c.SocketURL("postgres") + "&connect_timeout=2"
	for {
		cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		conn, err := pgconn.Connect(cctx, connString)
		cancel()
		if err == nil {
			_ = conn.Close(ctx)
			return nil
		}
		select {
		case <-p.done:
			return fmt.Errorf("pgserver: postgres exited during start-up: %v", p.err)
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("pgserver: postgres did not accept connections in time: %w", err)
		}
	}
}

// Stop shuts the server down cleanly (a fast shutdown: sessions are
// terminated, a checkpoint is written) and waits for it to exit.
func (c *Cluster) Stop() error {
	return c.signal(syscall.SIGINT)
}

// Crash kills the postmaster with sig, syscall.SIGQUIT (immediate shutdown,
// no checkpoint: the next start runs crash recovery) or syscall.SIGKILL (the
// postmaster dies at once and its backends exit when they notice), and waits
// for the postmaster to exit.
func (c *Cluster) Crash(sig syscall.Signal) error {
	if sig != syscall.SIGQUIT && sig != syscall.SIGKILL {
		return fmt.Errorf("pgserver: Crash takes SIGQUIT or SIGKILL, not %v", sig)
	}
	return c.signal(sig)
}

// signal signals the postmaster this Cluster started, if it still runs,
// and waits for it to exit. It signals no other process.
func (c *Cluster) signal(sig syscall.Signal) error {
	c.mu.Lock()
	p := c.proc
	c.mu.Unlock()
	if p == nil {
		return nil
	}
	select {
	case <-p.done:
		return nil
	default:
	}
	if err := syscall.Kill(p.pid, sig); err != nil && !errors.Is(err, syscall.ESRCH) {
		return fmt.Errorf("pgserver: signal postmaster: %w", err)
	}
	select {
	case <-p.done:
		return nil
	case <-time.After(60 * time.Second):
		_ = syscall.Kill(p.pid, syscall.SIGKILL)
		<-p.done
		return errors.New("pgserver: postmaster did not exit within 60s; killed")
	}
}

// Destroy stops the server (immediate shutdown) and removes its directory.
func (c *Cluster) Destroy() {
	_ = c.signal(syscall.SIGQUIT)
	if c.Dir != "" {
		_ = os.RemoveAll(c.Dir)
	}
}

// LogTail returns the last lines of the server log, for failure messages.
func (c *Cluster) LogTail() string { return c.logTail() }

func (c *Cluster) logTail() string {
	b, _ := os.ReadFile(filepath.Join(c.Dir, "postgres.log"))
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > 30 {
		lines = lines[len(lines)-30:]
	}
	return strings.Join(lines, "\n")
}

// DefaultSettings returns a copy of the settings every throwaway cluster
// runs with (before Options.Settings), for servers started another way
// that should behave the same, such as the test harness's containers.
func DefaultSettings() map[string]string {
	s := make(map[string]string, len(defaultSettings))
	for k, v := range defaultSettings {
		s[k] = v
	}
	return s
}
