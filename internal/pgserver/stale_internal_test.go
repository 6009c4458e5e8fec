package pgserver

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// victim is a process this test started and stopped (SIGSTOP), named
// "postgres" in /proc/PID/comm (it is sleep run through a symbolic link of
// that name), so it passes the old rule's name check. A stopped process
// takes no signal off its queue but SIGKILL and SIGCONT, so any other
// signal sent to it stays pending, where /proc shows it at once; SIGKILL
// or SIGCONT would change its state from T. Whether it was signalled is
// thus read without waiting for anything.
type victim struct {
	cmd *exec.Cmd
}

func startVictim(t *testing.T) *victim {
	t.Helper()
	sleep, err := exec.LookPath("sleep")
	require.NoError(t, err)
	link := filepath.Join(t.TempDir(), "postgres")
	require.NoError(t, os.Symlink(sleep, link))
	cmd := exec.Command(link, "600")
	require.NoError(t, cmd.Start())
	v := &victim{cmd: cmd}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	comm, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", v.pid()))
	require.NoError(t, err)
	require.Equal(t, "postgres", strings.TrimSpace(string(comm)))
	require.NoError(t, cmd.Process.Signal(syscall.SIGSTOP))
	require.Eventually(t, func() bool { s, _ := v.status(t); return s == "T" }, time.Minute, time.Millisecond,
		"the victim stops")
	return v
}

func (v *victim) pid() int { return v.cmd.Process.Pid }

// status returns the victim's state letter and its pending signals, as
// /proc/PID/status shows them (the thread's and the process's, ORed).
func (v *victim) status(t *testing.T) (state string, pending uint64) {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", v.pid()))
	require.NoError(t, err)
	for _, line := range strings.Split(string(b), "\n") {
		k, val, _ := strings.Cut(line, ":")
		val = strings.TrimSpace(val)
		switch k {
		case "State":
			state = val[:1]
		case "SigPnd", "ShdPnd":
			n, err := strconv.ParseUint(val, 16, 64)
			require.NoError(t, err)
			pending |= n
		}
	}
	return state, pending
}

// requireUnsignalled checks that no signal reached the victim.
func (v *victim) requireUnsignalled(t *testing.T) {
	t.Helper()
	state, pending := v.status(t)
	require.Equal(t, "T", state, "still stopped: no SIGKILL or SIGCONT")
	require.Zero(t, pending, "no signal pending")
}

// deadPid returns the pid of a process that has exited.
func deadPid(t *testing.T) int {
	t.Helper()
	cmd := exec.Command("true")
	require.NoError(t, cmd.Run())
	return cmd.Process.Pid
}

// oldRuleWouldSignal is the rule pgtest used before pgserver, kept here as
// the negative control: a directory under the prefix whose owner.pid names
// a dead process, and whose data/postmaster.pid names a process called
// postgres*, got that process SIGQUIT. It returns that pid, or 0.
func oldRuleWouldSignal(dir string) int {
	b, err := os.ReadFile(filepath.Join(dir, "owner.pid"))
	if err != nil {
		return 0
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 0 || !errors.Is(syscall.Kill(pid, 0), syscall.ESRCH) {
		return 0
	}
	pm, err := os.ReadFile(filepath.Join(dir, "data", "postmaster.pid"))
	if err != nil {
		return 0
	}
	first, _, _ := strings.Cut(string(pm), "\n")
	spid, err := strconv.Atoi(strings.TrimSpace(first))
	if err != nil || spid <= 0 {
		return 0
	}
	comm, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", spid))
	if err != nil || !strings.HasPrefix(strings.TrimSpace(string(comm)), "postgres") {
		return 0
	}
	return spid
}

// plant writes a leftover cluster directory into parent: our marker format
// with a dead creator, a dead owner.pid (the old layout), and a
// postmaster.pid naming pid.
func plant(t *testing.T, parent string, pid int) string {
	t.Helper()
	dir, err := os.MkdirTemp(parent, DirPrefix+"*")
	require.NoError(t, err)
	dead := deadPid(t)
	require.NoError(t, os.WriteFile(filepath.Join(dir, markerFile),
		[]byte(fmt.Sprintf("%s\nid 00\nowner %d\n", markerMagic, dead)), 0o600))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "owner.pid"), []byte(strconv.Itoa(dead)), 0o644))
	require.NoError(t, os.Mkdir(filepath.Join(dir, "data"), 0o700))
	if pid > 0 {
		require.NoError(t, os.WriteFile(filepath.Join(dir, "data", "postmaster.pid"),
			[]byte(fmt.Sprintf("%d\n%s\n", pid, filepath.Join(dir, "data"))), 0o600))
	}
	return dir
}

func chownTree(t *testing.T, dir string, uid, gid int) {
	t.Helper()
	require.NoError(t, filepath.Walk(dir, func(p string, _ os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		return os.Lchown(p, uid, gid)
	}))
}

// A directory another user planted, naming a live process this test
// started, is left alone: the process gets no signal and the directory
// stays. The old rule would have sent that process SIGQUIT.
func TestRemoveStaleDirsLeavesAnotherUsersDirectoryAlone(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("this test plants a directory owned by another user (nobody): run it as root, as CI does")
	}
	nobody, err := user.Lookup("nobody")
	require.NoError(t, err)
	uid, _ := strconv.Atoi(nobody.Uid)
	gid, _ := strconv.Atoi(nobody.Gid)

	parent := t.TempDir()
	v := startVictim(t)
	dir := plant(t, parent, v.pid())
	chownTree(t, dir, uid, gid)

	require.Equal(t, v.pid(), oldRuleWouldSignal(dir), "negative control: the old rule signals this process")
	require.Error(t, staleDir(dir, serverUIDForTest(t)))

	removeStaleDirs(parent)

	require.DirExists(t, dir, "another user's directory is not removed")
	v.requireUnsignalled(t)
}

// The check detects a signal: the old rule's action, applied to the same
// kind of planted directory, leaves SIGQUIT pending on the victim.
func TestVictimShowsTheOldRulesSignal(t *testing.T) {
	t.Parallel()
	v := startVictim(t)
	dir := plant(t, t.TempDir(), v.pid())
	pid := oldRuleWouldSignal(dir)
	require.Equal(t, v.pid(), pid)
	require.NoError(t, syscall.Kill(pid, syscall.SIGQUIT)) // what the old code did
	state, pending := v.status(t)
	require.Equal(t, "T", state)
	require.Equal(t, uint64(1)<<(syscall.SIGQUIT-1), pending, "SIGQUIT is pending")
}

func serverUIDForTest(t *testing.T) int {
	t.Helper()
	cred, err := serverCredential()
	require.NoError(t, err)
	return serverUID(cred)
}

// Our own leftover directory is removed once its creator and its server
// are gone; one whose postmaster.pid names a live process is left alone,
// and that process gets no signal.
func TestRemoveStaleDirsOwnLeftovers(t *testing.T) {
	parent := t.TempDir()
	gone := plant(t, parent, deadPid(t))
	running := startVictim(t)
	live := plant(t, parent, running.pid())
	uid := os.Geteuid()
	for _, d := range []string{gone, live} {
		// As the server's user would own them (plant writes the marker as
		// this process's user, as makeDir does).
		st, err := os.Stat(d)
		require.NoError(t, err)
		require.Equal(t, uid, int(st.Sys().(*syscall.Stat_t).Uid))
	}
	cred, err := serverCredential()
	require.NoError(t, err)
	if cred != nil {
		for _, d := range []string{gone, live} {
			require.NoError(t, os.Chown(d, int(cred.Uid), int(cred.Gid)))
		}
	}

	removeStaleDirs(parent)

	require.NoDirExists(t, gone, "a leftover whose creator and server are gone is removed")
	require.DirExists(t, live, "a leftover with a live postmaster.pid is left alone")
	running.requireUnsignalled(t)
}

func TestStaleDirPredicate(t *testing.T) {
	t.Parallel()
	uid := os.Geteuid()
	tests := []struct {
		name    string
		prepare func(t *testing.T, dir string) string // returns the path to judge
		want    string                                // "" = stale (removable)
	}{
		{"proven own leftover", func(t *testing.T, dir string) string { return dir }, ""},
		{"mode 0755", func(t *testing.T, dir string) string {
			require.NoError(t, os.Chmod(dir, 0o755))
			return dir
		}, "not 0700"},
		{"owned by another uid", func(t *testing.T, dir string) string { return dir }, "owned by uid"},
		{"no marker", func(t *testing.T, dir string) string {
			require.NoError(t, os.Remove(filepath.Join(dir, markerFile)))
			return dir
		}, "no such file"},
		{"marker readable by others", func(t *testing.T, dir string) string {
			require.NoError(t, os.Chmod(filepath.Join(dir, markerFile), 0o644))
			return dir
		}, "not 0600"},
		{"marker hard-linked", func(t *testing.T, dir string) string {
			require.NoError(t, os.Link(filepath.Join(dir, markerFile), filepath.Join(dir, "other")))
			return dir
		}, "more than one link"},
		{"marker in another format", func(t *testing.T, dir string) string {
			require.NoError(t, os.WriteFile(filepath.Join(dir, markerFile), []byte("owner 1\n"), 0o600))
			return dir
		}, "format"},
		{"creator still running", func(t *testing.T, dir string) string {
			require.NoError(t, os.WriteFile(filepath.Join(dir, markerFile),
				[]byte(fmt.Sprintf("%s\nid 00\nowner %d\n", markerMagic, os.Getpid())), 0o600))
			return dir
		}, "still running"},
		{"symbolic link to a leftover", func(t *testing.T, dir string) string {
			link := dir + "-link"
			require.NoError(t, os.Symlink(dir, link))
			return link
		}, "not a directory"},
		{"postmaster.pid names a live process", func(t *testing.T, dir string) string {
			require.NoError(t, os.WriteFile(filepath.Join(dir, "data", "postmaster.pid"),
				[]byte(strconv.Itoa(os.Getpid())+"\n"), 0o600))
			return dir
		}, "which is running"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			dir := plant(t, t.TempDir(), 0)
			path := tt.prepare(t, dir)
			judgeUID := uid
			if tt.name == "owned by another uid" {
				judgeUID = uid + 1
			}
			err := staleDir(path, judgeUID)
			if tt.want == "" {
				require.NoError(t, err)
				return
			}
			require.ErrorContains(t, err, tt.want)
		})
	}
}

// makeDir's directory passes the checks as soon as its creator is gone:
// mode 0700, the marker owned by this user.
func TestMakeDir(t *testing.T) {
	t.Parallel()
	dir, err := makeDir(t.TempDir(), nil)
	require.NoError(t, err)
	st, err := os.Stat(dir)
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o700), st.Mode().Perm())
	require.ErrorContains(t, staleDir(dir, os.Geteuid()), "still running", "this process made it and is running")
	b, err := os.ReadFile(filepath.Join(dir, markerFile))
	require.NoError(t, err)
	require.Regexp(t, `^pgfence-pgserver 1\nid [0-9a-f]{32}\nowner `+strconv.Itoa(os.Getpid())+`\n$`, string(b))
}
