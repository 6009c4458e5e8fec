package main_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence/internal/pgtest"
)

// TestRunSlot: run --slot runs the command once for the slot; a second run
// exits with the conflict code; a failed run is recorded and runs again;
// ls --jobs lists the slots.
func TestRunSlot(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDB(t)
	env := dbEnv(db)
	out := filepath.Join(t.TempDir(), "out")
	cmd := []string{"sh", "-c", `echo "$PGFENCE_SLOT $PGFENCE_LEASE" >> "$0"`, out}

	r := pgfence(t, env, "", append([]string{"run", "--slot", "2026-01-02", "report", "--"}, cmd...)...)
	require.Equal(t, 0, r.code, r.stderr)
	r = pgfence(t, env, "", append([]string{"run", "--slot", "2026-01-02", "report", "--"}, cmd...)...)
	require.Equal(t, 1, r.code, r.stderr)
	require.Contains(t, r.stderr, `slot "2026-01-02" of job "report" is done`)
	r = pgfence(t, env, "", append([]string{"run", "-q", "-E", "0", "--slot", "2026-01-02", "report", "--"}, cmd...)...)
	require.Equal(t, 0, r.code, r.stderr)
	require.Empty(t, r.stderr)
	got, err := os.ReadFile(out)
	require.NoError(t, err)
	require.Equal(t, "2026-01-02 pgfence:schedule:report\n", string(got))

	r = pgfence(t, env, "", "run", "--slot", "b", "report", "--", "sh", "-c", "exit 3")
	require.Equal(t, 3, r.code, r.stderr)
	r = pgfence(t, env, "", "run", "--slot", "b", "report", "--", "true")
	require.Equal(t, 0, r.code, r.stderr)

	r = pgfence(t, env, "", "ls", "--jobs", "--json")
	require.Equal(t, 0, r.code, r.stderr)
	var ls struct {
		Slots []struct {
			Job, Slot, State, Owner string
			Token                   int64
			Attempts                int
			DurationSeconds         *float64 `json:"duration_seconds"`
		}
	}
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &ls))
	require.Len(t, ls.Slots, 2)
	for _, s := range ls.Slots {
		require.Equal(t, "report", s.Job)
		require.Equal(t, "done", s.State)
		require.Contains(t, s.Owner, "pgfence run ")
		require.NotNil(t, s.DurationSeconds)
	}
	require.Equal(t, "b", ls.Slots[0].Slot)
	require.Equal(t, 2, ls.Slots[0].Attempts)

	r = pgfence(t, env, "", "ls", "--jobs")
	require.Equal(t, 0, r.code, r.stderr)
	require.True(t, strings.HasPrefix(r.stdout, "JOB "), r.stdout)
	require.Contains(t, r.stdout, "2026-01-02")
}

// TestRunSlotHeldElsewhere: while another owner holds the job's lease,
// run --slot --no-wait exits with the conflict code, and run --slot waits
// until a signal ends the wait, without running the command.
func TestRunSlotHeldElsewhere(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDB(t)
	env := dbEnv(db)
	insertLease(t, db, "pgfence:schedule:report", "other-host", "1 hour")
	marker := filepath.Join(t.TempDir(), "ran")
	cmd := []string{"touch", marker}

	r := pgfence(t, env, "", append([]string{"run", "--no-wait", "--slot", "a", "report", "--"}, cmd...)...)
	require.Equal(t, 1, r.code, r.stderr)
	require.Contains(t, r.stderr, `slot "a" of job "report" is being run by another owner; the command was not run`)
	r = pgfence(t, env, "", append([]string{"run", "-q", "--no-wait", "--slot", "a", "report", "--"}, cmd...)...)
	require.Equal(t, 1, r.code, r.stderr)
	require.Empty(t, r.stderr)

	b := startPgfence(t, env, append([]string{"run", "--slot", "a", "report", "--"}, cmd...)...)
	require.Eventually(t, func() bool { return waitingBackends(t, db) == 1 }, time.Minute, 10*time.Millisecond,
		"run waits, listening for the release")
	require.NoError(t, b.cmd.Process.Signal(syscall.SIGTERM))
	require.Equal(t, 128+int(syscall.SIGTERM), b.wait(t))
	require.Contains(t, b.stderr.String(), `interrupted by SIGTERM while waiting for slot "a" of job "report"; the command was not run`)
	require.NoFileExists(t, marker, "the command never ran")
}

// TestRunEvery: replicas running the same --every line in the same slot
// run the command once.
func TestRunEvery(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDB(t)
	env := dbEnv(db)
	out := filepath.Join(t.TempDir(), "out")
	codes := map[int]int{}
	for range 3 {
		r := pgfence(t, env, "", "run", "--every", "1h", "hourly", "--", "sh", "-c", `echo "$PGFENCE_SLOT" >> "$0"`, out)
		codes[r.code]++
	}
	got, err := os.ReadFile(out)
	require.NoError(t, err)
	lines := strings.Split(strings.TrimSpace(string(got)), "\n")
	// Three runs within one hour's slot, unless one straddled the hour.
	require.Len(t, lines, codes[0])
	require.Equal(t, 3, codes[0]+codes[1])
	require.LessOrEqual(t, codes[0], 2)
	require.Regexp(t, `^\d{4}-\d\d-\d\dT\d\d:00:00Z$`, lines[0])

	r := pgfence(t, env, "", "run", "--every", "1h", "--slot", "x", "hourly", "--", "true")
	require.Equal(t, 2, r.code)
	require.Contains(t, r.stderr, "--every and --slot exclude each other")
	r = pgfence(t, env, "", "ls", "--jobs", "--terms")
	require.Equal(t, 2, r.code)
}

// TestRunSlotKilledHolder: a pgfence run --slot killed (SIGKILL) while its
// command runs leaves the slot running; the next run of the slot runs it
// again once the lease's TTL has passed, and records it done.
func TestRunSlotKilledHolder(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDB(t)
	env := dbEnv(db)
	first := startPgfence(t, env, "run", "--ttl", "1s", "--slot", "s", "job", "--", "sh", "-c", "echo started; exec sleep 60")
	require.Equal(t, "started", first.line(t))
	require.NoError(t, first.cmd.Process.Kill())
	first.wait(t)
	r := pgfence(t, env, "", "run", "--slot", "s", "job", "--", "true")
	require.Equal(t, 0, r.code, r.stderr)
	r = pgfence(t, env, "", "ls", "--jobs", "--json")
	require.Equal(t, 0, r.code, r.stderr)
	var ls struct {
		Slots []struct {
			State    string
			Attempts int
		}
	}
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &ls))
	require.Len(t, ls.Slots, 1)
	require.Equal(t, "done", ls.Slots[0].State)
	require.Equal(t, 2, ls.Slots[0].Attempts)
}
