package supervise_test

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/pgfence/pgfence/cmd/pgfence/internal/supervise"
)

// helperEnv makes the test binary act as a supervised command that reports
// the signals it receives: "parent" also starts a "child" in its process
// group; each prints "<role> ready", then "<role> got <signal>" and exits.
const helperEnv = "SUPERVISE_TEST_HELPER"

func TestMain(m *testing.M) {
	if role := os.Getenv(helperEnv); role != "" {
		os.Exit(helper(role))
	}
	goleak.VerifyTestMain(m)
}

func helper(role string) int {
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
	var child *exec.Cmd
	if role == "parent" {
		child = exec.Command(os.Args[0])
		child.Env = append(os.Environ(), helperEnv+"=child")
		child.Stdout = os.Stdout
		if err := child.Start(); err != nil {
			fmt.Println("parent error", err)
			return 1
		}
	}
	fmt.Println(role, "ready")
	sig := <-sigs
	fmt.Println(role, "got", sig)
	if child != nil {
		if err := child.Wait(); child.ProcessState == nil || child.ProcessState.ExitCode() != 42 {
			fmt.Println("parent error: child:", err)
			return 1
		}
	}
	return 42
}

// pipe returns the read end as a line reader and the write end for the
// command's stdout; the test's copy of the write end is closed once the
// command has started, so reads end when the command's group closes it.
func pipe(t *testing.T) (*bufio.Reader, *os.File) {
	t.Helper()
	r, w, err := os.Pipe()
	require.NoError(t, err)
	t.Cleanup(func() { _ = r.Close(); _ = w.Close() })
	return bufio.NewReader(r), w
}

func readLine(t *testing.T, r *bufio.Reader) string {
	t.Helper()
	line, err := r.ReadString('\n')
	require.NoError(t, err)
	return strings.TrimSuffix(line, "\n")
}

// gone reports whether pid no longer runs: it does not exist or is a zombie
// waiting to be reaped by its new parent.
func gone(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return true
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i < 0 || i+2 >= len(s) || s[i+2] == 'Z' || s[i+2] == 'X'
}

func sh(script string, stdout *os.File) *supervise.Config {
	return &supervise.Config{Path: "sh", Args: []string{"-c", script}, Stdout: stdout}
}

func TestExitStatusIsTheCommands(t *testing.T) {
	t.Parallel()
	tests := []struct {
		script string
		want   supervise.Exit
		status int
	}{
		{"exit 0", supervise.Exit{Code: 0}, 0},
		{"exit 7", supervise.Exit{Code: 7}, 7},
		{"kill -TERM $$", supervise.Exit{Code: -1, Signal: syscall.SIGTERM}, 143},
		{"kill -KILL $$", supervise.Exit{Code: -1, Signal: syscall.SIGKILL}, 137},
	}
	for _, tt := range tests {
		t.Run(tt.script, func(t *testing.T) {
			t.Parallel()
			res, err := supervise.Run(sh(tt.script, nil), nil)
			require.NoError(t, err)
			require.False(t, res.Lost)
			require.Equal(t, tt.want, res.Exit)
			require.Equal(t, tt.status, res.Exit.Status())
		})
	}
}

func TestExitString(t *testing.T) {
	t.Parallel()
	require.Equal(t, "exit status 3", supervise.Exit{Code: 3}.String())
	require.Equal(t, "killed by signal 15 (terminated)", supervise.Exit{Code: -1, Signal: syscall.SIGTERM}.String())
}

func TestStartErrors(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	notExec := filepath.Join(dir, "script")
	require.NoError(t, os.WriteFile(notExec, []byte("#!/bin/sh\nexit 0\n"), 0o644))

	_, err := supervise.Run(&supervise.Config{Path: "pgfence-no-such-command-here"}, nil)
	require.ErrorIs(t, err, supervise.ErrNotFound)
	_, err = supervise.Run(&supervise.Config{Path: filepath.Join(dir, "missing")}, nil)
	require.ErrorIs(t, err, supervise.ErrNotFound)
	_, err = supervise.Run(&supervise.Config{Path: notExec}, nil)
	require.ErrorIs(t, err, supervise.ErrNotExecutable)
	_, err = supervise.Run(&supervise.Config{}, nil)
	require.Error(t, err)
	_, err = supervise.Run(nil, nil)
	require.Error(t, err)
}

func TestEnvironmentAndOwnProcessGroup(t *testing.T) {
	t.Parallel()
	out, w := pipe(t)
	stdin, release, err := os.Pipe()
	require.NoError(t, err)
	defer stdin.Close()
	p, err := supervise.Start(&supervise.Config{
		Path:   "sh",
		Args:   []string{"-c", `echo "$PGFENCE_LEASE $PGFENCE_TOKEN"; read x; exit 0`},
		Env:    []string{"PGFENCE_LEASE=nightly", "PGFENCE_TOKEN=42", "PATH=" + os.Getenv("PATH")},
		Stdout: w,
		Stdin:  stdin,
	})
	require.NoError(t, err)
	defer func() { _ = release.Close() }()
	require.Equal(t, "nightly 42", readLine(t, out))
	pgid, err := syscall.Getpgid(p.Pid())
	require.NoError(t, err)
	require.Equal(t, p.Pid(), pgid, "the command leads its own process group")
	require.NotEqual(t, syscall.Getpgrp(), pgid)
	require.NoError(t, release.Close())
	exit, err := p.Wait()
	require.NoError(t, err)
	require.Equal(t, 0, exit.Status())
}

func TestSignalsAreForwardedToTheGroup(t *testing.T) {
	t.Parallel()
	self, err := os.Executable()
	require.NoError(t, err)
	for _, sig := range []syscall.Signal{syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP} {
		t.Run(sig.String(), func(t *testing.T) {
			t.Parallel()
			out, w := pipe(t)
			sigs := make(chan os.Signal, 1)
			var res supervise.Result
			var runErr error
			resc := make(chan struct{})
			go func() {
				defer close(resc)
				res, runErr = supervise.Run(&supervise.Config{
					Path:   self,
					Env:    append(os.Environ(), helperEnv+"=parent"),
					Stdout: w,
				}, &supervise.RunOpts{Signals: sigs})
			}()
			ready := map[string]bool{readLine(t, out): true, readLine(t, out): true}
			require.Equal(t, map[string]bool{"parent ready": true, "child ready": true}, ready)
			sigs <- sig
			got := map[string]bool{readLine(t, out): true, readLine(t, out): true}
			require.Equal(t, map[string]bool{"parent got " + sig.String(): true, "child got " + sig.String(): true}, got,
				"the signal reached both processes of the group")
			<-resc
			require.NoError(t, runErr)
			require.False(t, res.Lost)
			require.Equal(t, supervise.Exit{Code: 42}, res.Exit)
		})
	}
}

func TestLostTerminatesTheGroup(t *testing.T) {
	t.Parallel()
	out, w := pipe(t)
	// The command stops on SIGTERM, but a process it started ignores it.
	script := `(trap '' TERM; exec sleep 60) & echo $!; trap 'exit 0' TERM; sleep 60 & echo $!; wait`
	lost := make(chan struct{})
	var res supervise.Result
	var runErr error
	resc := make(chan struct{})
	go func() {
		defer close(resc)
		res, runErr = supervise.Run(sh(script, w), &supervise.RunOpts{Lost: lost, Grace: 200 * time.Millisecond})
	}()
	stubborn, err := strconv.Atoi(readLine(t, out))
	require.NoError(t, err)
	polite, err := strconv.Atoi(readLine(t, out))
	require.NoError(t, err)
	close(lost)
	<-resc
	require.NoError(t, runErr)
	require.True(t, res.Lost)
	require.Equal(t, supervise.Exit{Code: 0}, res.Exit, "the leader exited on SIGTERM")
	require.True(t, gone(polite))
	// SIGKILL was sent before Run returned; the kernel finishes it.
	require.Eventually(t, func() bool { return gone(stubborn) }, 10*time.Second, 10*time.Millisecond)
}

func TestLostKillsACommandIgnoringSIGTERM(t *testing.T) {
	t.Parallel()
	out, w := pipe(t)
	lost := make(chan struct{})
	var res supervise.Result
	var runErr error
	resc := make(chan struct{})
	go func() {
		defer close(resc)
		res, runErr = supervise.Run(sh(`trap '' TERM; echo ready; while :; do sleep 1; done`, w),
			&supervise.RunOpts{Lost: lost, Grace: 100 * time.Millisecond})
	}()
	require.Equal(t, "ready", readLine(t, out))
	close(lost)
	<-resc
	require.NoError(t, runErr)
	require.True(t, res.Lost)
	require.Equal(t, supervise.Exit{Code: -1, Signal: syscall.SIGKILL}, res.Exit)
	require.Equal(t, 137, res.Exit.Status())
}

func TestLeftoverProcessesAreEndedOnExit(t *testing.T) {
	t.Parallel()
	out, w := pipe(t)
	// The leader exits at once, leaving a process that ignores SIGTERM.
	res, err := supervise.Run(sh(`(trap '' TERM; exec sleep 60) & echo $!; exit 3`, w),
		&supervise.RunOpts{Grace: 50 * time.Millisecond})
	require.NoError(t, err)
	require.False(t, res.Lost)
	require.Equal(t, supervise.Exit{Code: 3}, res.Exit)
	pid, err := strconv.Atoi(readLine(t, out))
	require.NoError(t, err)
	require.Eventually(t, func() bool { return gone(pid) }, 10*time.Second, 10*time.Millisecond)
}
