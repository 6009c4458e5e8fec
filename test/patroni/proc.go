package patroni

import (
	"bytes"
	"errors"
	"fmt"
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

// proc is a child process this package started: etcd or one Patroni.
type proc struct {
	name string
	pid  int
	done chan struct{} // closed when the process has exited
	err  error         // its exit status, valid after done
}

// spawn starts argv as cred (nil: this process's user) with its output
// appended to logPath. It is started from a goroutine locked to its OS
// thread, which keeps the thread until the child exits, so the parent-death
// signal deathSig (which Linux ties to the creating thread) fires only when
// this process itself dies.
func spawn(name, dir, logPath string, cred *syscall.Credential, deathSig syscall.Signal, argv ...string) (*proc, error) {
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, fmt.Errorf("patroni: %w", err)
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdout = logFile
	cmd.Stderr = logFile
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "LC_ALL=C.UTF-8", "LANG=C.UTF-8")
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred, Setpgid: true}
	sysproc.SetParentDeathSignal(cmd.SysProcAttr, deathSig)

	p := &proc{name: name, done: make(chan struct{})}
	started := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		defer logFile.Close()
		if err := cmd.Start(); err != nil {
			started <- fmt.Errorf("patroni: start %s: %w", name, err)
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

// running reports whether the process has not exited yet.
func (p *proc) running() bool {
	if p == nil {
		return false
	}
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

// stop sends sig, waits up to grace for the exit, then sends SIGKILL and
// waits for it. It signals only this child, never a process group.
func (p *proc) stop(sig syscall.Signal, grace time.Duration) {
	if !p.running() {
		return
	}
	_ = syscall.Kill(p.pid, sig)
	select {
	case <-p.done:
		return
	case <-time.After(grace):
	}
	_ = syscall.Kill(p.pid, syscall.SIGKILL)
	<-p.done
}

// serverCredential is the credential Patroni (and through it PostgreSQL)
// runs as: the postgres user when this process is root, since initdb and
// postgres refuse to run as root; nil (this process's user) otherwise.
func serverCredential() (*syscall.Credential, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	u, err := user.Lookup("postgres")
	if err != nil {
		return nil, fmt.Errorf("patroni: running as root, and there is no postgres user to run Patroni as: %w", err)
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, nil
}

// postmasterPid returns the pid of the postmaster running on dataDir, or 0
// when none is. It reads data/postmaster.pid and accepts the pid only when
// that process runs the postgres binary with "-D dataDir" on its command
// line: the data directory is in this package's private temporary
// directory, so such a process was started by one of this Cluster's Patroni
// nodes (which detach their postmaster, so it is not a child of theirs). A
// stale pid file naming an unrelated process is ignored.
func postmasterPid(dataDir string) int {
	b, err := os.ReadFile(filepath.Join(dataDir, "postmaster.pid"))
	if err != nil {
		return 0
	}
	first, _, _ := strings.Cut(string(b), "\n")
	pid, err := strconv.Atoi(strings.TrimSpace(first))
	if err != nil || pid <= 0 {
		return 0
	}
	cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil {
		return 0
	}
	args := bytes.Split(bytes.TrimRight(cmdline, "\x00"), []byte{0})
	if len(args) < 3 || filepath.Base(string(args[0])) != "postgres" {
		return 0
	}
	for i := 1; i+1 < len(args); i++ {
		if string(args[i]) == "-D" && filepath.Clean(string(args[i+1])) == filepath.Clean(dataDir) {
			return pid
		}
	}
	return 0
}

// killPostmaster sends sig to the postmaster on dataDir (see postmasterPid)
// and waits up to wait for it to be gone. It returns the pid signalled, 0
// when none ran.
func killPostmaster(dataDir string, sig syscall.Signal, wait time.Duration) (int, error) {
	pid := postmasterPid(dataDir)
	if pid == 0 {
		return 0, nil
	}
	if err := syscall.Kill(pid, sig); err != nil && !errors.Is(err, syscall.ESRCH) {
		return pid, fmt.Errorf("patroni: signal postmaster %d: %w", pid, err)
	}
	deadline := time.Now().Add(wait)
	for time.Now().Before(deadline) {
		if postmasterPid(dataDir) != pid {
			return pid, nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	return pid, fmt.Errorf("patroni: postmaster %d on %s still running %v after %v", pid, dataDir, wait, sig)
}

// dirPrefix starts the name of every cluster directory, in os.TempDir().
const dirPrefix = "pgfence-patroni-"

// ownerFile, in a cluster directory, holds the pid of the process that
// created it, written as that process's user.
const ownerFile = "owner"

// removeStaleDirs removes the cluster directories that earlier processes
// left behind when they were killed before they could clean up (their
// Patroni nodes stop their PostgreSQL and exit through the parent-death
// signal). A directory is removed only when its owner file, written by this
// process's user, names a process that has exited, and no running process
// names the directory on its command line. It signals nothing.
func removeStaleDirs() {
	dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), dirPrefix+"*"))
	for _, d := range dirs {
		st, err := os.Lstat(filepath.Join(d, ownerFile))
		if err != nil || !st.Mode().IsRegular() || int(st.Sys().(*syscall.Stat_t).Uid) != os.Geteuid() {
			continue
		}
		b, err := os.ReadFile(filepath.Join(d, ownerFile))
		if err != nil {
			continue
		}
		pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
		if err != nil || pid <= 0 || alive(pid) || inUse(d) {
			continue
		}
		_ = os.RemoveAll(d)
	}
}

// alive reports whether a process with this pid exists.
func alive(pid int) bool {
	err := syscall.Kill(pid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}

// inUse reports whether a running process names dir on its command line.
func inUse(dir string) bool {
	cmdlines, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, f := range cmdlines {
		if b, err := os.ReadFile(f); err == nil && bytes.Contains(b, []byte(dir)) {
			return true
		}
	}
	return false
}
