package pgtest

import (
	"context"
	"errors"
	"fmt"
	"net"
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

// ClusterOptions configures a throwaway cluster. The zero value is usable.
type ClusterOptions struct {
	// Settings are extra server settings, passed as -c name=value. They are
	// applied after the harness's defaults, so they can override them.
	Settings map[string]string
	// Env is added to the server's environment, e.g. LD_PRELOAD and
	// FAKETIME for libfaketime.
	Env []string
	// Port is the TCP port to listen on; 0 picks a free one.
	Port int
}

// Cluster is a PostgreSQL server run from the local server binaries in a
// temporary data directory, owned by the test binary. It exposes the controls
// that fault tests need: stop, crash, restart on the same data directory and
// port, and the postmaster's pid.
//
// The server dies with the test binary, even when that is killed: it is
// started with a parent-death signal (SIGQUIT, PostgreSQL's immediate
// shutdown), and the temporary directories of dead test binaries are removed
// by the next run.
type Cluster struct {
	BinDir  string // directory of initdb and postgres
	Dir     string // temporary directory holding data/ and postgres.log
	DataDir string // the data directory
	Port    int    // TCP port on 127.0.0.1

	opts ClusterOptions
	cred *syscall.Credential

	mu   sync.Mutex
	proc *serverProc
}

type serverProc struct {
	pid  int
	done chan struct{} // closed when the postmaster has exited
	err  error         // its exit status, valid after done
}

// Fast settings for a test server. fsync and full_page_writes are off: they
// only matter when the operating system crashes, which no test does; a
// crash of the server process (SIGKILL, SIGQUIT) keeps everything written
// to the kernel, so crash-recovery tests stay meaningful. synchronous_commit
// is left at its default (on) so commit semantics are the production ones.
var defaultSettings = map[string]string{
	"listen_addresses":                    "127.0.0.1",
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
}

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

const dirPrefix = "pgfence-pgtest-"

// StartCluster initialises a new cluster in a temporary directory and starts
// it. Call Destroy when done.
func StartCluster(ctx context.Context, binDir string, opts *ClusterOptions) (*Cluster, error) {
	if binDir == "" {
		return nil, errors.New("pgtest: no PostgreSQL server binaries (initdb, postgres) found")
	}
	removeStaleDirs()
	c := &Cluster{BinDir: binDir}
	if opts != nil {
		c.opts = *opts
	}
	cred, uid, gid, err := serverCredential()
	if err != nil {
		return nil, err
	}
	c.cred = cred

	dir, err := os.MkdirTemp("", dirPrefix+"*")
	if err != nil {
		return nil, fmt.Errorf("pgtest: %w", err)
	}
	c.Dir = dir
	c.DataDir = filepath.Join(dir, "data")
	if err := os.WriteFile(filepath.Join(dir, "owner.pid"), []byte(strconv.Itoa(os.Getpid())), 0o644); err != nil {
		c.Destroy()
		return nil, fmt.Errorf("pgtest: %w", err)
	}
	if uid >= 0 {
		if err := os.Chown(dir, uid, gid); err != nil {
			c.Destroy()
			return nil, fmt.Errorf("pgtest: chown %s: %w", dir, err)
		}
	}

	initdb := exec.CommandContext(ctx, filepath.Join(binDir, "initdb"),
		"-D", c.DataDir, "-U", "postgres", "-A", "trust", "-E", "UTF8",
		"--locale=C", "--no-sync", "--no-instructions")
	initdb.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	initdb.Dir = dir
	if out, err := initdb.CombinedOutput(); err != nil {
		c.Destroy()
		return nil, fmt.Errorf("pgtest: initdb: %w\n%s", err, out)
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

// serverCredential returns the credential to run the server with: none when
// not root; the postgres user's when root, since initdb and postgres refuse
// to run as root.
func serverCredential() (*syscall.Credential, int, int, error) {
	if os.Geteuid() != 0 {
		return nil, -1, -1, nil
	}
	u, err := user.Lookup("postgres")
	if err != nil {
		return nil, -1, -1, fmt.Errorf("pgtest: running as root, and there is no postgres user to run the server as: %w", err)
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, uid, gid, nil
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("pgtest: find a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// URL returns a connection URL for database on this cluster.
func (c *Cluster) URL(database string) string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/%s?sslmode=disable", c.Port, database)
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
// first. Start retries for a while when the previous server's processes are
// still exiting.
func (c *Cluster) Start(ctx context.Context) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.proc != nil {
		select {
		case <-c.proc.done:
		default:
			return errors.New("pgtest: server is already running")
		}
	}
	deadline := time.Now().Add(60 * time.Second)
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
		// Not ready: make sure it is gone before deciding what to do.
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

// spawn starts the postmaster from a goroutine locked to its OS thread, so
// the parent-death signal (which Linux ties to the creating thread) fires
// only when the test binary itself dies. The goroutine keeps the thread
// until the postmaster exits.
func (c *Cluster) spawn() (*serverProc, error) {
	args := []string{"-D", c.DataDir, "-p", strconv.Itoa(c.Port), "-k", c.Dir}
	settings := map[string]string{}
	for k, v := range defaultSettings {
		settings[k] = v
	}
	for k, v := range c.opts.Settings {
		settings[k] = v
	}
	keys := make([]string, 0, len(settings))
	for k := range settings {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		args = append(args, "-c", k+"="+settings[k])
	}

	logFile, err := os.OpenFile(filepath.Join(c.Dir, "postgres.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o666)
	if err != nil {
		return nil, fmt.Errorf("pgtest: %w", err)
	}
	cmd := exec.Command(filepath.Join(c.BinDir, "postgres"), args...)
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
			started <- fmt.Errorf("pgtest: start postgres: %w", err)
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
	connString := c.URL("postgres") + "&connect_timeout=2"
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
			return fmt.Errorf("pgtest: postgres exited during start-up: %v", p.err)
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("pgtest: postgres did not accept connections in time: %w", err)
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
		return fmt.Errorf("pgtest: Crash takes SIGQUIT or SIGKILL, not %v", sig)
	}
	return c.signal(sig)
}

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
		return fmt.Errorf("pgtest: signal postmaster: %w", err)
	}
	select {
	case <-p.done:
		return nil
	case <-time.After(60 * time.Second):
		_ = syscall.Kill(p.pid, syscall.SIGKILL)
		<-p.done
		return errors.New("pgtest: postmaster did not exit within 60s; killed")
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

// removeStaleDirs removes the temporary directories of clusters whose test
// binary is no longer running (it was killed before it could clean up; its
// server died with it through the parent-death signal).
func removeStaleDirs() {
	dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), dirPrefix+"*"))
	for _, d := range dirs {
		b, err := os.ReadFile(filepath.Join(d, "owner.pid"))
		if err != nil {
			continue
		}
		pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
		if err != nil || pid <= 0 {
			continue
		}
		if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
			if pm, err := os.ReadFile(filepath.Join(d, "data", "postmaster.pid")); err == nil {
				// A server that somehow outlived its owner: end it.
				first, _, _ := strings.Cut(string(pm), "\n")
				if spid, err := strconv.Atoi(strings.TrimSpace(first)); err == nil && spid > 0 {
					if isPostgres(spid) {
						_ = syscall.Kill(spid, syscall.SIGQUIT)
					}
				}
			}
			_ = os.RemoveAll(d)
		}
	}
}

func isPostgres(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
	return err == nil && strings.HasPrefix(strings.TrimSpace(string(b)), "postgres")
}
