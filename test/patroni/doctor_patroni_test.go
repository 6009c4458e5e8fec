//go:build patroni

package patroni_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence/doctor"
	"github.com/pgfence/pgfence/migrations"
	"github.com/pgfence/pgfence/test/patroni"
)

// TestDoctorOnPatroni runs pgfence's doctor on a Patroni cluster: with
// asynchronous replication the leader's replication check warns (its two
// replicas are asynchronous); with synchronous_mode it is ok (the control);
// a replica fails the standby check.
func TestDoctorOnPatroni(t *testing.T) {
	t.Parallel()
	for _, sync := range []bool{false, true} {
		t.Run(fmt.Sprintf("synchronous=%t", sync), func(t *testing.T) {
			ctx := t.Context()
			c, err := patroni.Start(ctx, &patroni.Options{Synchronous: sync, Logf: t.Logf})
			require.NoError(t, err)
			t.Cleanup(c.Close)
			url := c.URL(patroni.Database, connectTimeout)
			require.NoError(t, migrations.Up(ctx, migrations.Target{URL: url}, nil))

			check := func(url string) map[string]doctor.Finding {
				t.Helper()
				cc, err := pgx.ParseConfig(url)
				require.NoError(t, err)
				r, err := doctor.Check(ctx, cc, nil)
				require.NoError(t, err)
				by := map[string]doctor.Finding{}
				for _, f := range r.Findings {
					by[f.Check] = f
					t.Logf("%s %s: %s", f.Level, f.Check, f.Detail)
				}
				return by
			}
			primary := check(url)
			require.Equal(t, doctor.OK, primary["standby"].Level)
			if sync {
				require.Equal(t, doctor.OK, primary["replication"].Level, primary["replication"].Detail)
			} else {
				require.Equal(t, doctor.Warn, primary["replication"].Level, primary["replication"].Detail)
			}
			leader := c.Leader(ctx)
			require.NotNil(t, leader)
			for _, n := range c.Nodes {
				if n != leader {
					require.Eventually(t, func() bool { return check(n.URL(patroni.Database))["standby"].Level == doctor.Fail },
						30*time.Second, time.Second, "replica %s", n.Name)
					break
				}
			}
		})
	}
}
