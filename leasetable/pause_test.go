package leasetable_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence"
	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/leasetable"
)

// pauseChildEnv, when set to a database URL, makes the test binary run
// pauseChild instead of the tests.
const pauseChildEnv = "PGFENCE_LEASETABLE_PAUSE_CHILD_URL"

// pauseChild is the child process of TestPausedHolderLearnsItLost: it takes
// a lease, reports its token, and reports how it learned of the loss.
func pauseChild() int {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	pool, err := pgxpool.New(ctx, os.Getenv(pauseChildEnv))
	if err != nil {
		fmt.Println("error", err)
		return 1
	}
	defer pool.Close()
	k, err := leasetable.New(ctx, pool, &leasetable.Config{TTL: time.Second, Owner: "paused-child"})
	if err != nil {
		fmt.Println("error", err)
		return 1
	}
	defer k.Close()
	l, err := k.TryAcquire(ctx, "paused", nil)
	if err != nil {
		fmt.Println("error", err)
		return 1
	}
	fmt.Printf("acquired %d\n", l.Token())
	select {
	case <-l.Done():
	case <-ctx.Done():
		fmt.Println("error: never learned it lost the lease")
		return 1
	}
	fmt.Printf("lost %d %v\n", l.Token(), errors.Is(l.Err(), pgfence.ErrLeaseLost))
	fmt.Printf("release-not-held %v\n", errors.Is(l.Release(ctx), pgfence.ErrNotHeld))
	return 0
}

// TestPausedHolderLearnsItLost stops a holder process (SIGSTOP) past its
// TTL, lets another Locker take the lease, and resumes it: the paused holder
// must learn that it lost the lease, and its token must be older than the
// new holder's, so fencing rejects its late writes.
func TestPausedHolderLearnsItLost(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	db := pgtest.NewDB(t)
	other := newLocker(t, db.Pool, nil)

	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), pauseChildEnv+"="+db.URL)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGCONT)
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	lines := bufio.NewScanner(out)
	next := func() []string {
		t.Helper()
		require.True(t, lines.Scan(), "child output ended: %v", lines.Err())
		return strings.Fields(lines.Text())
	}

	got := next()
	require.Equal(t, "acquired", got[0], "child said %q", got)
	childToken, err := strconv.ParseInt(got[1], 10, 64)
	require.NoError(t, err)
	// Negative control: while the child runs, the lease is really held.
	_, err = other.TryAcquire(ctx, "paused", nil)
	require.ErrorIs(t, err, pgfence.ErrNotAcquired)

	require.NoError(t, cmd.Process.Signal(syscall.SIGSTOP))
	// The child cannot renew; the lease expires and another Locker takes it.
	l, err := other.Acquire(ctx, "paused", nil)
	require.NoError(t, err)
	require.NoError(t, cmd.Process.Signal(syscall.SIGCONT))

	require.Equal(t, []string{"lost", got[1], "true"}, next())
	require.Equal(t, []string{"release-not-held", "true"}, next())
	require.Less(t, childToken, l.Token())
	require.NoError(t, cmd.Wait())
	// The child's Release left the new holder alone.
	info, ok, err := other.Get(ctx, "paused")
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, l.Token(), info.Token)
	require.NoError(t, l.Release(ctx))
}
