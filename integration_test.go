package pgfence_test

import (
	"testing"

	"github.com/pgfence/pgfence/internal/pgtest"
)

// The end-to-end tests in this package run against PostgreSQL in Docker
// (testcontainers) when a Docker engine is available, as a user's CI would,
// and against the harness's throwaway cluster otherwise.
func TestMain(m *testing.M) {
	pgtest.MainWithOptions(m, pgtest.Options{PreferDocker: true})
}
