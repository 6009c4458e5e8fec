package systems_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence/bench/internal/systems"
)

func TestParsePgbench(t *testing.T) {
	t.Parallel()
	out := []byte(`transaction type: /tmp/x.sql
scaling factor: 1
query mode: prepared
number of clients: 16
number of threads: 4
duration: 2 s
number of transactions actually processed: 15230
latency average = 2.101 ms
initial connection time = 12.345 ms
tps = 7615.123456 (without initial connection time)
`)
	res, err := systems.ParsePgbench(out)
	require.NoError(t, err)
	require.InDelta(t, 7615.123456, res.TPS, 1e-9)
	require.Equal(t, 2101*time.Microsecond, res.LatencyAvg)

	_, err = systems.ParsePgbench([]byte("pgbench: error: connection refused"))
	require.ErrorContains(t, err, "no tps")
}

func TestAdvisoryKeyIsStable(t *testing.T) {
	t.Parallel()
	require.Equal(t, systems.AdvisoryKey("account:42"), systems.AdvisoryKey("account:42"))
	require.NotEqual(t, systems.AdvisoryKey("account:42"), systems.AdvisoryKey("account:43"))
	require.Equal(t, []string{"pgbench-0", "pgbench-1"}, systems.PgbenchNames(2))
}
