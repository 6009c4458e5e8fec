package pgtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"os"
	"os/signal"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/api/types/network"
	"github.com/moby/moby/client"
	"github.com/testcontainers/testcontainers-go"
	tcpostgres "github.com/testcontainers/testcontainers-go/modules/postgres"

	"github.com/pgfence/pgfence/internal/pgserver"
)

// DockerImage is the image the container path runs unless EnvImage names
// another: the official postgres image.
const DockerImage = "postgres:15-alpine"

// EnvImage names the environment variable that picks the image the
// container path runs instead of DockerImage. It must behave as the
// official postgres image does (POSTGRES_USER, POSTGRES_PASSWORD,
// "postgres -c name=value" arguments), as pgfence's CI image built by
// .ci/pg-image does.
const EnvImage = "PGFENCE_TEST_IMAGE"

// EnvContainerNetwork names the environment variable that sets the
// container's network mode (Docker's --network), when the engine's
// default does not suit: pgfence's CI sets "slirp4netns" on podman, so
// that the host reaches the server on loopback alone.
const EnvContainerNetwork = "PGFENCE_TEST_CONTAINER_NETWORK"

// The labels on every container the harness starts: the owner is the test
// binary, named by host, boot, pid and the pid's start time (so that a
// reused pid is not taken for the owner).
const (
	labelHarness    = "io.pgfence.pgtest"
	labelOwnerHost  = "io.pgfence.pgtest.host"
	labelOwnerBoot  = "io.pgfence.pgtest.boot"
	labelOwnerPid   = "io.pgfence.pgtest.pid"
	labelOwnerStart = "io.pgfence.pgtest.start"
)

// Container is PostgreSQL in a container that [StartContainer] started.
type Container struct {
	// Image is the image it runs.
	Image string
	// ID is the container's id.
	ID string
	// URL connects to its maintenance database as the postgres superuser,
	// over the port the engine published. It carries a password made for
	// the container, which the server does not ask for (it trusts every
	// role: see StartContainer); tests give it to the roles they create.
	URL string

	ctr        *tcpostgres.PostgresContainer
	removeOnce sync.Once
	stopSig    chan struct{}
	sigDone    chan struct{}
}

// StartContainer starts PostgreSQL in a container through testcontainers'
// postgres module, on the engine that DOCKER_HOST (or testcontainers'
// configuration, or the default socket) names: Docker Engine, Docker
// Desktop, or podman's Docker API. It runs EnvImage's image, else
// DockerImage, with the settings of the harness's local clusters.
//
// Like the local clusters' sockets, the server trusts every role the tests
// create (POSTGRES_HOST_AUTH_METHOD=trust): the tests log in as roles they
// made without a password. So its port is published on 127.0.0.1 only,
// unless the engine's host is not this one's loopback (DOCKER_HOST over
// TCP or SSH, TESTCONTAINERS_HOST_OVERRIDE set to another address, or a
// test binary that runs in a container itself and reaches a sibling),
// where it is published as the engine publishes by default: run such
// engines only on a network nobody else reaches.
//
// Cleanup does not depend on testcontainers' reaper (Ryuk), whose image
// may not be at hand (TESTCONTAINERS_RYUK_DISABLED=true turns it off;
// where it runs it is one more safety net):
//   - Remove removes the container; the shared server's is removed when
//     the tests end, and when the test binary gets SIGINT or SIGTERM.
//   - A test binary that is killed (SIGKILL, a panic, go test's timeout)
//     cannot remove its container: each container is labelled with its
//     owner's host, boot, pid and the pid's start time, and StartContainer
//     first removes every container of this host whose owner is gone. So
//     a killed run's container lives until the next run on that host
//     (or `docker rm -f $(docker ps -aq --filter label=io.pgfence.pgtest)`).
//
// Without forced, StartContainer gives up at once when neither
// DOCKER_HOST, the default socket nor testcontainers' configuration file
// exists, so that a machine without an engine does not wait on
// testcontainers' timeouts.
func StartContainer(ctx context.Context, forced bool) (c *Container, err error) {
	if !forced && !engineConfigured() {
		return nil, errors.New("no container engine: DOCKER_HOST is not set, there is no " +
			"/var/run/docker.sock and no ~/.testcontainers.properties")
	}
	defer func() {
		// testcontainers panics on some provider set-up failures; report
		// them as the error they are.
		if r := recover(); r != nil {
			err = fmt.Errorf("testcontainers: %v", r)
		}
	}()
	pingCtx := ctx
	if !forced {
		// Auto mode: an engine that does not answer soon is no engine.
		var cancel context.CancelFunc
		pingCtx, cancel = context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
	}
	cli, err := engineClient(pingCtx)
	if err != nil {
		return nil, err
	}
	if _, err := sweepContainers(ctx, cli); err != nil {
		fmt.Fprintf(os.Stderr, "pgtest: removing the containers of test binaries that are gone: %v\n", err)
	}
	_ = cli.Close()

	image := os.Getenv(EnvImage)
	if image == "" {
		image = DockerImage
	}
	var pw [16]byte
	_, _ = rand.Read(pw[:])
	password := hex.EncodeToString(pw[:])
	settings := pgserver.DefaultSettings()
	keys := make([]string, 0, len(settings))
	for k := range settings {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	args := make([]string, 0, 2*len(keys))
	for _, k := range keys {
		args = append(args, "-c", k+"="+settings[k])
	}
	networkMode := os.Getenv(EnvContainerNetwork)
	loopback := publishOnLoopback()
	ctr, err := tcpostgres.Run(ctx, image,
		tcpostgres.WithDatabase("postgres"),
		tcpostgres.WithUsername("postgres"),
		tcpostgres.WithPassword(password),
		tcpostgres.BasicWaitStrategies(),
		testcontainers.WithEnv(map[string]string{"POSTGRES_HOST_AUTH_METHOD": "trust"}),
		testcontainers.WithCmdArgs(args...),
		testcontainers.WithLabels(ownerLabels()),
		testcontainers.WithHostConfigModifier(func(hc *container.HostConfig) {
			if networkMode != "" {
				hc.NetworkMode = container.NetworkMode(networkMode)
			}
			if loopback {
				hc.PortBindings = network.PortMap{pgPort: {{HostIP: netip.MustParseAddr("127.0.0.1")}}}
			}
		}),
	)
	if err != nil {
		if ctr != nil {
			_ = testcontainers.TerminateContainer(ctr)
		}
		return nil, fmt.Errorf("image %s: %w", image, err)
	}
	u, err := ctr.ConnectionString(ctx, "sslmode=disable")
	if err != nil {
		_ = testcontainers.TerminateContainer(ctr)
		return nil, err
	}
	c = &Container{Image: image, ID: ctr.GetContainerID(), URL: loopbackURL(u), ctr: ctr}
	c.removeOnSignal()
	return c, nil
}

// Remove stops and removes the container. It may be called more than once.
func (c *Container) Remove() {
	c.removeOnce.Do(func() {
		close(c.stopSig)
		<-c.sigDone
		_ = testcontainers.TerminateContainer(c.ctr)
	})
}

// removeOnSignal removes the container when the process gets SIGINT or
// SIGTERM, then lets the signal do what it would have done.
func (c *Container) removeOnSignal() {
	c.stopSig, c.sigDone = make(chan struct{}), make(chan struct{})
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	go func() {
		defer close(c.sigDone)
		defer signal.Stop(sigs)
		select {
		case <-c.stopSig:
		case sig := <-sigs:
			fmt.Fprintf(os.Stderr, "pgtest: %v: removing container %.12s\n", sig, c.ID)
			_ = testcontainers.TerminateContainer(c.ctr)
			signal.Reset(sig)
			_ = syscall.Kill(os.Getpid(), sig.(syscall.Signal))
		}
	}()
}

// pgPort is the server's port in the container.
var pgPort = network.MustParsePort("5432/tcp")

// publishOnLoopback reports whether the engine's published ports are
// reached on this host's loopback, as testcontainers works out the host
// it connects to: TESTCONTAINERS_HOST_OVERRIDE, else DOCKER_HOST's host
// for TCP, else localhost, unless the test binary runs in a container
// (testcontainers then connects to the default network's gateway).
func publishOnLoopback() bool {
	if h := os.Getenv("TESTCONTAINERS_HOST_OVERRIDE"); h != "" {
		if h == "localhost" {
			return true
		}
		ip, err := netip.ParseAddr(h)
		return err == nil && ip.IsLoopback()
	}
	if h := os.Getenv("DOCKER_HOST"); h != "" && !strings.HasPrefix(h, "unix://") && !strings.HasPrefix(h, "npipe://") {
		return false
	}
	for _, f := range []string{"/.dockerenv", "/run/.containerenv"} {
		if _, err := os.Stat(f); err == nil {
			return false
		}
	}
	return true
}

// loopbackURL replaces "localhost" in u by 127.0.0.1: engines publish
// ports on IPv4, and localhost may resolve to ::1 first.
func loopbackURL(u string) string {
	p, err := url.Parse(u)
	if err != nil || p.Hostname() != "localhost" {
		return u
	}
	p.Host = net.JoinHostPort("127.0.0.1", p.Port())
	return p.String()
}

// engineConfigured reports whether any container engine is configured
// where testcontainers looks first.
func engineConfigured() bool {
	if os.Getenv("DOCKER_HOST") != "" || os.Getenv("TESTCONTAINERS_HOST_OVERRIDE") != "" {
		return true
	}
	paths := []string{"/var/run/docker.sock"}
	if home, err := os.UserHomeDir(); err == nil {
		paths = append(paths, filepath.Join(home, ".testcontainers.properties"),
			filepath.Join(home, ".docker", "run", "docker.sock"))
	}
	for _, p := range paths {
		if _, err := os.Stat(p); err == nil {
			return true
		}
	}
	return false
}

// engineClient connects to the engine testcontainers uses and checks
// that it answers before ctx ends. (A busy podman has been seen to take
// over 10s to answer its first request on a machine loaded 10 times over.)
func engineClient(ctx context.Context) (cli *testcontainers.DockerClient, err error) {
	defer func() {
		// testcontainers panics when it cannot make out the engine's socket.
		if r := recover(); r != nil {
			cli, err = nil, fmt.Errorf("no container engine (DOCKER_HOST=%q): testcontainers: %v", os.Getenv("DOCKER_HOST"), r)
		}
	}()
	cli, err = testcontainers.NewDockerClientWithOpts(ctx)
	if err != nil {
		return nil, fmt.Errorf("no container engine (DOCKER_HOST=%q): %w", os.Getenv("DOCKER_HOST"), err)
	}
	if _, err := cli.Ping(ctx, client.PingOptions{NegotiateAPIVersion: true}); err != nil {
		_ = cli.Close()
		return nil, fmt.Errorf("no container engine answers (DOCKER_HOST=%q): %w", os.Getenv("DOCKER_HOST"), err)
	}
	return cli, nil
}

// owner names a test binary: the values of the owner labels.
type owner struct {
	host, boot, pid, start string
}

// self is the running process as an owner.
func self() owner {
	host, _ := os.Hostname()
	pid := os.Getpid()
	return owner{host: host, boot: bootID(), pid: strconv.Itoa(pid), start: processStart(pid)}
}

func ownerLabels() map[string]string {
	o := self()
	return map[string]string{
		labelHarness:    "1",
		labelOwnerHost:  o.host,
		labelOwnerBoot:  o.boot,
		labelOwnerPid:   o.pid,
		labelOwnerStart: o.start,
	}
}

func ownerOf(labels map[string]string) owner {
	return owner{host: labels[labelOwnerHost], boot: labels[labelOwnerBoot],
		pid: labels[labelOwnerPid], start: labels[labelOwnerStart]}
}

// gone reports whether o, seen from a process on host, boot id boot, is a
// process that no longer runs. It answers false whenever it cannot tell:
// another host's containers, or labels it does not understand, are never
// taken for a dead owner's. start looks up a running pid's start time ("" when unknown).
func (o owner) gone(host, boot string, alive func(pid int) bool, start func(pid int) string) bool {
	if o.host == "" || o.host != host {
		return false
	}
	pid, err := strconv.Atoi(o.pid)
	if err != nil || pid <= 0 {
		return false
	}
	if o.boot != "" && boot != "" && o.boot != boot {
		return true // the host rebooted since: no process of then runs
	}
	if !alive(pid) {
		return true
	}
	if o.start == "" {
		return false
	}
	s := start(pid)
	return s != "" && s != o.start // the pid was reused
}

// pidAlive reports whether a process with that pid runs (a process of
// another user counts).
func pidAlive(pid int) bool {
	err := syscall.Kill(pid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}

// processStart returns a process's start time in clock ticks since boot
// (field 22 of /proc/PID/stat), or "" where there is no /proc.
func processStart(pid int) string {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return ""
	}
	// The command name, field 2, is in parentheses and may hold spaces.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return ""
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 20 {
		return ""
	}
	return f[19]
}

// bootID returns the kernel's boot id, or "" where there is none.
func bootID() string {
	b, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

// sweepContainers removes the harness's containers on this host whose
// owner is gone, and returns their ids.
func sweepContainers(ctx context.Context, cli *testcontainers.DockerClient) ([]string, error) {
	me := self()
	list, err := cli.ContainerList(ctx, client.ContainerListOptions{
		All:     true,
		Filters: make(client.Filters).Add("label", labelHarness+"=1", labelOwnerHost+"="+me.host),
	})
	if err != nil {
		return nil, err
	}
	var removed []string
	var errs []error
	for _, ctr := range list.Items {
		if !ownerOf(ctr.Labels).gone(me.host, me.boot, pidAlive, processStart) {
			continue
		}
		_, err := cli.ContainerRemove(ctx, ctr.ID, client.ContainerRemoveOptions{Force: true, RemoveVolumes: true})
		if err != nil {
			errs = append(errs, fmt.Errorf("remove %.12s: %w", ctr.ID, err))
			continue
		}
		removed = append(removed, ctr.ID)
	}
	return removed, errors.Join(errs...)
}
