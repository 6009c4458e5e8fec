package main_test

import (
	"bufio"
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence/internal/pgtest"
)

// background is a pgfence process started by a test, with its standard
// output readable line by line as it is written.
type background struct {
	cmd    *exec.Cmd
	stdout *bufio.Reader
	stderr *lockedBuffer
	done   chan struct{}
}

// lockedBuffer is a bytes.Buffer safe to read while a process writes it.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// startPgfence starts the binary with env added to a clean environment.
// Its standard output (which a supervised command inherits) is a pipe the
// test reads; the process is killed at cleanup if still running.
func startPgfence(t *testing.T, env []string, args ...string) *background {
	t.Helper()
	r, w, err := os.Pipe()
	require.NoError(t, err)
	t.Cleanup(func() { _ = r.Close() })
	cmd := exec.Command(bin, args...)
	cmd.Env = append(cleanEnv(), env...)
	cmd.Stdout = w
	// A command left behind holding standard error must not keep Wait
	// from returning once pgfence has exited.
	cmd.WaitDelay = 5 * time.Second
	b := &background{cmd: cmd, stdout: bufio.NewReader(r), stderr: &lockedBuffer{}, done: make(chan struct{})}
	cmd.Stderr = b.stderr
	require.NoError(t, cmd.Start())
	require.NoError(t, w.Close())
	go func() { _ = cmd.Wait(); close(b.done) }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-b.done
	})
	return b
}

// line reads the next line of the process's standard output.
func (b *background) line(t *testing.T) string {
	t.Helper()
	s, err := b.stdout.ReadString('\n')
	require.NoError(t, err, "stderr: %s", b.stderr.String())
	return strings.TrimSuffix(s, "\n")
}

// wait waits for the process to exit and returns its exit code.
func (b *background) wait(t *testing.T) int {
	t.Helper()
	select {
	case <-b.done:
	case <-time.After(2 * time.Minute):
		t.Fatalf("pgfence did not exit; stderr: %s", b.stderr.String())
	}
	return b.cmd.ProcessState.ExitCode()
}

// groupAlive reports whether a process of process group pgid is running
// (zombies waiting to be reaped do not count).
func groupAlive(t *testing.T, pgid int) bool {
	t.Helper()
	entries, err := os.ReadDir("/proc")
	require.NoError(t, err)
	for _, e := range entries {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		s := string(b)
		f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
		if len(f) >= 3 && f[2] == strconv.Itoa(pgid) && f[0] != "Z" && f[0] != "X" {
			return true
		}
	}
	return false
}

// leaseRow returns the lease's token and whether it is held.
func leaseRow(t *testing.T, db *pgtest.DB, name string) (token int64, held bool) {
	t.Helper()
	require.NoError(t, db.Pool.QueryRow(context.Background(),
		"SELECT fence, expires_at > pg_catalog.now() FROM pgfence.pgfence_leases WHERE name = $1", name).Scan(&token, &held))
	return token, held
}

func TestRunFreeLease(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDB(t)
	r := pgfence(t, dbEnv(db), "", "run", "nightly", "--", "sh", "-c", `echo "$PGFENCE_LEASE $PGFENCE_TOKEN"; exit 3`)
	require.Equal(t, 3, r.code, "the command's exit status; stderr: %s", r.stderr)
	require.Empty(t, r.stderr)
	token, held := leaseRow(t, db, "nightly")
	require.Equal(t, "nightly "+strconv.FormatInt(token, 10)+"\n", r.stdout, "the command got the lease's name and token")
	require.False(t, held, "released when the command ended")

	r = pgfence(t, dbEnv(db), "", "run", "-n", "nightly", "--", "true")
	require.Equal(t, 0, r.code, r.stderr)
	next, _ := leaseRow(t, db, "nightly")
	require.Greater(t, next, token, "each run gets a newer token")

	r = pgfence(t, dbEnv(db), "", "run", "nightly", "--", "sh", "-c", "kill -TERM $$")
	require.Equal(t, 128+int(syscall.SIGTERM), r.code)
	r = pgfence(t, dbEnv(db), "", "run", "nightly", "--", "pgfence-test-no-such-command")
	require.Equal(t, 127, r.code)
	require.Contains(t, r.stderr, "command not found")
}

func TestRunAtLeast(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDB(t)
	r := pgfence(t, dbEnv(db), "", "run", "--at-least", "1h", "report", "--", "true")
	require.Equal(t, 0, r.code, r.stderr)
	_, held := leaseRow(t, db, "report")
	require.True(t, held, "--at-least keeps the lease after the command ended")
	r = pgfence(t, dbEnv(db), "", "run", "-n", "report", "--", "true")
	require.Equal(t, 1, r.code)
}

func TestRunHeldLease(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDB(t)
	env := dbEnv(db)
	token := insertLease(t, db, "nightly", "other-host", "1 hour")
	marker := filepath.Join(t.TempDir(), "ran")
	cmd := []string{"--", "touch", marker}

	r := pgfence(t, env, "", append([]string{"run", "-n", "nightly"}, cmd...)...)
	require.Equal(t, 1, r.code, "flock's default conflict code")
	require.Contains(t, r.stderr, `lease "nightly" is held by another owner (holder "other-host", token `+strconv.FormatInt(token, 10))
	require.Contains(t, r.stderr, "the command was not run")

	r = pgfence(t, env, "", append([]string{"run", "--no-wait", "-E", "3", "nightly"}, cmd...)...)
	require.Equal(t, 3, r.code)

	r = pgfence(t, env, "", append([]string{"run", "-n", "-q", "-E", "0", "nightly"}, cmd...)...)
	require.Equal(t, 0, r.code)
	require.Empty(t, r.stderr, "--quiet")

	r = pgfence(t, env, "", append([]string{"run", "-w", "200ms", "--conflict-exit-code", "75", "nightly"}, cmd...)...)
	require.Equal(t, 75, r.code)
	require.Contains(t, r.stderr, `lease "nightly" was not acquired within 200ms`)

	r = pgfence(t, env, "", append([]string{"run", "-w", "200ms", "nightly"}, cmd...)...)
	require.Equal(t, 1, r.code)

	require.NoFileExists(t, marker, "the command never ran")
	again, held := leaseRow(t, db, "nightly")
	require.Equal(t, token, again)
	require.True(t, held, "the holder's lease is untouched")
}

// waitingBackends counts run's backends waiting in LISTEN for a release.
func waitingBackends(t *testing.T, db *pgtest.DB) int {
	t.Helper()
	var n int
	require.NoError(t, db.Pool.QueryRow(context.Background(), `
		SELECT pg_catalog.count(*) FROM pg_catalog.pg_stat_activity
		WHERE datname = pg_catalog.current_database() AND application_name = 'pgfence run' AND query ILIKE 'listen%'`).Scan(&n))
	return n
}

func TestRunWaitsForTheLeaseByDefault(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDB(t)
	insertLease(t, db, "nightly", "other-host", "1 hour")
	b := startPgfence(t, dbEnv(db), "run", "nightly", "--", "echo", "ran")
	require.Eventually(t, func() bool { return waitingBackends(t, db) == 1 }, time.Minute, 10*time.Millisecond,
		"run waits, listening for the release")

	r := pgfence(t, dbEnv(db), "", "release", "--force", "--yes", "nightly")
	require.Equal(t, 0, r.code, r.stderr)
	require.Equal(t, "ran", b.line(t))
	require.Equal(t, 0, b.wait(t), b.stderr.String())
	require.Empty(t, b.stderr.String())
}

func TestRunInterruptedWhileWaiting(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDB(t)
	insertLease(t, db, "nightly", "other-host", "1 hour")
	b := startPgfence(t, dbEnv(db), "run", "nightly", "--", "echo", "ran")
	require.Eventually(t, func() bool { return waitingBackends(t, db) == 1 }, time.Minute, 10*time.Millisecond)
	require.NoError(t, b.cmd.Process.Signal(syscall.SIGTERM))
	require.Equal(t, 128+int(syscall.SIGTERM), b.wait(t))
	require.Contains(t, b.stderr.String(), `interrupted by SIGTERM while waiting for lease "nightly"; the command was not run`)
}

func TestRunForwardsSignals(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDB(t)
	for _, tt := range []struct {
		sig  syscall.Signal
		name string
	}{{syscall.SIGTERM, "TERM"}, {syscall.SIGINT, "INT"}, {syscall.SIGHUP, "HUP"}} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			name := "job-" + tt.name
			b := startPgfence(t, dbEnv(db), "run", name, "--", "sh", "-c",
				`trap 'echo got `+tt.name+`; exit 7' `+tt.name+`; echo ready; while :; do sleep 0.05; done`)
			require.Equal(t, "ready", b.line(t))
			require.NoError(t, b.cmd.Process.Signal(tt.sig))
			require.Equal(t, "got "+tt.name, b.line(t), "the command received the signal")
			require.Equal(t, 7, b.wait(t), "the command's exit status; stderr: %s", b.stderr.String())
			_, held := leaseRow(t, db, name)
			require.False(t, held, "released")
		})
	}
}

// lossScript is a command that ignores SIGTERM (so only SIGKILL ends it),
// starts a second process in its group that ignores it too, prints its
// process group id (its pid: it leads the group) and then its token, and
// runs until killed.
const lossScript = `trap '' TERM; sleep 600 & echo $$; echo "$PGFENCE_TOKEN"; while :; do sleep 0.05; done`

func TestRunKillsTheCommandWhenTheLeaseIsStolen(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDB(t)
	b := startPgfence(t, dbEnv(db), "run", "--ttl", "3s", "job", "--", "sh", "-c", lossScript)
	pgid, err := strconv.Atoi(b.line(t))
	require.NoError(t, err)
	token := b.line(t)
	require.True(t, groupAlive(t, pgid))

	r := pgfence(t, dbEnv(db), "", "release", "--force", "job", "--yes")
	require.Equal(t, 0, r.code, r.stderr)

	require.Equal(t, 124, b.wait(t), b.stderr.String())
	require.Contains(t, b.stderr.String(), `pgfence run: lease "job" (token `+token+`) was lost`)
	require.Contains(t, b.stderr.String(), "the command was terminated (killed by signal 9 (killed))")
	require.Eventually(t, func() bool { return !groupAlive(t, pgid) }, time.Minute, 10*time.Millisecond,
		"the command's whole process group is gone")
}

func TestRunKillsTheCommandWhenRenewalsFreeze(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.NewDB(t)
	b := startPgfence(t, dbEnv(db), "run", "--ttl", "3s", "job", "--", "sh", "-c", lossScript)
	pgid, err := strconv.Atoi(b.line(t))
	require.NoError(t, err)
	token := b.line(t)

	// Renewals update the lease row: holding its row lock makes them wait
	// until run's local deadline passes.
	tx, err := db.Pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = tx.Exec(ctx, "SELECT 1 FROM pgfence.pgfence_leases WHERE name = 'job' FOR UPDATE")
	require.NoError(t, err)

	require.Equal(t, 124, b.wait(t), b.stderr.String())
	require.Contains(t, b.stderr.String(), `lease "job" (token `+token+`) was lost`)
	require.Contains(t, b.stderr.String(), "no successful renewal before the local deadline")
	require.Eventually(t, func() bool { return !groupAlive(t, pgid) }, time.Minute, 10*time.Millisecond,
		"the command's whole process group is gone")
}

// TestRunHoldsAndRenews is the control for the loss tests: undisturbed, a
// command outlives several TTLs, the lease is renewed and listed by ls, and
// the command's own exit status is returned.
func TestRunHoldsAndRenews(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.NewDB(t)
	fifo := filepath.Join(t.TempDir(), "finish")
	require.NoError(t, syscall.Mkfifo(fifo, 0o600))
	b := startPgfence(t, dbEnv(db), "run", "--ttl", "1s", "job", "--", "sh", "-c", `echo "$PGFENCE_TOKEN"; read line < "$0"; exit 0`, fifo)
	token, err := strconv.ParseInt(b.line(t), 10, 64)
	require.NoError(t, err)

	r := pgfence(t, dbEnv(db), "", "ls", "--json")
	require.Equal(t, 0, r.code, r.stderr)
	out := decodeLs(t, r.stdout)
	require.Len(t, out.Leases, 1)
	require.Equal(t, "job", out.Leases[0].Name)
	require.Equal(t, token, out.Leases[0].Token)
	require.True(t, out.Leases[0].Held)
	require.Contains(t, out.Leases[0].Owner, "pgfence run sh on ")

	var firstExpiry time.Time
	require.NoError(t, db.Pool.QueryRow(ctx, "SELECT expires_at FROM pgfence.pgfence_leases WHERE name = 'job'").Scan(&firstExpiry))
	renewals := 0
	require.Eventually(t, func() bool {
		var expiry time.Time
		require.NoError(t, db.Pool.QueryRow(ctx, "SELECT expires_at FROM pgfence.pgfence_leases WHERE name = 'job'").Scan(&expiry))
		if expiry.After(firstExpiry) {
			firstExpiry = expiry
			renewals++
		}
		return renewals >= 4
	}, time.Minute, 20*time.Millisecond, "the lease is renewed while the command runs")

	require.NoError(t, os.WriteFile(fifo, []byte("done\n"), 0o600))
	require.Equal(t, 0, b.wait(t), b.stderr.String())
	again, held := leaseRow(t, db, "job")
	require.Equal(t, token, again, "nobody else took the lease")
	require.False(t, held, "released")
}

func TestRunAndDemoHelp(t *testing.T) {
	t.Parallel()
	r := pgfence(t, nil, "", "--help")
	require.Equal(t, 0, r.code)
	require.Contains(t, r.stdout, "\n  demo ")
	require.Contains(t, r.stdout, "\n  run ")
	require.NotContains(t, r.stdout, "demo-worker", "the worker command is hidden")

	r = pgfence(t, nil, "", "run", "--help")
	require.Equal(t, 0, r.code, r.stderr)
	for _, want := range []string{
		"pgfence run [flags] NAME -- COMMAND [ARGS...]",
		"PGFENCE_TOKEN",
		"SENT + TTL - MARGIN",
		"GRACE = MARGIN/2",
		"124             the lease was lost",
		"125             pgfence run itself failed",
		"--safety-margin DURATION",
		"-E, --conflict-exit-code N",
	} {
		require.Contains(t, r.stdout, want)
	}

	r = pgfence(t, nil, "", "help", "demo")
	require.Equal(t, 0, r.code, r.stderr)
	require.Contains(t, r.stdout, "pgfence demo [--database URL]")
	require.Contains(t, r.stdout, "throwaway PostgreSQL")

	for _, args := range [][]string{
		{"run", "--ttl", "50ms", "job", "--", "true"},
		{"run", "--ttl", "3s", "--safety-margin", "2s", "job", "--", "true"},
		{"run", "-n", "-w", "1s", "job", "--", "true"},
		{"run", "job"},
	} {
		r = pgfence(t, []string{"DATABASE_URL=postgres://nobody@127.0.0.1:1/none?sslmode=disable"}, "", args...)
		require.Equal(t, 2, r.code, "%q: %s", args, r.stderr)
	}
}

func TestRunUnreachableDatabase(t *testing.T) {
	t.Parallel()
	r := pgfence(t, nil, "", "run", "-n", "--database", "postgres://nobody@127.0.0.1:1/none?sslmode=disable&connect_timeout=5",
		"job", "--", "true")
	require.Equal(t, 125, r.code)
	require.Contains(t, r.stderr, "pgfence run: ")
}

func TestRunWithoutTheSchema(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDB(t)
	r := pgfence(t, dbEnv(db), "", "migrate", "down", "--yes")
	require.Equal(t, 0, r.code, r.stderr)
	r = pgfence(t, dbEnv(db), "", "run", "job", "--", "true")
	require.Equal(t, 125, r.code)
	require.Contains(t, r.stderr, "pgfence migrate up --schema pgfence")
}

func TestRunKilledTakesTheCommandWithIt(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDB(t)
	b := startPgfence(t, dbEnv(db), "run", "job", "--", "sh", "-c", `echo $$; while :; do sleep 0.05; done`)
	pid, err := strconv.Atoi(b.line(t))
	require.NoError(t, err)
	require.True(t, processAlive(pid))
	t.Cleanup(func() { _ = syscall.Kill(-pid, syscall.SIGKILL) })
	require.NoError(t, b.cmd.Process.Kill())
	b.wait(t)
	require.Eventually(t, func() bool { return !processAlive(pid) }, time.Minute, 10*time.Millisecond,
		"the command does not run on without its supervisor")
}

// TestRunMaxHold: past --max-hold the command's whole group is stopped as
// on a lost lease, run exits 124 saying max-hold, and the lease is free.
func TestRunMaxHold(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDB(t)
	b := startPgfence(t, dbEnv(db), "run", "--ttl", "3s", "--max-hold", "1s", "job", "--", "sh", "-c", lossScript)
	pgid, err := strconv.Atoi(b.line(t))
	require.NoError(t, err)
	token := b.line(t)

	require.Equal(t, 124, b.wait(t), b.stderr.String())
	require.Contains(t, b.stderr.String(), `pgfence run: lease "job" (token `+token+`) reached --max-hold 1s; the command was terminated (killed by signal 9 (killed))`)
	require.Eventually(t, func() bool { return !groupAlive(t, pgid) }, time.Minute, 10*time.Millisecond,
		"the command's whole process group is gone")
	_, held := leaseRow(t, db, "job")
	require.False(t, held, "the lease was released")

	// Control: a command that ends before the bound keeps its own status.
	r := pgfence(t, dbEnv(db), "", "run", "--max-hold", "1h", "job", "--", "sh", "-c", "exit 3")
	require.Equal(t, 3, r.code, r.stderr)
	require.Empty(t, r.stderr)
}
