//go:build tools

// This file needs PgBouncer on the machine: it runs under the "tools" build
// tag (make tools-ci, which CI runs), so that go test ./... passes with only
// the PostgreSQL server binaries.

package doctor_test

import (
	"fmt"
	"os"
	"os/exec"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence/doctor"
	"github.com/pgfence/pgfence/internal/pgtest"
)

// The pooler check through a real PgBouncer: transaction pooling (with a
// pool of one server connection and of two) is a warning; session pooling
// is seen as a pooler and accepted. The control is TestLocalServer's
// direct connection, reported as no pooler.
func TestPoolerBehindPgBouncer(t *testing.T) {
	t.Parallel()
	if _, err := exec.LookPath("pgbouncer"); err != nil {
		_, err := os.Stat("/usr/sbin/pgbouncer")
		require.NoError(t, err, "pgbouncer is needed for this test (apt-get install pgbouncer)")
	}
	for _, c := range []struct {
		mode string
		size int
		want doctor.Level
		says string
	}{
		{"transaction", 2, doctor.Warn, "transaction pooler"},
		{"transaction", 1, doctor.Warn, "transaction pooler"},
		{"session", 2, doctor.OK, "session pooler"},
		{"session", 1, doctor.OK, "session pooler"},
	} {
		t.Run(fmt.Sprintf("%s-%d", c.mode, c.size), func(t *testing.T) {
			t.Parallel()
			db := pgtest.NewDB(t)
			cc, err := pgx.ParseConfig(db.TCPURL)
			require.NoError(t, err)
			b, err := pgtest.StartPgBouncer(t.Context(), pgtest.PgBouncerConfig{ServerPort: int(cc.Port), Password: cc.Password,
				PoolMode: c.mode, PoolSize: c.size})
			require.NoError(t, err)
			t.Cleanup(func() {
				if t.Failed() {
					t.Logf("pgbouncer log:\n%s", b.Log())
				}
				b.Close()
			})
			p := check(t, b.URL(db.Name), nil)["pooler"]
			require.Equal(t, c.want, p.Level, p.Detail)
			require.Contains(t, p.Detail, c.says)
		})
	}
}
