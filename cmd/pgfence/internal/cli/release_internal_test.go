package cli

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence/leasetable"
)

// TestParseReleaseTarget: release's NAME is a lease, a permit with
// --permit, a permit as ls shows it (quoted) or as it is, and every
// permit's name ls shows reads back as that permit. A quoted name that is
// not a permit's stays a lease name, as before.
func TestParseReleaseTarget(t *testing.T) {
	t.Parallel()
	permit := func(sem string, slot int, shown string) releaseTarget {
		return releaseTarget{lease: leasetable.PermitName(sem, slot), permit: true, semaphore: sem, slot: slot, shown: shown}
	}
	for _, tc := range []struct {
		name      string
		permitSet bool
		slot      int
		want      releaseTarget
	}{
		{"account:42", false, 0, releaseTarget{lease: "account:42"}},
		{"jobs", true, 3, permit("jobs", 3, "")},
		{"jobs", true, 0, permit("jobs", 0, "")},
		{"jobs", true, leasetable.MaxPermits - 1, permit("jobs", leasetable.MaxPermits-1, "")},
		{"jobs\x1f3", false, 0, permit("jobs", 3, "")},
		{`"jobs\x1f3"`, false, 0, permit("jobs", 3, `"jobs\x1f3"`)},
		{`"jobs\u001f12"`, false, 0, permit("jobs", 12, `"jobs\u001f12"`)},
		{`"\"q\x1f0"`, false, 0, permit(`"q`, 0, `"\"q\x1f0"`)},
		{`"café ✓\x1f1"`, false, 0, permit("café ✓", 1, `"café ✓\x1f1"`)},
		// Quoted, but not a permit's name: the lease named so, literally.
		{`"quoted"`, false, 0, releaseTarget{lease: `"quoted"`}},
		{`"jobs\x1f03"`, false, 0, releaseTarget{lease: `"jobs\x1f03"`}},
		{`"jobs\x1f1024"`, false, 0, releaseTarget{lease: `"jobs\x1f1024"`}},
		{`"jobs\x1f3`, false, 0, releaseTarget{lease: `"jobs\x1f3`}},
		{`"jobs\x1f3"`, true, 1, permit(`"jobs\x1f3"`, 1, "")}, // with --permit, NAME is the semaphore's, as written
	} {
		got, err := parseReleaseTarget(tc.name, tc.permitSet, tc.slot)
		require.NoError(t, err, tc.name)
		require.Equal(t, tc.want, got, tc.name)
	}
	// What ls shows for a permit reads back as the permit.
	for _, sem := range []string{"jobs", "a b", `"x`, "日本", "tab-free\u00a0nbsp"} {
		for _, slot := range []int{0, 7, leasetable.MaxPermits - 1} {
			name := leasetable.PermitName(sem, slot)
			got, err := parseReleaseTarget(display(name), false, 0)
			require.NoError(t, err)
			require.Equal(t, permit(sem, slot, display(name)), got)
			require.Equal(t, name, got.lease)
		}
	}
}

// TestParseReleaseTargetRefuses: bad slots and names are usage errors.
func TestParseReleaseTargetRefuses(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name      string
		permitSet bool
		slot      int
		want      string
	}{
		{"jobs", true, -1, "--permit must be between 0 and 1023, not -1"},
		{"jobs", true, leasetable.MaxPermits, "--permit must be between 0 and 1023, not 1024"},
		{"", true, 0, "the semaphore name is empty"},
		{"a\x1fb", true, 0, "holds a control character (U+001F)"},
		{"a\nb", true, 0, "holds a control character (U+000A)"},
		{"bad\xff", true, 0, "is not valid UTF-8"},
		{strings.Repeat("s", leasetable.MaxSemaphoreNameLength+1), true, 0, "is 508 bytes long; at most 507"},
		{"", false, 0, "the lease name is empty"},
		{"jobs\x1f03", false, 0, "holds a control character (U+001F)"},
		{"jobs\x1f1024", false, 0, "holds a control character (U+001F)"},
		{"\x1f3", false, 0, "holds a control character (U+001F)"},
		{"bad\x1f3\x1f4", false, 0, "holds a control character (U+001F)"},
	} {
		_, err := parseReleaseTarget(tc.name, tc.permitSet, tc.slot)
		var ue *usageError
		require.True(t, errors.As(err, &ue), "%q: %v", tc.name, err)
		require.ErrorContains(t, err, tc.want, "%q", tc.name)
	}
}

// TestReleaseTargetString: prompts and output name a permit by slot and
// semaphore.
func TestReleaseTargetString(t *testing.T) {
	t.Parallel()
	p, err := parseReleaseTarget("jobs", true, 3)
	require.NoError(t, err)
	require.Equal(t, `permit 3 of semaphore "jobs"`, p.String())
	require.Equal(t, `Permit 3 of semaphore "jobs"`, upperFirst(p.String()))
	l, err := parseReleaseTarget("account:42", false, 0)
	require.NoError(t, err)
	require.Equal(t, `Lease "account:42"`, upperFirst(l.String()))
}

// TestLsShowsWaiting: the semaphores table has a WAITING column, and
// --json a "waiting" field.
func TestLsShowsWaiting(t *testing.T) {
	t.Parallel()
	out := lsJSON{Now: time.Now(), Semaphores: []semaphoreJSON{{Name: "jobs", Permits: 4, InUse: 4, Waiting: 2}, {Name: "a\x1fb", Permits: 1, InUse: 1}}}
	var b strings.Builder
	require.NoError(t, printLs(&b, out))
	require.Regexp(t, `\nSEMAPHORE\s+IN USE\s+PERMITS\s+WAITING\njobs\s+4\s+4\s+2\n"a\\x1fb"\s+1\s+1\s+0\n`, b.String())
	j, err := json.Marshal(out.Semaphores[0])
	require.NoError(t, err)
	require.Equal(t, `{"name":"jobs","permits":4,"in_use":4,"waiting":2}`, string(j))
}
