package systems

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"time"
)

// PgbenchScript is a custom pgbench script that runs one acquire+release
// cycle per transaction on the client's own name.
type PgbenchScript struct {
	Name   string
	Note   string
	Script string
}

// PgbenchScripts are the ceilings measured with pgbench, in C, without any
// Go client in the path. Each statement autocommits, as in the Go ceilings.
var PgbenchScripts = []PgbenchScript{
	{
		Name: "pgbench-2update",
		Note: "pgbench -M prepared, the raw-2update statements",
		Script: `UPDATE bench_ceiling_leases SET owner = 'pgbench', fence = fence + 1, acquired_at = now(), expires_at = now() + interval '30 seconds' WHERE name = 'pgbench-' || :client_id AND expires_at <= now();
UPDATE bench_ceiling_leases SET expires_at = '-infinity' WHERE name = 'pgbench-' || :client_id AND owner = 'pgbench';
`,
	},
	{
		Name: "pgbench-advisory",
		Note: "pgbench -M prepared, pg_try_advisory_lock + pg_advisory_unlock",
		Script: `SELECT pg_try_advisory_lock(:client_id + 1000000);
SELECT pg_advisory_unlock(:client_id + 1000000);
`,
	},
}

// PgbenchNames returns the lock names the 2-UPDATE script uses for clients
// clients; the ceiling's Prepare must create them first.
func PgbenchNames(clients int) []string {
	out := make([]string, clients)
	for i := range out {
		out[i] = "pgbench-" + strconv.Itoa(i)
	}
	return out
}

// PgbenchResult is what one pgbench run reported.
type PgbenchResult struct {
	TPS        float64       // transactions (cycles) per second, without connection time
	LatencyAvg time.Duration // average latency of a transaction
}

var (
	tpsRe = regexp.MustCompile(`tps = ([0-9.]+) \(without initial connection time\)`)
	latRe = regexp.MustCompile(`latency average = ([0-9.]+) ms`)
)

// RunPgbench runs pgbench with the script for duration (whole seconds,
// rounded up) and clients connections, against databaseURL.
func RunPgbench(ctx context.Context, bin, databaseURL string, s PgbenchScript, clients int, duration time.Duration) (PgbenchResult, error) {
	dir, err := os.MkdirTemp("", "pgfence-bench-pgbench-")
	if err != nil {
		return PgbenchResult{}, err
	}
	defer os.RemoveAll(dir)
	file := filepath.Join(dir, s.Name+".sql")
	if err := os.WriteFile(file, []byte(s.Script), 0o644); err != nil {
		return PgbenchResult{}, err
	}
	secs := int((duration + time.Second - 1) / time.Second)
	if secs < 1 {
		secs = 1
	}
	threads := clients
	if threads > 4 {
		threads = 4
	}
	cmd := exec.CommandContext(ctx, bin, "-n", "-M", "prepared", "-f", file,
		"-c", strconv.Itoa(clients), "-j", strconv.Itoa(threads), "-T", strconv.Itoa(secs), databaseURL)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return PgbenchResult{}, fmt.Errorf("pgbench: %w\n%s", err, out)
	}
	return ParsePgbench(out)
}

// ParsePgbench extracts tps and the average latency from pgbench's output.
func ParsePgbench(out []byte) (PgbenchResult, error) {
	m := tpsRe.FindSubmatch(out)
	if m == nil {
		return PgbenchResult{}, fmt.Errorf("pgbench: no tps in output:\n%s", out)
	}
	tps, err := strconv.ParseFloat(string(m[1]), 64)
	if err != nil {
		return PgbenchResult{}, fmt.Errorf("pgbench: tps %q: %w", m[1], err)
	}
	res := PgbenchResult{TPS: tps}
	if m := latRe.FindSubmatch(out); m != nil {
		if ms, err := strconv.ParseFloat(string(m[1]), 64); err == nil {
			res.LatencyAvg = time.Duration(ms * float64(time.Millisecond))
		}
	}
	return res, nil
}
