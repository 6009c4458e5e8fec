package fencehttp_test

import (
	"os"
	"testing"

	"github.com/pgfence/pgfence/internal/pgtest"
)

// TestMain runs the tests under pgtest, or, when childEnv is set, one of
// the processes of TestPausedHolderLateWrite.
func TestMain(m *testing.M) {
	if role := os.Getenv(childEnv); role != "" {
		os.Exit(runChild(role))
	}
	pgtest.Main(m)
}
