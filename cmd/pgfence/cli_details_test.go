package main_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence/internal/pgtest"
)

// unreachable is a database no test reaches: usage errors are found before
// connecting.
var unreachable = []string{"DATABASE_URL=postgres://nobody@127.0.0.1:1/none?sslmode=disable&connect_timeout=5"}

// TestCommandLineMistakes: each mistake is a usage error (exit 2) whose
// message names the flag or says what is expected.
func TestCommandLineMistakes(t *testing.T) {
	t.Parallel()
	tests := []struct {
		args []string
		want string
	}{
		{[]string{"run", "--ttl", "10", "job", "--", "true"}, "use a Go duration such as 10s, 90m or 24h"},
		{[]string{"prune", "--older-than", "1d"}, "use a Go duration such as 10s, 90m or 24h"},
		{[]string{"run", "--wait", "-1s", "job", "--", "true"}, "--wait must not be negative"},
		{[]string{"run", "--ttl", "-1s", "job", "--", "true"}, "--ttl must not be negative"},
		{[]string{"run", "--at-least", "-1s", "job", "--", "true"}, "--at-least must not be negative"},
		{[]string{"run", "--safety-margin", "-1s", "job", "--", "true"}, "--safety-margin must not be negative"},
		{[]string{"run", "-n", "--wait", "0", "job", "--", "true"}, "--no-wait and --wait exclude each other"},
		{[]string{"run", "bad\xffname", "--", "true"}, "is not valid UTF-8"},
		{[]string{"run", "bad\x01name", "--", "true"}, "holds a control character (U+0001)"},
		{[]string{"run", "bad\x7fname", "--", "true"}, "holds a control character (U+007F)"},
		{[]string{"release", "--force", "--yes", "bad\xffname"}, "is not valid UTF-8"},
		{[]string{"release", "--force", "--yes", "bad\nname"}, "holds a control character (U+000A)"},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			t.Parallel()
			r := pgfence(t, unreachable, "", tt.args...)
			require.Equal(t, 2, r.code, r.stderr)
			require.Contains(t, r.stderr, tt.want)
			require.Contains(t, r.stderr, "--help' for usage")
		})
	}
}

// TestRunWaitZeroDoesNotWait: --wait 0 gives up at once, as flock -w 0
// does, where no --wait waits for the holder.
func TestRunWaitZeroDoesNotWait(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDB(t)
	insertLease(t, db, "nightly", "other-host", "1 hour")
	start := time.Now()
	r := pgfence(t, dbEnv(db), "", "run", "--wait", "0", "nightly", "--", "echo", "ran")
	require.Equal(t, 1, r.code, r.stderr)
	require.Less(t, time.Since(start), 20*time.Second)
	require.Contains(t, r.stderr, `lease "nightly" is held by another owner (holder "other-host"`)
	require.Empty(t, r.stdout, "the command was not run")
	r = pgfence(t, dbEnv(db), "", "run", "-w", "0s", "-E", "0", "nightly", "--", "echo", "ran")
	require.Equal(t, 0, r.code, "the conflict code: %s", r.stderr)
	require.Empty(t, r.stdout)
}

// TestRunHelpHasOneExitCodeTable: run's help lists run's exit codes only,
// not the general table after them.
func TestRunHelpHasOneExitCodeTable(t *testing.T) {
	t.Parallel()
	r := pgfence(t, nil, "", "run", "--help")
	require.Equal(t, 0, r.code, r.stderr)
	require.Equal(t, 1, strings.Count(r.stdout, "Exit codes:"), r.stdout)
	require.NotContains(t, r.stdout, "1  failure (database error", "the general table")
	require.Contains(t, r.stdout, "124             the lease was lost")
	require.Contains(t, r.stdout, "--wait 0 does not wait")
	r = pgfence(t, nil, "", "ls", "--help")
	require.Equal(t, 1, strings.Count(r.stdout, "Exit codes:"), r.stdout)
}

// TestMigrateUpFailureSaysUp: a migrate up that fails (a role without
// rights on the schema) says it was up that failed, not version.
func TestMigrateUpFailureSaysUp(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDB(t)
	_, roleURL := newRole(t, db)
	r := pgfence(t, []string{"DATABASE_URL=" + roleURL}, "", "migrate", "up")
	require.Equal(t, 1, r.code, r.stderr)
	require.Contains(t, r.stderr, "pgfence migrate: pgfence: migrations: up: ")
	require.NotContains(t, r.stderr, "migrations: version:")
}

// TestRunLogsInOneFormat: the library's warnings (here, the lease lost to a
// force release) are printed like run's own lines.
func TestRunLogsInOneFormat(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDB(t)
	b := startPgfence(t, dbEnv(db), "run", "--ttl", "3s", "job", "--", "sh", "-c", `echo ready; exec sleep 600`)
	require.Equal(t, "ready", b.line(t))
	_, err := db.Pool.Exec(context.Background(), "SELECT pgfence.pgfence_force_release('job', 'test')")
	require.NoError(t, err)
	require.Equal(t, 124, b.wait(t), b.stderr.String())
	stderr := b.stderr.String()
	require.Contains(t, stderr, "pgfence run: pgfence: leasetable: lease lost (lease=job token=")
	require.NotContains(t, stderr, "level=")
	for _, line := range strings.Split(strings.TrimSpace(stderr), "\n") {
		require.True(t, strings.HasPrefix(line, "pgfence run: "), "line %q of %s", line, stderr)
	}
}
