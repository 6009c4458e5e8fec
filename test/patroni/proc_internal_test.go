package patroni

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// postmasterPid is what decides which processes the harness may signal: it
// must accept only a postgres running on the given data directory.
func TestPostmasterPidRefusesOtherProcesses(t *testing.T) {
	t.Parallel()
	dataDir := t.TempDir()
	require.Zero(t, postmasterPid(dataDir), "no postmaster.pid")

	// A pid file naming a live process that is not a postgres on dataDir
	// (this test binary) is ignored.
	pidFile := filepath.Join(dataDir, "postmaster.pid")
	require.NoError(t, os.WriteFile(pidFile, []byte(fmt.Sprintf("%d\n%s\n", os.Getpid(), dataDir)), 0o600))
	require.Zero(t, postmasterPid(dataDir))

	require.NoError(t, os.WriteFile(pidFile, []byte("not a pid\n"), 0o600))
	require.Zero(t, postmasterPid(dataDir))
	require.NoError(t, os.WriteFile(pidFile, []byte("-1\n"), 0o600))
	require.Zero(t, postmasterPid(dataDir))

	pid, err := killPostmaster(dataDir, 0, 0)
	require.NoError(t, err)
	require.Zero(t, pid, "nothing signalled")
}

// The positive control: a process whose command line is a postgres on
// dataDir (here a shell named so, started by the test) is found and
// signalled.
func TestPostmasterPidFindsItsPostmaster(t *testing.T) {
	t.Parallel()
	dataDir := t.TempDir()
	// The shell waits reading a pipe that never delivers: no child of its
	// own is left behind when it is killed.
	r, w, err := os.Pipe()
	require.NoError(t, err)
	t.Cleanup(func() { _ = w.Close() })
	cmd := exec.Command("/bin/sh", "-c", "read x", "-D", dataDir)
	cmd.Args[0] = "postgres"
	cmd.Stdin = r
	require.NoError(t, cmd.Start())
	_ = r.Close()
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	t.Cleanup(func() { _ = cmd.Process.Kill(); <-done })
	require.NoError(t, os.WriteFile(filepath.Join(dataDir, "postmaster.pid"),
		[]byte(fmt.Sprintf("%d\n%s\n", cmd.Process.Pid, dataDir)), 0o600))

	// The child's command line is the test binary's until its exec: wait
	// for the exec, not for a fixed time.
	require.Eventually(t, func() bool { return postmasterPid(dataDir) == cmd.Process.Pid },
		10*time.Second, time.Millisecond, "the started postgres is found")
	pid, err := killPostmaster(dataDir, syscall.SIGKILL, 5*time.Second)
	require.NoError(t, err)
	require.Equal(t, cmd.Process.Pid, pid)
	<-done
}
