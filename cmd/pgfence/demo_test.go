package main_test

import (
	"context"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence/advisory"
	"github.com/pgfence/pgfence/internal/pgtest"
)

// requireStory checks the demo's output for the story's key events.
func requireStory(t *testing.T, r result) {
	t.Helper()
	require.Equal(t, 0, r.code, "stdout: %s\nstderr: %s", r.stdout, r.stderr)
	for _, want := range []string{
		"worker-A  worker-A #",
		"SIGSTOP worker-A (pid ",
		"state T (stopped)",
		"REJECTED (pgfence.ErrFenced)",
		"row: balance 150, fence_token ",
		"unfenced write accepted: balance 150 -> 110",
		"with fencing:    worker-A's stale write (token ",
		"without fencing: the same write was accepted; balance 150 -> 110: worker-B's +50 is lost",
	} {
		require.Contains(t, r.stdout, want)
	}
	m := regexp.MustCompile(`presented token (\d+), row has token (\d+)`).FindStringSubmatch(r.stdout)
	require.NotNil(t, m, r.stdout)
	presented, err := strconv.ParseInt(m[1], 10, 64)
	require.NoError(t, err)
	current, err := strconv.ParseInt(m[2], 10, 64)
	require.NoError(t, err)
	require.Less(t, presented, current, "the paused worker's token is older")
}

// readmeDemo returns the demo output that README.md shows, as one pattern
// per line: what varies from run to run (elapsed times, pids, the wait,
// column padding) is matched loosely, everything else exactly.
func readmeDemo(t *testing.T) []*regexp.Regexp {
	t.Helper()
	readme, err := os.ReadFile("../../README.md")
	require.NoError(t, err)
	m := regexp.MustCompile("(?s)go run ./cmd/pgfence demo\n```\n.*?```\n(.*?)```").FindSubmatch(readme)
	require.NotNil(t, m, "README shows the demo's output after its command")
	variable := regexp.MustCompile(`\+\d+\.\d+s|pid \d+|after \d+(\.\d+)?s|\s+`)
	loose := func(v string) string {
		switch {
		case strings.HasPrefix(v, "+"):
			return `\+\d+\.\d+s`
		case strings.HasPrefix(v, "pid"):
			return `pid \d+`
		case strings.HasPrefix(v, "after"):
			return `after \d+(\.\d+)?s`
		default:
			return `\s+`
		}
	}
	var lines []*regexp.Regexp
	for _, l := range strings.Split(strings.TrimSpace(string(m[1])), "\n") {
		l = strings.TrimSpace(l)
		if l == "" {
			continue
		}
		var b strings.Builder
		last := 0
		for _, loc := range variable.FindAllStringIndex(l, -1) {
			b.WriteString(regexp.QuoteMeta(l[last:loc[0]]) + loose(l[loc[0]:loc[1]]))
			last = loc[1]
		}
		b.WriteString(regexp.QuoteMeta(l[last:]))
		lines = append(lines, regexp.MustCompile("^"+b.String()+"$"))
	}
	require.GreaterOrEqual(t, len(lines), 8, "README shows the story")
	return lines
}

// readmeDemoMissing returns the first README line (pattern) that is not a
// line of stdout in the README's order, or nil when every one is.
func readmeDemoMissing(lines []*regexp.Regexp, stdout string) *regexp.Regexp {
	out := strings.Split(stdout, "\n")
	i := 0
	for _, want := range lines {
		for i < len(out) && !want.MatchString(strings.TrimSpace(out[i])) {
			i++
		}
		if i == len(out) {
			return want
		}
		i++
	}
	return nil
}

// requireReadmeDemo checks that the README's demo output is what the demo
// printed to stdout.
func requireReadmeDemo(t *testing.T, stdout string) {
	t.Helper()
	missing := readmeDemoMissing(readmeDemo(t), stdout)
	require.Nil(t, missing, "README's demo line is not in the output, in order:\n%s", stdout)
}

func schemaExists(t *testing.T, db *pgtest.DB) bool {
	t.Helper()
	var ok bool
	require.NoError(t, db.Pool.QueryRow(context.Background(),
		"SELECT pg_catalog.to_regnamespace('pgfence_demo') IS NOT NULL").Scan(&ok))
	return ok
}

func TestDemoOnAGivenDatabase(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDB(t)
	r := pgfence(t, nil, "", "demo", "--database", db.URL)
	requireStory(t, r)
	requireReadmeDemo(t, r.stdout) // a fresh install: the README's tokens 1 and 1025
	// Controls on this output: other tokens, or the story out of order, fail.
	lines := readmeDemo(t)
	require.NotNil(t, readmeDemoMissing(lines, strings.ReplaceAll(r.stdout, "1025", "2049")))
	out := strings.Split(r.stdout, "\n")
	slices.Reverse(out)
	require.NotNil(t, readmeDemoMissing(lines, strings.Join(out, "\n")))
	require.Contains(t, r.stdout, "using the database from --database")
	require.NotContains(t, r.stdout, db.URL, "the URL (and a password in it) is not printed")
	require.Contains(t, r.stdout, "cleaned up: dropped schema pgfence_demo")
	require.False(t, schemaExists(t, db), "the demo's schema is dropped")
	var held bool
	require.NoError(t, db.Pool.QueryRow(context.Background(),
		"SELECT pg_catalog.bool_or(expires_at > pg_catalog.now()) FROM pgfence.pgfence_leases WHERE name LIKE 'pgfence-demo:%'").Scan(&held))
	require.False(t, held, "the demo's lease is released (its row stays for pgfence prune)")

	// DATABASE_URL is used too.
	r = pgfence(t, dbEnv(db), "", "demo")
	requireStory(t, r)
	require.Contains(t, r.stdout, "using the database from DATABASE_URL")
}

// A second demo on a database where one is running stops at once, and
// touches nothing: no schema, no account reset, no lease row.
func TestDemoRefusesADatabaseWhereADemoRuns(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDB(t)
	running := db.Conn(t) // stands in for the running demo's session
	ctx := context.Background()
	key := advisory.Name("pgfence-demo").Int64()
	_, err := running.Exec(ctx, "SELECT pg_advisory_lock($1)", key)
	require.NoError(t, err)

	r := pgfence(t, nil, "", "demo", "--database", db.URL)
	require.Equal(t, 1, r.code, "stdout: %s\nstderr: %s", r.stdout, r.stderr)
	require.Contains(t, r.stderr, "another pgfence demo is running on this database")
	require.False(t, schemaExists(t, db), "nothing was created")
	require.NotContains(t, r.stdout, "cleaned up: dropped schema", "nothing was dropped")

	// Once the running demo ends, a demo plays out.
	_, err = running.Exec(ctx, "SELECT pg_advisory_unlock($1)", key)
	require.NoError(t, err)
	requireStory(t, pgfence(t, nil, "", "demo", "--database", db.URL))
}

func TestDemoStartsItsOwnDatabase(t *testing.T) {
	t.Parallel()
	r := pgfence(t, nil, "", "demo")
	requireStory(t, r)
	require.Contains(t, r.stdout, "no --database or DATABASE_URL: starting a throwaway PostgreSQL")
	require.Contains(t, r.stdout, "cleaned up: throwaway PostgreSQL stopped and removed")
}

func TestDemoCleansUpOnSIGINT(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDB(t)
	b := startPgfence(t, nil, "demo", "--database", db.URL)
	var pids []int
	for {
		line := b.line(t)
		if m := regexp.MustCompile(`started worker-A \(pid (\d+)\) and worker-B \(pid (\d+)\)`).FindStringSubmatch(line); m != nil {
			for _, s := range m[1:] {
				pid, err := strconv.Atoi(s)
				require.NoError(t, err)
				pids = append(pids, pid)
			}
		}
		if strings.Contains(line, "SIGSTOP worker-A") {
			break
		}
	}
	require.Len(t, pids, 2)
	require.True(t, schemaExists(t, db))
	require.NoError(t, b.cmd.Process.Signal(syscall.SIGINT))
	require.Equal(t, 130, b.wait(t), "128+SIGINT, as a shell reports Ctrl-C")
	require.Contains(t, b.stderr.String(), "pgfence demo: interrupted; cleaned up")
	require.False(t, schemaExists(t, db), "the demo's schema is dropped")
	for _, pid := range pids {
		require.Eventually(t, func() bool { return !processAlive(pid) },
			time.Minute, 10*time.Millisecond, "worker %d is gone", pid)
	}
}

func TestDemoUsage(t *testing.T) {
	t.Parallel()
	r := pgfence(t, nil, "", "demo", "extra")
	require.Equal(t, 2, r.code)
	require.Contains(t, r.stderr, `unexpected argument "extra"`)
	r = pgfence(t, nil, "", "demo", "--database", "postgres://x:notaport/db")
	require.Equal(t, 2, r.code)
	require.Contains(t, r.stderr, "invalid database in --database")
	r = pgfence(t, nil, "", "demo-worker")
	require.Equal(t, 2, r.code)
	require.Contains(t, r.stderr, "internal command of 'pgfence demo'")
}

// processAlive reports whether pid runs (a zombie does not count).
func processAlive(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	return len(f) > 0 && f[0] != "Z" && f[0] != "X"
}

// The README check can fail: a line the demo no longer prints, or printed
// out of order, is caught.
func TestReadmeDemoCheckFails(t *testing.T) {
	t.Parallel()
	lines := readmeDemo(t)
	good := "  +2.279s  worker-A  worker-A #1       acquired pgfence-demo:account:42: token 1, TTL 2s, renewed every 667ms"
	require.True(t, lines[1].MatchString(strings.TrimSpace(good)), "%s", lines[1])
	stale := strings.Replace(good, "token 1,", "token 2,", 1)
	require.False(t, lines[1].MatchString(strings.TrimSpace(stale)), "a changed token is caught")
	require.NotNil(t, readmeDemoMissing(lines, "nothing of the story"), "output without the story fails the check")
}
