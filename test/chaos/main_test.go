package chaos_test

import (
	"testing"

	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/test/chaos"
)

func TestMain(m *testing.M) {
	// A re-executed test binary running as a child holder never returns.
	chaos.ChildMain()
	pgtest.Main(m)
}
