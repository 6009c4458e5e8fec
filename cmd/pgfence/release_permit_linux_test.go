package main_test

import (
	"fmt"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/leasetable"
)

// TestReleasePermitAsksOnATerminal: the prompt names the permit and its
// semaphore and holder; no changes nothing, yes releases.
func TestReleasePermitAsksOnATerminal(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDB(t)
	env := dbEnv(db)
	holder, slot, token := holdPermit(t, env, "jobs", 3)
	name := leasetable.PermitName("jobs", slot)

	for _, args := range [][]string{{"--permit", strconv.Itoa(slot), "jobs"}, {strconv.Quote(name)}} {
		r := pgfenceOnTerminal(t, env, "n\n", append([]string{"release", "--force"}, args...)...)
		require.Equal(t, 1, r.code, r.stderr)
		require.Contains(t, r.stderr, fmt.Sprintf(`Permit %d of semaphore "jobs" is held by "`, slot))
		require.Contains(t, r.stderr, fmt.Sprintf(`with token %d, expires `, token))
		require.Contains(t, r.stderr, "Force-release it? Its holder will be fenced out. [y/N]")
		require.Contains(t, r.stderr, "aborted; nothing was changed")
		got, held := leaseRow(t, db, name)
		require.Equal(t, token, got)
		require.True(t, held)
	}

	r := pgfenceOnTerminal(t, env, "y\n", "release", "--force", "--permit", strconv.Itoa(slot), "jobs")
	require.Equal(t, 0, r.code, r.stderr)
	require.Contains(t, r.stdout, fmt.Sprintf(`released permit %d of semaphore "jobs": token %d -> `, slot, token))
	got, held := leaseRow(t, db, name)
	require.Greater(t, got, token)
	require.False(t, held)
	require.Equal(t, 124, holder.wait(t), holder.stderr.String())
}
