package pgtest

import (
	"os"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestOwnerGone checks which containers the sweep takes for a dead
// owner's: only this host's, with labels it understands, whose owner's
// boot ended, whose pid runs no more, or whose pid now runs another
// process (another start time).
func TestOwnerGone(t *testing.T) {
	t.Parallel()
	const host, boot = "h1", "boot-1"
	alive := func(pid int) bool { return pid == 100 || pid == 200 }
	start := func(pid int) string {
		switch pid {
		case 100:
			return "5000"
		case 200:
			return "" // no /proc: start time unknown
		}
		return ""
	}
	for _, tc := range []struct {
		name string
		o    owner
		gone bool
	}{
		{"running owner", owner{host, boot, "100", "5000"}, false},
		{"dead pid", owner{host, boot, "101", "5000"}, true},
		{"reused pid", owner{host, boot, "100", "4000"}, true},
		{"running, no start label", owner{host, boot, "100", ""}, false},
		{"running, start unknown here", owner{host, boot, "200", "4000"}, false},
		{"another boot", owner{host, "boot-0", "100", "5000"}, true},
		{"no boot labels", owner{host, "", "100", "5000"}, false},
		{"another host, dead pid", owner{"h2", boot, "101", "5000"}, false},
		{"no host label", owner{"", boot, "101", "5000"}, false},
		{"unparsable pid", owner{host, boot, "x", "5000"}, false},
		{"pid 0", owner{host, boot, "0", ""}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			require.Equal(t, tc.gone, tc.o.gone(host, boot, alive, start))
		})
	}
}

// TestSelfIsAlive checks the real probes on this process and its parent:
// the labels a container of this process gets describe a running owner.
func TestSelfIsAlive(t *testing.T) {
	t.Parallel()
	me := self()
	require.Equal(t, strconv.Itoa(os.Getpid()), me.pid)
	require.False(t, me.gone(me.host, me.boot, pidAlive, processStart))
	labels := ownerLabels()
	require.Equal(t, "1", labels[labelHarness])
	require.Equal(t, me, ownerOf(labels))
	if me.start != "" { // Linux: a start time, and a pid reused would show
		require.NotEqual(t, me.start, processStart(os.Getppid()))
		reused := me
		reused.start = me.start + "0"
		require.True(t, reused.gone(me.host, me.boot, pidAlive, processStart))
	}
}
