package pgtest_test

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence/internal/pgtest"
)

func TestMain(m *testing.M) {
	if os.Getenv("PGTEST_CHILD") == "1" {
		childMain()
		return
	}
	pgtest.Main(m)
}

// childMain starts a cluster, prints its postmaster pid and waits to be
// killed; TestServerDiesWithTestBinary kills it.
func childMain() {
	c, err := pgtest.StartCluster(context.Background(), pgtest.FindBinDir(), nil)
	if err != nil {
		fmt.Println("error", err)
		os.Exit(1)
	}
	fmt.Println("pid", c.Pid(), c.Dir)
	time.Sleep(2 * time.Minute)
	c.Destroy()
	os.Exit(0)
}

func TestNewDBIsMigratedAndIsolated(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	a, b := pgtest.NewDB(t), pgtest.NewDB(t)
	require.NotEqual(t, a.Name, b.Name)
	for _, db := range []*pgtest.DB{a, b} {
		var n int
		require.NoError(t, db.Pool.QueryRow(ctx, "SELECT pg_catalog.count(*) FROM pgfence.pgfence_leases").Scan(&n))
		require.Zero(t, n)
	}
	_, err := a.Pool.Exec(ctx, "INSERT INTO pgfence.pgfence_leases (name, owner, expires_at) VALUES ('x', 'o', pg_catalog.now())")
	require.NoError(t, err)
	var n int
	require.NoError(t, b.Pool.QueryRow(ctx, "SELECT pg_catalog.count(*) FROM pgfence.pgfence_leases").Scan(&n))
	require.Zero(t, n, "databases must not share rows")
}

func TestServerSettings(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDB(t)
	var syncCommit string
	require.NoError(t, db.Pool.QueryRow(context.Background(), "SHOW synchronous_commit").Scan(&syncCommit))
	require.Equal(t, "on", syncCommit)
}

func TestClusterCrashAndRestart(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c, s := pgtest.NewCluster(t, nil)
	db := s.NewDB(t)
	_, err := db.Pool.Exec(ctx, "INSERT INTO pgfence.pgfence_leases (name, owner, expires_at) VALUES ('kept', 'o', pg_catalog.now())")
	require.NoError(t, err)
	port := c.Port

	for _, sig := range []syscall.Signal{syscall.SIGKILL, syscall.SIGQUIT} {
		pid := c.Pid()
		require.NotZero(t, pid)
		require.NoError(t, c.Crash(sig))
		require.Zero(t, c.Pid())
		require.NoError(t, c.Start(ctx))
		require.NotEqual(t, pid, c.Pid())
		require.Equal(t, port, c.Port)
	}
	require.NoError(t, c.Stop())
	require.NoError(t, c.Start(ctx))

	conn, err := pgx.Connect(ctx, db.URL)
	require.NoError(t, err)
	defer conn.Close(ctx)
	var n int
	require.NoError(t, conn.QueryRow(ctx, "SELECT pg_catalog.count(*) FROM pgfence.pgfence_leases WHERE name = 'kept'").Scan(&n))
	require.Equal(t, 1, n, "committed row must survive crashes")
	require.Error(t, c.Crash(syscall.SIGTERM))
}

// TestServerDiesWithTestBinary kills a test binary that owns a cluster and
// checks that its server goes away with it.
func TestServerDiesWithTestBinary(t *testing.T) {
	t.Parallel()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "PGTEST_CHILD=1")
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	line, err := bufio.NewReader(out).ReadString('\n')
	require.NoError(t, err, "child output")
	fields := strings.Fields(line)
	require.Equal(t, "pid", fields[0], line)
	pid, err := strconv.Atoi(fields[1])
	require.NoError(t, err)
	require.NoError(t, syscall.Kill(pid, 0), "server should be running")

	require.NoError(t, cmd.Process.Kill())
	_ = cmd.Wait()

	deadline := time.Now().Add(30 * time.Second)
	for syscall.Kill(pid, 0) == nil {
		if time.Now().After(deadline) {
			_ = syscall.Kill(pid, syscall.SIGKILL)
			t.Fatalf("postmaster %d outlived its test binary", pid)
		}
		time.Sleep(50 * time.Millisecond)
	}
	_ = os.RemoveAll(fields[2])
}
