package fence_test

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence"
	"github.com/pgfence/pgfence/fence"
	"github.com/pgfence/pgfence/internal/pgtest"
)

// overheadClients is the number of concurrent writers, each on its own row
// (and its own lease).
const overheadClients = 16

// overheadSchema is the schema pgfence is installed in on the test
// databases.
const overheadSchema = pgfence.DefaultSchema

// overheadSecret is the secret of every lease the benchmarks write under.
var overheadSecret = pgfence.NewSecret("bench-secret")

// overheadRound is how long each write path runs in one round.
const overheadRound = time.Second

// writePath is one way to write a client's row: what issue 8 compares.
type writePath struct {
	name string
	// write writes row id (1..overheadClients) with the fencing token tok.
	write func(ctx context.Context, pool *pgxpool.Pool, id int, tok int64) error
}

const (
	overheadPlainSQL   = `UPDATE accounts SET balance = balance + $1 WHERE id = $2`
	overheadGuardedSQL = `UPDATE accounts SET balance = balance + $1, fence_token = $3 WHERE id = $2 AND fence_token <= $3`
	// overheadLockFirstSQL is the builders' earlier design, kept as a
	// reference point: lock every matched row FOR UPDATE, then write. It
	// writes a heap-lock WAL record per row before the UPDATE's own.
	overheadLockFirstSQL = `WITH pgfence_target AS (
    SELECT "fence_token" AS pgfence_token FROM "accounts"
    WHERE (id = $2)
    FOR UPDATE
), pgfence_write AS (
    UPDATE "accounts" SET balance = balance + $1, "fence_token" = $3
    WHERE (id = $2)
    AND "fence_token" <= $3
    AND NOT EXISTS (SELECT FROM pgfence_target WHERE (pgfence_token <= $3) IS NOT TRUE)
    RETURNING 1
)
SELECT (SELECT count(*) FROM pgfence_write), count(*), max(pgfence_token),
    count(*) FILTER (WHERE pgfence_token IS NULL), true
FROM pgfence_target`
)

var overheadPaths = []writePath{
	{"plain", func(ctx context.Context, pool *pgxpool.Pool, id int, _ int64) error {
		_, err := pool.Exec(ctx, overheadPlainSQL, 1, id)
		return err
	}},
	{"guarded-sql", func(ctx context.Context, pool *pgxpool.Pool, id int, tok int64) error {
		_, err := pool.Exec(ctx, overheadGuardedSQL, 1, id, tok)
		return err
	}},
	{"lock-first", func(ctx context.Context, pool *pgxpool.Pool, id int, tok int64) error {
		var written, matched, nulls int64
		var current *int64
		var held bool
		return pool.QueryRow(ctx, overheadLockFirstSQL, 1, id, tok).Scan(&written, &matched, &current, &nulls, &held)
	}},
	{"fence", func(ctx context.Context, pool *pgxpool.Pool, id int, tok int64) error {
		_, err := addBalance.Exec(ctx, pool, tok, 1, id)
		return err
	}},
	{"fence-under-lease", func(ctx context.Context, pool *pgxpool.Pool, id int, tok int64) error {
		_, err := addBalance.LeaseSchema(overheadSchema).UnderLease(fmt.Sprintf("w%d", id), overheadSecret).Exec(ctx, pool, tok, 1, id)
		return err
	}},
	// The full statements (SQL), which Exec sent alone before it sent the
	// guarded write first: the "before" of issue 16.
	{"fence-full", func(ctx context.Context, pool *pgxpool.Pool, id int, tok int64) error {
		return scanOutcome(ctx, pool, addBalance, "", id, tok)
	}},
	{"fence-under-lease-full", func(ctx context.Context, pool *pgxpool.Pool, id int, tok int64) error {
		return scanOutcome(ctx, pool, addBalance.LeaseSchema(overheadSchema), fmt.Sprintf("w%d", id), id, tok)
	}},
	{"plain-delete", func(ctx context.Context, pool *pgxpool.Pool, id int, _ int64) error {
		return deleteAndRestore(ctx, pool, id, func(tx pgx.Tx) error {
			_, err := tx.Exec(ctx, `DELETE FROM accounts WHERE id = $1`, id)
			return err
		})
	}},
	{"fence-delete", func(ctx context.Context, pool *pgxpool.Pool, id int, tok int64) error {
		return deleteAndRestore(ctx, pool, id, func(tx pgx.Tx) error {
			_, err := fence.Delete("accounts").Where("id = $1").Exec(ctx, tx, tok, id)
			return err
		})
	}},
}

// scanOutcome sends stmt's full statement and checks that it wrote.
func scanOutcome(ctx context.Context, pool *pgxpool.Pool, stmt *fence.UpdateStmt, lease string, id int, tok int64) error {
	args := []any{1, id, tok}
	if lease != "" {
		stmt = stmt.UnderLease(lease, overheadSecret)
		args = append(args, lease, overheadSecret.Reveal())
	}
	sql, err := stmt.SQL(2)
	if err != nil {
		return err
	}
	var written, matched, nulls int64
	var current *int64
	var held bool
	if err := pool.QueryRow(ctx, sql, args...).Scan(&written, &matched, &current, &nulls, &held); err != nil {
		return err
	}
	if written != 1 {
		return fmt.Errorf("wrote %d rows", written)
	}
	return nil
}

// deleteAndRestore runs del and then inserts the row again, in one
// transaction, so each delete finds its row: plain-delete and
// fence-delete compare the DELETE (the INSERT and commit are the same).
func deleteAndRestore(ctx context.Context, pool *pgxpool.Pool, id int, del func(pgx.Tx) error) error {
	return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if err := del(tx); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `INSERT INTO accounts (id, balance) VALUES ($1, 0)`, id)
		return err
	})
}

// BenchmarkWriteOverhead measures issue 8's fenced-write targets on a
// durable server (fsync, full_page_writes and synchronous_commit on): 16
// clients each update their own row, autocommit, with a plain UPDATE, the
// hand-written guarded UPDATE, the builders' earlier lock-first statement
// (a reference point), fence.Update and fence.Update.UnderLease.
// Each op is one round in which every path runs for overheadRound in turn,
// so the paths share the machine's load; the metrics are the median over
// the rounds of each path's writes per second and of its ratio to plain in
// the same round. It also reports the WAL each path writes: per statement
// from EXPLAIN (ANALYZE, WAL) in a rolled-back transaction (the statement
// alone, deterministic), and per write from the WAL position's advance over
// a round (with the commit record and anything else the server wrote).
//
// Run it with: go test -run '^$' -bench WriteOverhead -benchtime 3x ./fence/
func BenchmarkWriteOverhead(b *testing.B) {
	ctx := context.Background()
	_, srv := pgtest.NewCluster(b, &pgtest.ClusterOptions{Settings: map[string]string{
		"fsync": "on", "full_page_writes": "on", "synchronous_commit": "on",
	}})
	db := srv.NewDB(b)
	_, err := db.Pool.Exec(ctx, accountsDDL+"DROP TRIGGER accounts_fence ON accounts")
	require.NoError(b, err)
	schema, err := pgfenceSchema(ctx, db.Pool)
	require.NoError(b, err)
	require.Equal(b, overheadSchema, schema)
	_, err = db.Pool.Exec(ctx, `INSERT INTO accounts (id, balance) SELECT g, 0 FROM generate_series(1, $1::int) AS g`,
		overheadClients)
	require.NoError(b, err)
	_, err = db.Pool.Exec(ctx, `INSERT INTO pgfence.pgfence_leases (name, owner, fence, expires_at, secret_hash)
		SELECT 'w' || g, 'bench', 5, now() + interval '1 hour', sha256(convert_to($2, 'UTF8')) FROM generate_series(1, $1::int) AS g`,
		overheadClients, overheadSecret.Reveal())
	require.NoError(b, err)
	pool := db.NewPool(b, func(c *pgxpool.Config) {
		c.MaxConns, c.MinConns = overheadClients, overheadClients
	})
	const tok = 5

	explainWAL := map[string]string{}
	for _, p := range overheadPaths {
		explainWAL[p.name] = walOfOneWrite(b, pool, p, tok)
	}

	rates := map[string][]float64{}
	walPerWrite := map[string][]float64{}
	for b.Loop() {
		for _, p := range overheadPaths {
			n, wal := runPath(b, pool, p, tok)
			rates[p.name] = append(rates[p.name], float64(n)/overheadRound.Seconds())
			walPerWrite[p.name] = append(walPerWrite[p.name], float64(wal)/float64(n))
		}
	}
	plain := rates["plain"]
	for _, p := range overheadPaths {
		ratios := make([]float64, len(plain))
		for i := range plain {
			ratios[i] = rates[p.name][i] / plain[i]
		}
		b.ReportMetric(median(rates[p.name]), p.name+"-writes/s")
		b.ReportMetric(median(walPerWrite[p.name]), p.name+"-walB/write")
		if p.name != "plain" {
			b.ReportMetric(median(ratios), p.name+"-x-plain")
		}
		b.Logf("%s: EXPLAIN %s", p.name, explainWAL[p.name])
	}
	b.ReportMetric(0, "ns/op")
}

// runPath runs p for overheadRound on every client and returns the number
// of writes and the bytes of WAL the server wrote meanwhile.
func runPath(b *testing.B, pool *pgxpool.Pool, p writePath, tok int64) (int, int64) {
	ctx := context.Background()
	var before, after int64
	const lsnSQL = `SELECT pg_current_wal_insert_lsn() - '0/0'`
	require.NoError(b, pool.QueryRow(ctx, lsnSQL).Scan(&before))
	var wg sync.WaitGroup
	counts := make([]int, overheadClients)
	errs := make([]error, overheadClients)
	deadline := time.Now().Add(overheadRound)
	for c := range overheadClients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(deadline) {
				if err := p.write(ctx, pool, c+1, tok); err != nil {
					errs[c] = err
					return
				}
				counts[c]++
			}
		}()
	}
	wg.Wait()
	for _, err := range errs {
		require.NoError(b, err, p.name)
	}
	require.NoError(b, pool.QueryRow(ctx, lsnSQL).Scan(&after))
	n := 0
	for _, c := range counts {
		n += c
	}
	return n, after - before
}

// walOfOneWrite returns the WAL line of the top plan node of one write of p
// under EXPLAIN (ANALYZE, WAL), in a transaction that is rolled back. The
// builders' statements are explained through the statement they send.
func walOfOneWrite(b *testing.B, pool *pgxpool.Pool, p writePath, tok int64) string {
	ctx := context.Background()
	var sql string
	var args []any
	switch p.name {
	case "plain":
		sql, args = overheadPlainSQL, []any{1, 1}
	case "guarded-sql":
		sql, args = overheadGuardedSQL, []any{1, 1, tok}
	case "lock-first":
		sql, args = overheadLockFirstSQL, []any{1, 1, tok}
	case "fence-under-lease-full":
		q, err := addBalance.LeaseSchema(overheadSchema).UnderLease("w1", overheadSecret).SQL(2)
		require.NoError(b, err)
		sql, args = q, []any{1, 1, tok, "w1", overheadSecret.Reveal()}
	case "fence-full":
		q, err := addBalance.SQL(2)
		require.NoError(b, err)
		sql, args = q, []any{1, 1, tok}
	default:
		return "WAL: (not explained)"
	}
	tx, err := pool.Begin(ctx)
	require.NoError(b, err)
	defer func() { _ = tx.Rollback(ctx) }()
	rows, err := tx.Query(ctx, "EXPLAIN (ANALYZE, WAL, COSTS OFF, TIMING OFF, SUMMARY OFF) "+sql, args...)
	require.NoError(b, err)
	lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(b, err)
	for _, l := range lines {
		if i := strings.Index(l, "WAL: "); i >= 0 {
			return l[i:]
		}
	}
	return "WAL: none"
}

func median(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	if len(s) == 0 {
		return 0
	}
	return s[len(s)/2]
}

// BenchmarkServerCPU measures the server CPU time of one write of each
// path of BenchmarkWriteOverhead: one connection per path writes its row
// autocommit serverCPUWrites times per round, and the CPU time its backend
// spent (from /proc/<pid>/schedstat: the kernel's count of nanoseconds on
// a CPU, unaffected by time spent waiting for the WAL flush or for a core)
// is divided by the number of writes. Rounds alternate the paths. On a
// shared machine, this is the figure that does not depend on what else
// runs; it covers parsing (none: statements are prepared), planning,
// execution and commit in the backend, not the WAL writer's or the
// client's CPU. The metrics are each path's median µs per write and its
// ratio to plain's.
//
// Run it with: go test -run '^$' -bench ServerCPU -benchtime 5x ./fence/
func BenchmarkServerCPU(b *testing.B) {
	const serverCPUWrites = 2000
	ctx := context.Background()
	db := pgtest.NewDB(b)
	_, err := db.Pool.Exec(ctx, accountsDDL+"DROP TRIGGER accounts_fence ON accounts")
	require.NoError(b, err)
	_, err = db.Pool.Exec(ctx, `INSERT INTO accounts (id, balance) SELECT g, 0 FROM generate_series(1, $1::int) AS g`,
		overheadClients)
	require.NoError(b, err)
	_, err = db.Pool.Exec(ctx, `INSERT INTO pgfence.pgfence_leases (name, owner, fence, expires_at, secret_hash)
		SELECT 'w' || g, 'bench', 5, now() + interval '1 hour', sha256(convert_to($2, 'UTF8')) FROM generate_series(1, $1::int) AS g`,
		overheadClients, overheadSecret.Reveal())
	require.NoError(b, err)
	const tok = 5
	type conn struct {
		pool *pgxpool.Pool
		pid  int
	}
	conns := map[string]conn{}
	for i, p := range overheadPaths {
		pool := db.NewPool(b, func(c *pgxpool.Config) { c.MaxConns, c.MinConns = 1, 1 })
		var pid int
		require.NoError(b, pool.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid))
		// Warm up: prepared statements, plan cache, catalog caches.
		for range 50 {
			require.NoError(b, p.write(ctx, pool, i+1, tok), p.name)
		}
		conns[p.name] = conn{pool, pid}
	}
	perWrite := map[string][]float64{}
	for b.Loop() {
		for i, p := range overheadPaths {
			c := conns[p.name]
			before := backendCPU(b, c.pid)
			for range serverCPUWrites {
				require.NoError(b, p.write(ctx, c.pool, i+1, tok), p.name)
			}
			perWrite[p.name] = append(perWrite[p.name], float64(backendCPU(b, c.pid)-before)/1e3/serverCPUWrites)
		}
	}
	plain := median(perWrite["plain"])
	for _, p := range overheadPaths {
		m := median(perWrite[p.name])
		b.ReportMetric(m, p.name+"-us/write")
		if p.name != "plain" {
			b.ReportMetric(m/plain, p.name+"-x-plain")
		}
	}
	b.ReportMetric(0, "ns/op")
}

// backendCPU returns the nanoseconds a local server process has spent on a
// CPU.
func backendCPU(b *testing.B, pid int) int64 {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/schedstat", pid))
	require.NoError(b, err, "the server runs on this machine")
	var ns int64
	_, err = fmt.Sscan(string(data), &ns)
	require.NoError(b, err)
	return ns
}
