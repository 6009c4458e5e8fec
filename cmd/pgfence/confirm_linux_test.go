package main_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/pgfence/pgfence/internal/pgtest"
)

// openPTY opens a pseudo-terminal pair: the controlling side and the
// terminal a program reads from.
func openPTY(t *testing.T) (ptmx, tty *os.File) {
	t.Helper()
	ptmx, err := os.OpenFile("/dev/ptmx", os.O_RDWR|syscall.O_NOCTTY, 0)
	require.NoError(t, err)
	t.Cleanup(func() { _ = ptmx.Close() })
	require.NoError(t, unix.IoctlSetPointerInt(int(ptmx.Fd()), unix.TIOCSPTLCK, 0))
	n, err := unix.IoctlGetInt(int(ptmx.Fd()), unix.TIOCGPTN)
	require.NoError(t, err)
	tty, err = os.OpenFile(fmt.Sprintf("/dev/pts/%d", n), os.O_RDWR|syscall.O_NOCTTY, 0)
	require.NoError(t, err)
	t.Cleanup(func() { _ = tty.Close() })
	return ptmx, tty
}

// pgfenceOnTerminal runs the binary with its standard input on a terminal
// on which answer has been typed.
func pgfenceOnTerminal(t *testing.T, env []string, answer string, args ...string) result {
	t.Helper()
	ptmx, tty := openPTY(t)
	_, err := ptmx.WriteString(answer)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = append(cleanEnv(), env...)
	cmd.Stdin = tty
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	_ = cmd.Run()
	require.NotNil(t, cmd.ProcessState)
	return result{code: cmd.ProcessState.ExitCode(), stdout: stdout.String(), stderr: stderr.String()}
}

func TestReleaseAsksOnATerminal(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDB(t)
	env := dbEnv(db)
	token := insertLease(t, db, "account:42", "worker-1", "30 seconds")
	fenceOf := func() int64 {
		var f int64
		require.NoError(t, db.Pool.QueryRow(context.Background(),
			"SELECT fence FROM pgfence.pgfence_leases WHERE name = 'account:42'").Scan(&f))
		return f
	}

	r := pgfenceOnTerminal(t, env, "n\n", "release", "--force", "account:42")
	require.Equal(t, 1, r.code)
	require.Contains(t, r.stderr, `Lease "account:42" is held by "worker-1" with token `)
	require.Contains(t, r.stderr, "Force-release it? Its holder will be fenced out. [y/N]")
	require.Contains(t, r.stderr, "aborted; nothing was changed")
	require.Equal(t, token, fenceOf())

	r = pgfenceOnTerminal(t, env, "y\n", "release", "--force", "account:42")
	require.Equal(t, 0, r.code, r.stderr)
	require.Greater(t, fenceOf(), token)
}

func TestMigrateDownAsksOnATerminal(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDB(t)
	env := dbEnv(db)

	r := pgfenceOnTerminal(t, env, "\n", "migrate", "down")
	require.Equal(t, 1, r.code)
	require.Contains(t, r.stderr, "fencing tokens restart from 1. [y/N]")
	require.True(t, tableExists(t, db, "pgfence.pgfence_leases"))

	r = pgfenceOnTerminal(t, env, "yes\n", "migrate", "down")
	require.Equal(t, 0, r.code, r.stderr)
	require.False(t, tableExists(t, db, "pgfence.pgfence_leases"))
}
