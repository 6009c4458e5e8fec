package main_test

import (
	"encoding/json"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence/internal/pgtest"
)

// TestRunPermits: two runs hold the two permits of a semaphore; a third is
// refused at once with -n, waits without it, and runs when one ends; ls
// shows the permits in use; another count is refused while one is held.
func TestRunPermits(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDB(t)
	env := dbEnv(db)
	show := `echo "$PGFENCE_SEMAPHORE $PGFENCE_PERMIT $PGFENCE_TOKEN"; exec sleep 60`
	a := startPgfence(t, env, "run", "--permits", "2", "encode", "--", "sh", "-c", show)
	b := startPgfence(t, env, "run", "--permits", "2", "encode", "--", "sh", "-c", show)
	var slots []string
	for _, p := range []*background{a, b} {
		f := strings.Fields(p.line(t))
		require.Len(t, f, 3)
		require.Equal(t, "encode", f[0])
		slots = append(slots, f[1])
	}
	sort.Strings(slots)
	require.Equal(t, []string{"0", "1"}, slots, "one permit each")

	r := pgfence(t, env, "", "run", "-n", "--permits", "2", "encode", "--", "true")
	require.Equal(t, 1, r.code, r.stderr)
	require.Contains(t, r.stderr, `all 2 permits of semaphore "encode" are held; the command was not run`)
	r = pgfence(t, env, "", "run", "-n", "--permits", "3", "encode", "--", "true")
	require.Equal(t, 125, r.code, r.stderr)
	require.Contains(t, r.stderr, "asked for with 3 permits, but has 2")

	r = pgfence(t, env, "", "ls", "--json")
	require.Equal(t, 0, r.code, r.stderr)
	var out struct {
		Leases     []struct{ Name string } `json:"leases"`
		Semaphores []struct {
			Name    string `json:"name"`
			Permits int    `json:"permits"`
			InUse   int    `json:"in_use"`
		} `json:"semaphores"`
	}
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &out))
	require.Len(t, out.Semaphores, 1)
	require.Equal(t, "encode", out.Semaphores[0].Name)
	require.Equal(t, 2, out.Semaphores[0].Permits)
	require.Equal(t, 2, out.Semaphores[0].InUse)
	require.Len(t, out.Leases, 2, "each permit is a lease")
	r = pgfence(t, env, "", "ls")
	require.Equal(t, 0, r.code, r.stderr)
	require.Contains(t, r.stdout, `"encode\x1f0"`, "a permit's name, quoted")
	require.Regexp(t, `SEMAPHORE\s+IN USE\s+PERMITS\s+WAITING\nencode\s+2\s+2\s+0\n`, r.stdout)

	c := startPgfence(t, env, "run", "--permits", "2", "encode", "--", "sh", "-c", show)
	require.Eventually(t, func() bool {
		// Registered to be woken: ls counts the Lockers holding the
		// semaphore's interest key.
		r := pgfence(t, env, "", "ls", "--json")
		var out struct {
			Semaphores []struct {
				Waiting int `json:"waiting"`
			} `json:"semaphores"`
		}
		return r.code == 0 && json.Unmarshal([]byte(r.stdout), &out) == nil && len(out.Semaphores) == 1 && out.Semaphores[0].Waiting == 1
	}, 30*time.Second, 50*time.Millisecond, "the third run waits, registered for a release")
	require.NoError(t, a.cmd.Process.Signal(syscall.SIGTERM))
	require.Equal(t, 128+int(syscall.SIGTERM), a.wait(t))
	f := strings.Fields(c.line(t))
	require.Len(t, f, 3)
	require.Equal(t, "encode", f[0], "the waiting run got the permit given back")
}

func TestRunPermitsUsage(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--permits", "0", "x"}, "--permits must be between 1 and 1024, not 0"},
		{[]string{"--permits", "1025", "x"}, "--permits must be between 1 and 1024, not 1025"},
		{[]string{"--permits", "2", strings.Repeat("s", 508)}, "the semaphore name is 508 bytes long; at most 507"},
	} {
		r := pgfence(t, nil, "", append(append([]string{"run"}, tc.args...), "--", "true")...)
		require.Equal(t, 2, r.code, r.stderr)
		require.Contains(t, r.stderr, tc.want)
	}
}
