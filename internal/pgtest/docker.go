package pgtest

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/testcontainers/testcontainers-go"
	tcpostgres "github.com/testcontainers/testcontainers-go/modules/postgres"
)

// DockerImage is the image the Docker fallback runs.
const DockerImage = "postgres:15-alpine"

// startDocker starts PostgreSQL in a container with testcontainers and
// returns its URL and a function that removes it. testcontainers' reaper
// removes the container even if the test binary is killed.
func startDocker(ctx context.Context) (url string, stop func(), err error) {
	if !dockerReachable(ctx) {
		return "", nil, errNoDocker
	}
	defer func() {
		// testcontainers panics on some provider set-up failures; report
		// them as the error they are.
		if r := recover(); r != nil {
			err = fmt.Errorf("testcontainers: %v", r)
		}
	}()
	ctr, err := tcpostgres.Run(ctx, DockerImage,
		tcpostgres.WithDatabase("postgres"),
		tcpostgres.WithUsername("postgres"),
		tcpostgres.WithPassword("postgres"),
		tcpostgres.BasicWaitStrategies(),
		testcontainers.WithCmdArgs("-c", "fsync=off", "-c", "full_page_writes=off", "-c", "max_connections=400"),
	)
	if err != nil {
		if ctr != nil {
			_ = testcontainers.TerminateContainer(ctr)
		}
		return "", nil, err
	}
	u, err := ctr.ConnectionString(ctx, "sslmode=disable")
	if err != nil {
		_ = testcontainers.TerminateContainer(ctr)
		return "", nil, err
	}
	return u, func() { _ = testcontainers.TerminateContainer(ctr) }, nil
}

// dockerReachable reports whether a Docker engine answers, without letting
// testcontainers spend its long timeouts on a machine that has none.
func dockerReachable(ctx context.Context) (ok bool) {
	if os.Getenv("DOCKER_HOST") == "" {
		if _, err := os.Stat("/var/run/docker.sock"); err != nil {
			return false
		}
	}
	defer func() {
		if recover() != nil {
			ok = false
		}
	}()
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	cli, err := testcontainers.NewDockerClientWithOpts(ctx)
	if err != nil {
		return false
	}
	defer cli.Close()
	return true
}
