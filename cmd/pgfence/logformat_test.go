package main_test

import (
	"encoding/json"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence/internal/pgtest"
)

// jsonLines decodes standard error as one JSON object a line, failing on a
// line that is not one.
func jsonLines(t *testing.T, s string) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, line := range strings.Split(strings.TrimSpace(s), "\n") {
		var m map[string]any
		require.NoError(t, json.Unmarshal([]byte(line), &m), "not a JSON line: %q\nstderr:\n%s", line, s)
		out = append(out, m)
	}
	return out
}

func TestLogFormatJSONErrors(t *testing.T) {
	t.Parallel()
	url := []string{"DATABASE_URL=postgres://nobody@127.0.0.1:1/none?sslmode=disable&connect_timeout=5"}
	r := pgfence(t, url, "", "ls", "--log-format", "json")
	require.Equal(t, 1, r.code, r.stderr)
	lines := jsonLines(t, r.stderr)
	require.Len(t, lines, 1)
	require.Equal(t, "ERROR", lines[0]["level"])
	require.Equal(t, "ls", lines[0]["command"])
	require.Contains(t, lines[0]["msg"], "connect to the database:")
	require.EqualValues(t, 1, lines[0]["exit_code"])

	// Negative control: the default is the text line.
	r = pgfence(t, url, "", "ls")
	require.Equal(t, 1, r.code, r.stderr)
	require.True(t, strings.HasPrefix(r.stderr, "pgfence ls: connect to the database:"), r.stderr)

	r = pgfence(t, nil, "", "--log-format", "json", "run", "job")
	require.Equal(t, 2, r.code, r.stderr)
	lines = jsonLines(t, r.stderr)
	require.Equal(t, "run", lines[0]["command"])
	require.Equal(t, "Run 'pgfence run --help' for usage.", lines[0]["hint"])
}

// TestLogFormatJSONLostLease: with --log-format json, everything run
// writes to standard error when its lease is lost, the library's warnings
// and run's own report, is JSON, one object a line.
func TestLogFormatJSONLostLease(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDB(t)
	b := startPgfence(t, dbEnv(db), "--log-format", "json", "run", "--ttl", "3s", "job", "--", "sh", "-c", lossScript)
	_, err := strconv.Atoi(b.line(t))
	require.NoError(t, err)
	token, err := strconv.ParseInt(b.line(t), 10, 64)
	require.NoError(t, err)

	r := pgfence(t, dbEnv(db), "", "release", "--force", "job", "--yes")
	require.Equal(t, 0, r.code, r.stderr)
	require.Equal(t, 124, b.wait(t), b.stderr.String())

	var report map[string]any
	for _, l := range jsonLines(t, b.stderr.String()) {
		require.Equal(t, "run", l["command"], "%v", l)
		require.NotEmpty(t, l["time"])
		if l["exit_code"] != nil {
			require.Nil(t, report, "one final report")
			report = l
		}
	}
	require.NotNil(t, report, b.stderr.String())
	require.Equal(t, "ERROR", report["level"])
	require.EqualValues(t, 124, report["exit_code"])
	require.Equal(t, "job", report["lease"])
	require.EqualValues(t, token, report["token"])
	require.Contains(t, report["msg"], `lease "job" (token `+strconv.FormatInt(token, 10)+`) was lost`)
	require.Contains(t, report["cause"], "lock was lost: no longer held in the database")
	require.Equal(t, "killed by signal 9 (killed)", report["command_exit"])
	// From the Lost event: how long the lease was held.
	require.Positive(t, report["held_for_seconds"])
	require.Contains(t, report["msg"], "was lost after ")
}
