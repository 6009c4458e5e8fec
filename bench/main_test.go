package main

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence/bench/internal/harness"
	"github.com/pgfence/pgfence/bench/internal/stats"
	"github.com/pgfence/pgfence/bench/internal/systems"
)

func TestParseFlagsDefaults(t *testing.T) {
	t.Parallel()
	quick, err := parseFlags([]string{"-quick"})
	require.NoError(t, err)
	require.Equal(t, time.Second, quick.Duration)
	require.Equal(t, 1, quick.Rounds)
	require.Equal(t, int64(10_000), quick.ScaleCycles)
	require.Equal(t, []int{1, 4, 16, 64}, quick.Clients)
	require.Equal(t, []int{1000, 1000000}, quick.ScaleRows)

	full, err := parseFlags(nil)
	require.NoError(t, err)
	require.Equal(t, 5*time.Second, full.Duration)
	require.Equal(t, 3, full.Rounds)
	require.Equal(t, int64(1_000_000), full.ScaleCycles)

	custom, err := parseFlags([]string{"-quick", "-duration", "3s", "-scale-cycles", "42", "-systems", "pglock,raw-2update"})
	require.NoError(t, err)
	require.Equal(t, 3*time.Second, custom.Duration)
	require.Equal(t, int64(42), custom.ScaleCycles)
	require.Equal(t, []string{"pglock", "raw-2update"}, custom.Systems)
}

func TestParseFlagsRejectsBadInput(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{
		{"-clients", "1,x"},
		{"-clients", "0"},
		{"-scenarios", "17"},
		{"-ownership-rounds", "0"},
		{"-observe-clients", "0"},
		{"-scale-names", "2", "-scale-clients", "4"},
		{"-rounds", "-1"},
		{"-pglock-lease", "1ms"},
		{"-write-delay", "-1ms"},
	} {
		_, err := parseFlags(args)
		require.Error(t, err, "%v", args)
	}
}

func cycles(n int64, elapsed, p50, p99 time.Duration) harness.CycleResult {
	return harness.CycleResult{Elapsed: elapsed, Cycles: n, Total: n,
		Cycle: stats.Summary{N: int(n), P50: p50, P99: p99}, Acquire: stats.Summary{N: int(n), P50: p50 / 2, P99: p99 / 2}}
}

func TestRenderReport(t *testing.T) {
	t.Parallel()
	cfg, err := parseFlags([]string{"-quick"})
	require.NoError(t, err)
	res := &results{Started: time.Date(2026, 11, 29, 15, 0, 0, 0, time.UTC), Elapsed: 2 * time.Minute, Args: []string{"-quick"}}
	res.Machine = machineInfo{CPU: "Test CPU", Cores: 2, MemoryGiB: 4, Postgres: map[string]string{"fsync": "on", "server_version": "15.20"}}
	res.Systems = []systemInfo{{Name: "raw-2update", Kind: "ceiling", Note: "two UPDATEs"}, {Name: "pglock", Kind: "peer", Note: "pglock"}}
	for _, c := range []int{1, 16} {
		addCycle(&res.Uncontended, "raw-2update", c, cycles(int64(8000*c), time.Second, time.Millisecond, 4*time.Millisecond))
		addCycle(&res.Uncontended, "pglock", c, cycles(int64(4000*c), time.Second, 2*time.Millisecond, 8*time.Millisecond))
	}
	// A second round for pglock at 16 clients: the report shows the median.
	addCycle(&res.Uncontended, "pglock", 16, cycles(6000*16, time.Second, 2*time.Millisecond, 8*time.Millisecond))
	addPgbench(&res.Pgbench, "pgbench-2update", 16, systems.PgbenchResult{TPS: 7600, LatencyAvg: 2 * time.Millisecond})
	samples := []time.Duration{time.Millisecond, 2 * time.Millisecond, 3 * time.Millisecond}
	res.Handover = []handoverPoint{{System: "pglock", Hold: cfg.HoldShort, Waiters: 8,
		HandoverResult: harness.HandoverResult{Samples: samples, Latency: stats.Summarize(samples)}}}
	addWrite(&res.Writes, "plain UPDATE", 16, harness.WriteResult{Elapsed: time.Second, Writes: 1000})
	addWrite(&res.Writes, "guarded UPDATE", 16, harness.WriteResult{Elapsed: time.Second, Writes: 950})
	res.ScaleStore = []scaleStorage{{System: "raw-2update", Cycles: 100, Elapsed: time.Second,
		Stat: tableStat{Table: "bench_ceiling_leases", HeapBytes: 8192, Updates: 200, HotUpdates: 190}}}
	res.Notes = []string{"something\nodd"}

	files, err := render(res, cfg)
	require.NoError(t, err)
	md := string(files["latest.md"])
	for _, want := range []string{
		"# pgfence benchmarks: latest run",
		"| CPU | Test CPU, 2 cores visible to Go |",
		"| PostgreSQL fsync | on |",
		"## 1. Uncontended acquire+release",
		"| pglock | 4,000 | 80,000 |", // median of 64,000 and 96,000 at 16 clients
		"| pglock | 80,000 | 2.00 ms | 8.00 ms | 1.00 ms | 4.00 ms | 0 | 0.62x | 1.00x |",
		"| pgbench-2update | 7,600 | avg 2.00 ms |",
		"## 2. Hand-over latency",
		"| pglock | 2.00 ms | 3 |",
		"| guarded UPDATE | 950 | ",
		"0.95x |",
		"| raw-2update | bench_ceiling_leases | 100 | 100 | 8.0 KiB | 0 B | 200 | 190 | 95.0% |",
		"- something odd",
	} {
		require.Contains(t, md, want)
	}
	require.NotContains(t, md, "## 3. Contended", "no contended results, no section")
	require.NotContains(t, md, "Hold 1s", "no long-hold results, no table")
	for _, name := range []string{"throughput.svg", "handover-short.svg"} {
		require.True(t, strings.HasPrefix(string(files[name]), "<svg"), name)
	}
	require.NotContains(t, files, "handover-long.svg", "no long-hold results, no chart")
}

func TestRenewalPerThousandPerInterval(t *testing.T) {
	t.Parallel()
	r := renewalResult{Leases: 10_000, Interval: time.Second, Held: 3 * time.Second, Statements: 3}
	require.InDelta(t, 3.0, r.Intervals(), 1e-9)
	require.InDelta(t, 0.1, r.PerThousandPerInterval(), 1e-9) // 1 statement per interval for 10 thousand leases
	require.Zero(t, (&renewalResult{}).PerThousandPerInterval())
}

func TestTargetsAndMisses(t *testing.T) {
	t.Parallel()
	cfg, err := parseFlags([]string{"-quick"})
	require.NoError(t, err)
	res := &results{Started: time.Date(2026, 11, 29, 15, 0, 0, 0, time.UTC)}
	res.Machine = machineInfo{Cores: 2}
	for sys, n := range map[string]int64{
		"raw-2update": 3000, "raw-2update-notify": 1000, "pgfence-leasetable": 950, "pglock": 2000,
		"raw-advisory": 20000, "raw-advisory-token": 15000, "pgfence-advisory": 14500,
		"raw-advisory-xact": 16000, "pgfence-advisory-xact": 12000,
	} {
		addCycle(&res.Uncontended, sys, 16, cycles(n, time.Second, time.Millisecond, 4*time.Millisecond))
	}
	res.WaitEvents = []waitSample{{System: "pgfence-leasetable", Clients: 16, Samples: 10, Active: 100,
		Events: map[string]int{"Lock:object": 86, "CPU": 14}}}
	addWrite(&res.Writes, "plain UPDATE", 16, harness.WriteResult{Elapsed: time.Second, Writes: 1000})
	addWrite(&res.Writes, "fence.Update", 16, harness.WriteResult{Elapsed: time.Second, Writes: 960})
	addWrite(&res.Writes, "fence.Update.UnderLease", 16, harness.WriteResult{Elapsed: time.Second, Writes: 700})
	short := []time.Duration{time.Millisecond, 2 * time.Millisecond}
	res.Handover = []handoverPoint{{System: "pgfence-advisory-xact", Hold: cfg.HoldShort,
		HandoverResult: harness.HandoverResult{Samples: short, Latency: stats.Summarize(short)}}}
	res.Renewal = &renewalResult{Leases: 10_000, TTL: 3 * time.Second, Interval: time.Second, Held: 3 * time.Second, Statements: 4, PgssCalls: 4, LiveAtEnd: 10_000}
	res.AdvisoryConns = []advisoryConns{
		{Config: "defaults (MaxSessions 4)", Locks: 10_000, Sessions: 4, PoolConns: 1, PgLocks: 10_000},
		{Config: "MaxSessions 1", Locks: 10_000, Sessions: 1, PoolConns: 1, PgLocks: 10_000},
	}

	files, err := render(res, cfg)
	require.NoError(t, err)
	md := string(files["latest.md"])
	for _, want := range []string{
		"## Targets (issues 8 and 18)",
		"| leasetable acquire+release vs the two-UPDATE ceiling, 16 clients | ≥ 0.9x | 0.32x (950 vs 3,000 cycles/s) | **missed** |",
		"| advisory (session, with token) vs raw advisory lock/unlock, 16 clients | ≥ 0.7x | 0.72x (14,500 vs 20,000 cycles/s) | met |",
		"| advisory-xact (with token) vs raw xact advisory, 16 clients | ≥ 0.7x | 0.75x (12,000 vs 16,000 cycles/s) | met |",
		"| fence.Update vs plain UPDATE, 16 clients | within 5% (≥ 0.95x) | 0.96x (960 vs 1,000 writes/s) | met |",
		"| fence.Update.UnderLease vs plain UPDATE, 16 clients | within 15% (≥ 0.85x) | 0.70x (700 vs 1,000 writes/s) | **missed** |",
		"| pgfence-advisory-xact hand-over, hold 1ms | p50 < 3 ms, p99 < 15 ms | p50 1.00 ms, p99 2.00 ms (2 hand-overs) | met |",
		"| pgfence-leasetable hand-over, hold 1ms | p50 < 3 ms, p99 < 15 ms | n/a | not measured |",
		"| renewal statements per 1,000 leases per interval | ≤ 1 | 0.133 ",
		"| server connections holding 10,000 advisory locks, defaults (MaxSessions 4) | ≤ 2 | 4 lock sessions",
		"| server connections holding 10,000 advisory locks, MaxSessions 1 | ≤ 2 | 1 lock sessions",
		"## 6. Renewal cost",
		"## 7. Advisory: connections and throughput",
		"## Why targets were missed",
		"### leasetable throughput\n",
		"86% of the active backend observations waited on `Lock:object`",
		"### fenced writes",
		"### advisory connections",
	} {
		require.Contains(t, md, want)
	}
	require.NotContains(t, md, "### advisory throughput", "advisory targets met: no explanation")
}
