package main_test

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/leasetable"
)

// escapeScript starts two grandchildren that try to outlive pgfence: one
// ignores SIGTERM, one leaves the job's process group and session with
// setsid. It prints "ignorer PID", "setsid PID" and "sh PID" (its own), in
// any order, and runs until killed (it ignores SIGTERM too).
const escapeScript = `trap '' TERM
(trap '' TERM; exec sleep 600) &
echo "ignorer $!"
setsid sh -c 'echo "setsid $$"; exec sleep 600' &
echo "sh $$"
while :; do sleep 0.05; done`

// escapeJob is a running escapeScript under pgfence run.
type escapeJob struct {
	b                   *background
	ignorer, setsid, sh int
}

// startEscapeJob runs escapeScript under "pgfence run --ttl TTL job" with
// env added. The pids it started are killed at cleanup if still there.
func startEscapeJob(t *testing.T, db *pgtest.DB, ttl string, env ...string) *escapeJob {
	t.Helper()
	b := startPgfence(t, append(dbEnv(db), env...), "run", "--ttl", ttl, "job", "--", "sh", "-c", escapeScript)
	j := &escapeJob{b: b}
	for j.ignorer == 0 || j.setsid == 0 || j.sh == 0 {
		what, n, ok := strings.Cut(b.line(t), " ")
		require.True(t, ok)
		pid, err := strconv.Atoi(n)
		require.NoError(t, err)
		switch what {
		case "ignorer":
			j.ignorer = pid
		case "setsid":
			j.setsid = pid
		case "sh":
			j.sh = pid
		}
	}
	t.Cleanup(func() {
		// Only the processes this test started, and only while they still
		// run what it started: a guard against a reused pid.
		for _, pid := range j.pids() {
			if processAlive(pid) && isOurs(pid) {
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
		}
	})
	// The setsid'd shell has printed its pid; wait until it is sleep.
	require.Eventually(t, func() bool { return isSleep(j.setsid) && isSleep(j.ignorer) }, time.Minute, time.Millisecond)
	for _, pid := range j.pids() {
		require.True(t, processAlive(pid), "pid %d", pid)
	}
	require.Equal(t, session(t, j.ignorer), session(t, j.sh), "the SIGTERM ignorer stays in the job's session")
	require.NotEqual(t, session(t, j.setsid), session(t, j.sh), "the setsid grandchild left the job's session")
	require.NotEqual(t, pgrp(t, j.setsid), j.sh, "and its process group")
	return j
}

func (j *escapeJob) pids() []int { return []int{j.ignorer, j.setsid, j.sh} }

// alive returns the job's processes that are still running.
func (j *escapeJob) alive() []int {
	var out []int
	for _, pid := range j.pids() {
		if processAlive(pid) {
			out = append(out, pid)
		}
	}
	return out
}

// statField returns field i (0 is the state) after the command name in
// /proc/PID/stat, or -1 when the process is gone.
func statField(t *testing.T, pid, i int) int {
	t.Helper()
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return -1
	}
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	n, err := strconv.Atoi(f[i])
	require.NoError(t, err)
	return n
}

func pgrp(t *testing.T, pid int) int    { return statField(t, pid, 2) }
func session(t *testing.T, pid int) int { return statField(t, pid, 3) }

// isOurs reports whether pid runs sleep or sh, the programs escapeScript
// starts: a guard against signalling a reused pid.
func isOurs(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
	if err != nil {
		return false
	}
	argv0, _, _ := strings.Cut(string(b), "\x00")
	return argv0 == "sleep" || argv0 == "sh"
}

// isSleep reports whether pid runs sleep.
func isSleep(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
	return err == nil && strings.HasPrefix(string(b), "sleep\x00")
}

// TestRunKilledKillsTheWholeJob: pgfence run killed with SIGKILL takes
// every process of the job with it, a grandchild that ignores SIGTERM and
// one that called setsid() included, well before the lease's TTL could let
// a second run in; the second run, once it gets the lease, finds none of
// them. TestRunKilledWithoutTheSupervisor is the negative control.
func TestRunKilledKillsTheWholeJob(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDB(t)
	const ttl = 6 * time.Second
	j := startEscapeJob(t, db, ttl.String())

	killed := time.Now()
	require.NoError(t, j.b.cmd.Process.Kill())
	for len(j.alive()) > 0 {
		// Gone before the TTL could let a second run in, with a second
		// to spare (3.0007s seen on a loaded CI machine against ttl/2).
		require.Less(t, time.Since(killed), ttl-time.Second, "still running: %v", j.alive())
		time.Sleep(time.Millisecond)
	}
	t.Logf("from pgfence's SIGKILL to the last child's death: %v", time.Since(killed).Round(100*time.Microsecond))
	j.b.wait(t)

	// The lease was not released (pgfence was killed): a second run gets it
	// when it expires, and its command checks that nothing of the first
	// job is left.
	check := fmt.Sprintf(`for p in %d %d %d; do if [ -e /proc/$p ]; then echo "$p still there"; exit 9; fi; done`,
		j.ignorer, j.setsid, j.sh)
	r := pgfence(t, dbEnv(db), "", "run", "-n", "job", "--", "true")
	require.Equal(t, 1, r.code, "the lease is still held until its TTL: %s", r.stderr)
	r = pgfence(t, dbEnv(db), "", "run", "--wait", "30s", "job", "--", "sh", "-c", check)
	require.Equal(t, 0, r.code, "stdout: %s stderr: %s", r.stdout, r.stderr)
}

// TestRunKilledWithoutTheSupervisor is the negative control of
// TestRunKilledKillsTheWholeJob: with the supervisor turned off (the test
// hook), the parent-death signal kills only the command itself, and the
// grandchildren run on after the lease could have passed to someone else.
func TestRunKilledWithoutTheSupervisor(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDB(t)
	j := startEscapeJob(t, db, "6s", "PGFENCE_TEST_NO_SUPERVISOR=1")

	require.NoError(t, j.b.cmd.Process.Kill())
	j.b.wait(t)
	require.Eventually(t, func() bool { return !processAlive(j.sh) }, time.Minute, time.Millisecond,
		"the command itself gets the parent-death signal")
	time.Sleep(time.Second)
	require.True(t, processAlive(j.ignorer), "the SIGTERM ignorer survives pgfence")
	require.True(t, processAlive(j.setsid), "the setsid grandchild survives pgfence")
	// The cleanup kills them, by pid.
}

// forceReleaseDelay runs a job under a 30s TTL (renewed every 10s), force
// releases its lease once pgfence run listens, and returns how long the job
// took to get SIGTERM.
func forceReleaseDelay(t *testing.T, env ...string) time.Duration {
	t.Helper()
	ctx := context.Background()
	db := pgtest.NewDB(t)
	b := startPgfence(t, append(dbEnv(db), env...), "run", "--ttl", "30s", "job", "--", "sh", "-c",
		`trap 'echo TERM; exit 3' TERM; echo ready; while :; do sleep 0.01; done`)
	require.Equal(t, "ready", b.line(t))
	locker, err := leasetable.New(ctx, db.Pool, &leasetable.Config{DisableListen: true})
	require.NoError(t, err)
	defer locker.Close()
	// Wait until pgfence run LISTENs (without the watch: nobody does, and
	// the lease was just acquired, so the next renewal is about 10s away).
	if len(env) == 0 {
		require.Eventually(t, func() bool {
			var listening bool
			require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) > 0 FROM pg_catalog.pg_stat_activity
				WHERE query ILIKE 'listen%' AND datname = pg_catalog.current_database()`).Scan(&listening))
			return listening
		}, time.Minute, 10*time.Millisecond, "pgfence run listens")
	}

	released := time.Now()
	_, err = locker.ForceRelease(ctx, "job", "test")
	require.NoError(t, err)
	require.Equal(t, "TERM", b.line(t))
	took := time.Since(released)
	require.Equal(t, 124, b.wait(t), b.stderr.String())
	return took
}

// TestRunForceReleaseStopsTheJobAtOnce: a force release is noticed through
// its notification, not at the next renewal (TTL/3 = 10s here): the job
// gets SIGTERM within about a round trip.
func TestRunForceReleaseStopsTheJobAtOnce(t *testing.T) {
	t.Parallel()
	took := forceReleaseDelay(t)
	t.Logf("from the force release to the job's SIGTERM: %v", took.Round(100*time.Microsecond))
	require.Less(t, took, 3*time.Second, "well before the next renewal (10s)")
}

// TestRunForceReleaseWithoutTheWatch is the negative control: with the
// notification watch turned off (the test hook), the loss waits for the
// next scheduled renewal.
func TestRunForceReleaseWithoutTheWatch(t *testing.T) {
	t.Parallel()
	took := forceReleaseDelay(t, "PGFENCE_TEST_NO_LOSS_WATCH=1")
	t.Logf("without the watch, from the force release to the job's SIGTERM: %v", took.Round(time.Millisecond))
	require.Greater(t, took, 3*time.Second, "the threshold of TestRunForceReleaseStopsTheJobAtOnce can fail")
}

// TestRunExitsWhileTheTableIsLocked: with the lease table locked (every
// renewal and the release wait behind it), the lease is given up at the
// local deadline, the job is ended, and pgfence exits, its release bounded,
// while the lock is still held.
func TestRunExitsWhileTheTableIsLocked(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.NewDB(t)
	b := startPgfence(t, dbEnv(db), "run", "--ttl", "3s", "job", "--", "sh", "-c", `echo ready; while :; do sleep 0.05; done`)
	require.Equal(t, "ready", b.line(t))
	tx, err := db.Pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = tx.Exec(ctx, "LOCK TABLE pgfence.pgfence_leases IN ACCESS EXCLUSIVE MODE")
	require.NoError(t, err)
	locked := time.Now()

	select {
	case <-b.done:
	case <-time.After(30 * time.Second):
		t.Fatalf("pgfence did not exit while the table was locked; stderr: %s", b.stderr.String())
	}
	took := time.Since(locked)
	t.Logf("pgfence exited %v after the table was locked", took.Round(time.Millisecond))
	// Loss at the local deadline (at most 3s - 600ms), 300ms of grace, the
	// release after a loss bounded by 1s, closing bounded by 2s.
	require.Less(t, took, 15*time.Second)
	require.Equal(t, 124, b.cmd.ProcessState.ExitCode(), b.stderr.String())
	var alive bool
	require.NoError(t, tx.QueryRow(ctx, "SELECT true").Scan(&alive), "the lock was still held")
}
