package pgtest

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
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

func TestServerMode(t *testing.T) {
	for _, tc := range []struct{ env, mode, err string }{
		{"", "", ""},
		{"auto", "", ""},
		{"url", "url", ""},
		{"local", "local", ""},
		{"container", "container", ""},
		{"docker", "", `PGFENCE_TEST_SERVER="docker": want url, local, container or auto`},
	} {
		t.Run(tc.env, func(t *testing.T) {
			t.Setenv(EnvServer, tc.env)
			mode, err := serverMode()
			if tc.err != "" {
				require.ErrorContains(t, err, tc.err)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tc.mode, mode)
		})
	}
}

// TestServerModeConflicts checks that a forced mode and the URL variable
// that contradicts it fail together, rather than one silently winning.
func TestServerModeConflicts(t *testing.T) {
	ctx := context.Background()
	t.Run("url without a URL", func(t *testing.T) {
		t.Setenv(EnvServer, "url")
		t.Setenv(EnvDatabaseURL, "")
		_, err := startShared(ctx, false)
		require.ErrorContains(t, err, "PGFENCE_TEST_SERVER=url, but PGFENCE_TEST_DATABASE_URL is not set")
	})
	for _, mode := range []string{"local", "container"} {
		t.Run(mode+" with a URL", func(t *testing.T) {
			t.Setenv(EnvServer, mode)
			t.Setenv(EnvDatabaseURL, "postgres://nobody@127.0.0.1:1/x")
			_, err := startShared(ctx, false)
			require.ErrorContains(t, err, "PGFENCE_TEST_SERVER="+mode+", but PGFENCE_TEST_DATABASE_URL is set too")
		})
	}
}

// TestForcedContainerDoesNotFallBack checks that PGFENCE_TEST_SERVER=
// container, with no engine to be had, fails naming the engine, and does
// not fall back on local server binaries (TestAutoFallsBackToLocal is the
// negative control: the same environment without the switch does). It
// runs in a child test binary: testcontainers keeps the engine's address
// for the process once it has used one.
func TestForcedContainerDoesNotFallBack(t *testing.T) {
	if os.Getenv(envNoEngineChild) == "1" {
		_, err := startShared(context.Background(), false)
		require.ErrorContains(t, err, "PGFENCE_TEST_SERVER=container")
		require.ErrorContains(t, err, "container engine (testcontainers): no container engine")
		require.NotContains(t, err.Error(), "local binaries")
		fmt.Println("no-engine child: " + strings.ReplaceAll(err.Error(), "\n", " | "))
		return
	}
	t.Parallel()
	cmd := exec.Command(os.Args[0], "-test.run=^TestForcedContainerDoesNotFallBack$", "-test.count=1")
	for _, kv := range os.Environ() {
		if k, _, _ := strings.Cut(kv, "="); k != EnvServer && k != EnvDatabaseURL && k != "DOCKER_HOST" &&
			k != "TESTCONTAINERS_HOST_OVERRIDE" {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Env = append(cmd.Env, envNoEngineChild+"=1", EnvServer+"=container",
		"DOCKER_HOST=unix://"+filepath.Join(t.TempDir(), "no-engine.sock"))
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s", out)
	require.Contains(t, string(out), "no-engine child: pgtest: no PostgreSQL to test against (PGFENCE_TEST_SERVER=container)")
}

// envNoEngineChild makes the test binary TestForcedContainerDoesNotFallBack's child.
const envNoEngineChild = "PGTEST_NO_ENGINE_CHILD"

// TestAutoFallsBackToLocal is TestForcedContainerDoesNotFallBack's negative
// control: it needs the local server binaries, so the container step of CI
// leaves it to the main one.
func TestAutoFallsBackToLocal(t *testing.T) {
	t.Setenv(EnvServer, "")
	t.Setenv(EnvDatabaseURL, "")
	t.Setenv("DOCKER_HOST", "unix://"+filepath.Join(t.TempDir(), "no-engine.sock"))
	s, err := startShared(context.Background(), false)
	require.NoError(t, err)
	defer s.close()
	require.Equal(t, "local", s.Kind)
}
