//go:build containers

package pgtest

import (
	"bufio"
	"context"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/moby/moby/client"
	"github.com/stretchr/testify/require"
)

// The tests in this file need a container engine and run in the container
// step of CI (.ci/testcontainers-check, build tag "containers"), with
// TESTCONTAINERS_RYUK_DISABLED=true: they check the harness's own cleanup,
// which Ryuk would otherwise race.

// envOwnerChild makes the test binary a container's owner that prints the
// container's id and waits to be killed.
const envOwnerChild = "PGTEST_CONTAINER_OWNER_CHILD"

// TestContainerCleanup starts two test binaries that own a container each
// and checks what happens to their containers: killed with SIGKILL, the
// owner leaves its container (the negative control: nothing else removes
// it), and the next sweep removes it while it keeps the container of the
// owner that still runs; sent SIGTERM, the owner removes its own.
func TestContainerCleanup(t *testing.T) {
	if os.Getenv(envOwnerChild) == "1" {
		ownContainerUntilKilled(t)
		return
	}
	require.Equal(t, "true", os.Getenv("TESTCONTAINERS_RYUK_DISABLED"),
		"this test checks the harness's cleanup without testcontainers' reaper: set TESTCONTAINERS_RYUK_DISABLED=true")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cli, err := engineClient(ctx)
	require.NoError(t, err)
	// Cleanups run last first: the sweep, then the client's close.
	t.Cleanup(func() { _ = cli.Close() })
	exists := func(id string) bool {
		t.Helper()
		list, err := cli.ContainerList(ctx, client.ContainerListOptions{All: true, Filters: make(client.Filters).Add("id", id)})
		require.NoError(t, err)
		return len(list.Items) == 1
	}
	t.Cleanup(func() { _, _ = sweepContainers(context.Background(), cli) })

	killed, killedID := startOwner(t)
	running, runningID := startOwner(t)
	require.True(t, exists(killedID))
	require.True(t, exists(runningID))

	require.NoError(t, killed.Process.Kill())
	require.Error(t, killed.Wait())
	require.True(t, exists(killedID), "negative control: a killed owner's container stays until a sweep")

	removed, err := sweepContainers(ctx, cli)
	require.NoError(t, err)
	require.Contains(t, removed, killedID)
	require.NotContains(t, removed, runningID, "the sweep must keep a running owner's container")
	require.False(t, exists(killedID))
	require.True(t, exists(runningID))

	require.NoError(t, running.Process.Signal(syscall.SIGTERM))
	err = running.Wait()
	require.Error(t, err)
	status := running.ProcessState.Sys().(syscall.WaitStatus)
	require.True(t, status.Signaled() && status.Signal() == syscall.SIGTERM,
		"the owner goes on to die of SIGTERM after removing its container: %v", err)
	require.False(t, exists(runningID), "an owner sent SIGTERM removes its container")
}

// startOwner starts the test binary as a container's owner and returns it
// with its container's id, once the container serves.
func startOwner(t *testing.T) (*exec.Cmd, string) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestContainerCleanup$", "-test.count=1")
	cmd.Env = append(os.Environ(), envOwnerChild+"=1")
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
	})
	lines := bufio.NewScanner(out)
	for lines.Scan() {
		if id, ok := strings.CutPrefix(lines.Text(), "pgtest-container "); ok {
			go func() { // drain, so the child never blocks on its output
				for lines.Scan() {
				}
			}()
			return cmd, id
		}
	}
	t.Fatalf("owner exited without starting a container: %v", lines.Err())
	return nil, ""
}

// ownContainerUntilKilled is the owner's side: a container that serves,
// then a wait of at most two minutes for the parent to kill it.
func ownContainerUntilKilled(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, err := StartContainer(ctx, true)
	require.NoError(t, err)
	defer c.Remove()
	s := &Server{Kind: "docker", AdminURL: c.URL, TCPURL: c.URL, Container: c, stop: func() {}}
	require.NoError(t, s.init(ctx))
	defer s.admin.Close()
	os.Stdout.WriteString("pgtest-container " + c.ID + "\n")
	<-ctx.Done()
}
