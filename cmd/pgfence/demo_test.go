package main_test

import (
	"context"
	"os"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence/advisory"
	"github.com/pgfence/pgfence/internal/pgtest"
)

// requireStory checks the demo's output for the story's key events.
func requireStory(t *testing.T, r result) {
	t.Helper()
	require.Equal(t, 0, r.code, "stdout: %s\nstderr: %s", r.stdout, r.stderr)
	for _, want := range []string{
		"worker-A  worker-A #",
		"SIGSTOP worker-A (pid ",
		"state T (stopped)",
		"REJECTED (pgfence.ErrFenced)",
		"row: balance 150, fence_token ",
		"unfenced write accepted: balance 150 -> 110",
		"with fencing:    worker-A's stale write (token ",
		"without fencing: the same write was accepted; balance 150 -> 110: worker-B's +50 is lost",
	} {
		require.Contains(t, r.stdout, want)
	}
	m := regexp.MustCompile(`presented token (\d+), row has token (\d+)`).FindStringSubmatch(r.stdout)
	require.NotNil(t, m, r.stdout)
	presented, err := strconv.ParseInt(m[1], 10, 64)
	require.NoError(t, err)
	current, err := strconv.ParseInt(m[2], 10, 64)
	require.NoError(t, err)
	require.Less(t, presented, current, "the paused worker's token is older")
}

func schemaExists(t *testing.T, db *pgtest.DB) bool {
	t.Helper()
	var ok bool
	require.NoError(t, db.Pool.QueryRow(context.Background(),
		"SELECT pg_catalog.to_regnamespace('pgfence_demo') IS NOT NULL").Scan(&ok))
	return ok
}

func TestDemoOnAGivenDatabase(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDB(t)
	r := pgfence(t, nil, "", "demo", "--database", db.URL)
	requireStory(t, r)
	require.Contains(t, r.stdout, "using the database from --database")
	require.NotContains(t, r.stdout, db.URL, "the URL (and a password in it) is not printed")
	require.Contains(t, r.stdout, "cleaned up: dropped schema pgfence_demo")
	require.False(t, schemaExists(t, db), "the demo's schema is dropped")
	var held bool
	require.NoError(t, db.Pool.QueryRow(context.Background(),
		"SELECT pg_catalog.bool_or(expires_at > pg_catalog.now()) FROM pgfence.pgfence_leases WHERE name LIKE 'pgfence-demo:%'").Scan(&held))
	require.False(t, held, "the demo's lease is released (its row stays for pgfence prune)")

	// DATABASE_URL is used too.
	r = pgfence(t, dbEnv(db), "", "demo")
	requireStory(t, r)
	require.Contains(t, r.stdout, "using the database from DATABASE_URL")
}

// A second demo on a database where one is running stops at once, and
// touches nothing: no schema, no account reset, no lease row.
func TestDemoRefusesADatabaseWhereADemoRuns(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDB(t)
	running := db.Conn(t) // stands in for the running demo's session
	ctx := context.Background()
	key := advisory.Name("pgfence-demo").Int64()
	_, err := running.Exec(ctx, "SELECT pg_advisory_lock($1)", key)
	require.NoError(t, err)

	r := pgfence(t, nil, "", "demo", "--database", db.URL)
	require.Equal(t, 1, r.code, "stdout: %s\nstderr: %s", r.stdout, r.stderr)
	require.Contains(t, r.stderr, "another pgfence demo is running on this database")
	require.False(t, schemaExists(t, db), "nothing was created")
	require.NotContains(t, r.stdout, "cleaned up: dropped schema", "nothing was dropped")

	// Once the running demo ends, a demo plays out.
	_, err = running.Exec(ctx, "SELECT pg_advisory_unlock($1)", key)
	require.NoError(t, err)
	requireStory(t, pgfence(t, nil, "", "demo", "--database", db.URL))
}

func TestDemoStartsItsOwnDatabase(t *testing.T) {
	t.Parallel()
	r := pgfence(t, nil, "", "demo")
	requireStory(t, r)
	require.Contains(t, r.stdout, "no --database or DATABASE_URL: starting a throwaway PostgreSQL")
	require.Contains(t, r.stdout, "cleaned up: throwaway PostgreSQL stopped and removed")
}

func TestDemoCleansUpOnSIGINT(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDB(t)
	b := startPgfence(t, nil, "demo", "--database", db.URL)
	var pids []int
	for {
		line := b.line(t)
		if m := regexp.MustCompile(`started worker-A \(pid (\d+)\) and worker-B \(pid (\d+)\)`).FindStringSubmatch(line); m != nil {
			for _, s := range m[1:] {
				pid, err := strconv.Atoi(s)
				require.NoError(t, err)
				pids = append(pids, pid)
			}
		}
		if strings.Contains(line, "SIGSTOP worker-A") {
			break
		}
	}
	require.Len(t, pids, 2)
	require.True(t, schemaExists(t, db))
	require.NoError(t, b.cmd.Process.Signal(syscall.SIGINT))
	require.Equal(t, 130, b.wait(t), "128+SIGINT, as a shell reports Ctrl-C")
	require.Contains(t, b.stderr.String(), "pgfence demo: interrupted; cleaned up")
	require.False(t, schemaExists(t, db), "the demo's schema is dropped")
	for _, pid := range pids {
		require.Eventually(t, func() bool { return !processAlive(pid) },
			time.Minute, 10*time.Millisecond, "worker %d is gone", pid)
	}
}

func TestDemoUsage(t *testing.T) {
	t.Parallel()
	r := pgfence(t, nil, "", "demo", "extra")
	require.Equal(t, 2, r.code)
	require.Contains(t, r.stderr, `unexpected argument "extra"`)
	r = pgfence(t, nil, "", "demo", "--database", "postgres://x:notaport/db")
	require.Equal(t, 2, r.code)
	require.Contains(t, r.stderr, "invalid database in --database")
	r = pgfence(t, nil, "", "demo-worker")
	require.Equal(t, 2, r.code)
	require.Contains(t, r.stderr, "internal command of 'pgfence demo'")
}

// processAlive reports whether pid runs (a zombie does not count).
func processAlive(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	return len(f) > 0 && f[0] != "Z" && f[0] != "X"
}
