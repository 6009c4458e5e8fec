package main_test

import (
	"fmt"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/leasetable"
)

// permitScript prints the permit's slot and token, then runs until killed.
const permitScript = `echo "$PGFENCE_PERMIT $PGFENCE_TOKEN"; exec sleep 600`

// holdPermit starts pgfence run holding a permit of semaphore sem of
// permits, and returns it with its slot and token.
func holdPermit(t *testing.T, env []string, sem string, permits int) (b *background, slot int, token int64) {
	t.Helper()
	b = startPgfence(t, env, "run", "--permits", strconv.Itoa(permits), sem, "--", "sh", "-c", permitScript)
	f := strings.Fields(b.line(t))
	require.Len(t, f, 2)
	slot, err := strconv.Atoi(f[0])
	require.NoError(t, err)
	token, err = strconv.ParseInt(f[1], 10, 64)
	require.NoError(t, err)
	return b, slot, token
}

// TestLsSemaphoreWaiting: ls counts the runs waiting for a permit of a
// semaphore whose permits are all held, in its table and --json, and
// counts 0 once they left.
func TestLsSemaphoreWaiting(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDB(t)
	env := dbEnv(db)
	holdPermit(t, env, "jobs", 1)
	var waiters []*background
	for range 2 {
		waiters = append(waiters, startPgfence(t, env, "run", "--permits", "1", "jobs", "--", "true"))
	}
	semaphores := func() string {
		r := pgfence(t, env, "", "ls", "--json")
		require.Equal(t, 0, r.code, r.stderr)
		return fmt.Sprintf("%+v", decodeLs(t, r.stdout).Semaphores)
	}
	require.Eventually(t, func() bool { return semaphores() == "[{Name:jobs Permits:1 InUse:1 Waiting:2}]" },
		time.Minute, 50*time.Millisecond, "two runs wait")
	r := pgfence(t, env, "", "ls")
	require.Equal(t, 0, r.code, r.stderr)
	require.Regexp(t, `\nSEMAPHORE\s+IN USE\s+PERMITS\s+WAITING\njobs\s+1\s+1\s+2\n`, r.stdout)

	for _, w := range waiters {
		require.NoError(t, w.cmd.Process.Signal(syscall.SIGTERM))
		require.Equal(t, 128+int(syscall.SIGTERM), w.wait(t), "interrupted while waiting")
	}
	require.Eventually(t, func() bool { return semaphores() == "[{Name:jobs Permits:1 InUse:1 Waiting:0}]" },
		time.Minute, 50*time.Millisecond, "nobody waits")
}

// TestReleaseForcePermit: release --force --permit SLOT ends that permit
// of the semaphore (a fresh token; its run loses it and is stopped) and
// leaves the other permit and its run alone; a permit named as ls shows it
// is released the same way; a permit never taken, and a quoted name that
// is also a lease's literal name, are refused and change nothing.
func TestReleaseForcePermit(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDB(t)
	env := dbEnv(db)
	a, slotA, tokenA := holdPermit(t, env, "jobs", 2)
	b, slotB, tokenB := holdPermit(t, env, "jobs", 2)
	nameA, nameB := leasetable.PermitName("jobs", slotA), leasetable.PermitName("jobs", slotB)

	r := pgfence(t, env, "", "release", "--force", "--yes", "--permit", strconv.Itoa(slotA), "jobs", "--reason", "stuck")
	require.Equal(t, 0, r.code, r.stderr)
	newA, held := leaseRow(t, db, nameA)
	require.Greater(t, newA, tokenA, "the permit's token was bumped")
	require.False(t, held)
	require.Regexp(t, fmt.Sprintf(`^released permit %d of semaphore "jobs": token %d -> %d \(was held by "[^"]+"\); recorded with reason "stuck"\n$`,
		slotA, tokenA, newA), r.stdout)
	require.Equal(t, 124, a.wait(t), a.stderr.String())
	require.Contains(t, a.stderr.String(), fmt.Sprintf("(token %d) was lost", tokenA), "the holder lost its permit")

	// The control: the other permit and its holder are untouched.
	token, held := leaseRow(t, db, nameB)
	require.Equal(t, tokenB, token)
	require.True(t, held)
	select {
	case <-b.done:
		t.Fatalf("the other permit's run ended: %s", b.stderr.String())
	default:
	}

	// A quoted name that is also a lease's literal name is ambiguous: refused, nothing changes.
	shown := strconv.Quote(nameB)
	literal := insertLease(t, db, shown, "someone", "1 minute")
	r = pgfence(t, env, "", "release", "--force", "--yes", shown)
	require.Equal(t, 2, r.code, r.stderr)
	require.Contains(t, r.stderr, fmt.Sprintf("but a lease is also named so literally: pass --permit %d \"jobs\"", slotB))
	token, held = leaseRow(t, db, nameB)
	require.Equal(t, tokenB, token)
	require.True(t, held)
	token, _ = leaseRow(t, db, shown)
	require.Equal(t, literal, token)
	_, err := db.Pool.Exec(t.Context(), "DELETE FROM pgfence.pgfence_leases WHERE name = $1", shown)
	require.NoError(t, err)

	// As ls shows it: "jobs\x1fN", quotes included.
	r = pgfence(t, env, "", "ls")
	require.Equal(t, 0, r.code, r.stderr)
	require.Contains(t, r.stdout, "\n"+shown+" ", "ls shows the permit so")
	r = pgfence(t, env, "", "release", "--force", "--yes", shown)
	require.Equal(t, 0, r.code, r.stderr)
	newB, held := leaseRow(t, db, nameB)
	require.Greater(t, newB, tokenB)
	require.False(t, held)
	require.Contains(t, r.stdout, fmt.Sprintf(`released permit %d of semaphore "jobs": token %d -> %d`, slotB, tokenB, newB))
	require.Equal(t, 124, b.wait(t), b.stderr.String())

	// Again: not held any more, the token still moves on.
	r = pgfence(t, env, "", "release", "-f", "-y", "--permit", strconv.Itoa(slotB), "jobs")
	require.Equal(t, 0, r.code, r.stderr)
	again, _ := leaseRow(t, db, nameB)
	require.Greater(t, again, newB)
	require.Contains(t, r.stdout, "was not held; last owner")

	// A permit never taken.
	r = pgfence(t, env, "", "release", "--force", "--yes", "--permit", "7", "jobs")
	require.Equal(t, 1, r.code, r.stderr)
	require.Contains(t, r.stderr, `semaphore "jobs" has no permit 7`)

	r = pgfence(t, env, "", "ls", "--forced", "--json")
	require.Equal(t, 0, r.code, r.stderr)
	require.Equal(t, 3, strings.Count(r.stdout, `"name": "jobs\u001f`), "three releases recorded: %s", r.stdout)
}

// TestReleasePermitMistakes: a bad --permit or semaphore name is a usage
// error found before connecting (the database is unreachable: a statement
// sent would fail otherwise).
func TestReleasePermitMistakes(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--permit", "-1", "jobs"}, "--permit must be between 0 and 1023, not -1"},
		{[]string{"--permit", "1024", "jobs"}, "--permit must be between 0 and 1023, not 1024"},
		{[]string{"--permit", "x", "jobs"}, "permit"},
		{[]string{"--permit", "3"}, "expected one semaphore name after --permit SLOT"},
		{[]string{"--permit", "3", ""}, "the semaphore name is empty"},
		{[]string{"--permit", "3", "a\x1fb"}, `the semaphore name "a\x1fb" holds a control character (U+001F)`},
		{[]string{"--permit", "3", strings.Repeat("s", 508)}, "the semaphore name is 508 bytes long; at most 507"},
		{[]string{"jobs\x1f03"}, "holds a control character (U+001F)"}, // not a permit's name: the slot is not canonical
	} {
		t.Run(tc.want, func(t *testing.T) {
			t.Parallel()
			r := pgfence(t, unreachable, "", append([]string{"release", "--force", "--yes"}, tc.args...)...)
			require.Equal(t, 2, r.code, r.stderr)
			require.Contains(t, r.stderr, tc.want)
			require.Contains(t, r.stderr, "--help' for usage")
		})
	}
	// The control: a valid permit gets as far as connecting.
	r := pgfence(t, unreachable, "", "release", "--force", "--yes", "--permit", "1023", "jobs")
	require.Equal(t, 1, r.code, r.stderr)
	require.Contains(t, r.stderr, "connect")
}
