package main_test

import (
	"context"
	"encoding/json"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence/internal/pgtest"
)

func leaseNames(t *testing.T, db *pgtest.DB) []string {
	t.Helper()
	var names []string
	require.NoError(t, db.Pool.QueryRow(context.Background(),
		"SELECT coalesce(pg_catalog.array_agg(name ORDER BY name), '{}') FROM pgfence.pgfence_leases").Scan(&names))
	return names
}

type pruneOutput struct {
	Deleted          int64   `json:"deleted"`
	OlderThanSeconds float64 `json:"older_than_seconds"`
}

func decodePrune(t *testing.T, s string) pruneOutput {
	t.Helper()
	var out pruneOutput
	dec := json.NewDecoder(strings.NewReader(s))
	dec.DisallowUnknownFields()
	require.NoError(t, dec.Decode(&out), s)
	return out
}

func TestPrune(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDB(t)
	env := dbEnv(db)
	insertLease(t, db, "ended-two-days-ago", "worker-0", "-48 hours")
	insertLease(t, db, "ended-two-hours-ago", "worker-1", "-2 hours")
	insertLease(t, db, "ended-just-now", "worker-2", "-10 seconds")
	insertLease(t, db, "held", "worker-3", "30 seconds")

	r := pgfence(t, env, "", "prune")
	require.Equal(t, 0, r.code, r.stderr)
	require.Empty(t, r.stderr)
	require.Equal(t, "pruned 1 row of leases that ended more than 24h0m0s ago\n", r.stdout)
	require.Equal(t, []string{"ended-just-now", "ended-two-hours-ago", "held"}, leaseNames(t, db))

	r = pgfence(t, env, "", "prune", "--older-than", "1h", "--json")
	require.Equal(t, 0, r.code, r.stderr)
	require.Equal(t, pruneOutput{Deleted: 1, OlderThanSeconds: 3600}, decodePrune(t, r.stdout))
	require.Equal(t, []string{"ended-just-now", "held"}, leaseNames(t, db))

	r = pgfence(t, nil, "", "prune", "-j", "--older-than", "1m", "--database", db.URL)
	require.Equal(t, 0, r.code, r.stderr)
	require.Equal(t, pruneOutput{Deleted: 0, OlderThanSeconds: 60}, decodePrune(t, r.stdout), "recent and held rows stay")
	require.Equal(t, []string{"ended-just-now", "held"}, leaseNames(t, db))
}

func TestPruneWithoutSchema(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDB(t)
	r := pgfence(t, dbEnv(db), "", "migrate", "down", "--yes")
	require.Equal(t, 0, r.code, r.stderr)
	r = pgfence(t, dbEnv(db), "", "prune")
	require.Equal(t, 1, r.code)
	require.Contains(t, r.stderr, "pgfence migrate up --schema pgfence")
	require.Empty(t, r.stdout)
}

// pruneWaiting reports whether prune's connection has checked for the
// transactions it waits for.
func pruneWaiting(t *testing.T, db *pgtest.DB) bool {
	t.Helper()
	var n int
	require.NoError(t, db.Pool.QueryRow(context.Background(), `
		SELECT pg_catalog.count(*) FROM pg_catalog.pg_stat_activity
		WHERE datname = pg_catalog.current_database() AND application_name = 'pgfence prune'
		  AND query LIKE '%FROM pg_catalog.pg_locks WHERE virtualtransaction%'`).Scan(&n))
	return n > 0
}

func TestPruneInterrupted(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.NewDB(t)
	insertLease(t, db, "ended-two-days-ago", "worker-0", "-48 hours")
	// A transaction writing the table: prune waits for it to end before it
	// deletes anything.
	writer, err := db.Pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = writer.Rollback(ctx) }()
	_, err = writer.Exec(ctx, "LOCK TABLE pgfence.pgfence_leases IN ROW EXCLUSIVE MODE")
	require.NoError(t, err)

	b := startPgfence(t, dbEnv(db), "prune")
	require.Eventually(t, func() bool { return pruneWaiting(t, db) }, time.Minute, 10*time.Millisecond,
		"prune waits for the writer")
	require.NoError(t, b.cmd.Process.Signal(syscall.SIGINT))
	require.Equal(t, 1, b.wait(t))
	require.Contains(t, b.stderr.String(), "pgfence prune: pgfence: leasetable: prune: stopped after deleting 0 rows: interrupted by SIGINT")
	require.Equal(t, []string{"ended-two-days-ago"}, leaseNames(t, db))

	require.NoError(t, writer.Commit(ctx))
	r := pgfence(t, dbEnv(db), "", "prune")
	require.Equal(t, 0, r.code, r.stderr)
	require.Equal(t, "pruned 1 row of leases that ended more than 24h0m0s ago\n", r.stdout)
	require.Empty(t, leaseNames(t, db))
}
