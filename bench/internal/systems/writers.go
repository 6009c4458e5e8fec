package systems

import (
	"context"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence"
	"github.com/pgfence/pgfence/bench/internal/harness"
	"github.com/pgfence/pgfence/fence"
)

// The protected tables of the fenced-write scenario: one row per worker.
// bench_accounts_guarded has pgfence_guard attached, so every UPDATE pays
// for the trigger.
const (
	createAccounts = `CREATE TABLE IF NOT EXISTS bench_accounts (
    id          int    PRIMARY KEY,
    balance     bigint NOT NULL DEFAULT 0,
    fence_token bigint NOT NULL DEFAULT 0
)`
	createGuardedAccounts = `CREATE TABLE IF NOT EXISTS bench_accounts_guarded (LIKE bench_accounts INCLUDING ALL)`
	dropGuardTrigger      = `DROP TRIGGER IF EXISTS bench_accounts_fence ON bench_accounts_guarded`
	createGuardTrigger    = `CREATE TRIGGER bench_accounts_fence BEFORE UPDATE OR DELETE ON bench_accounts_guarded
    FOR EACH ROW EXECUTE FUNCTION pgfence.pgfence_guard('fence_token')`
	seedAccounts = `INSERT INTO %s (id) SELECT g FROM generate_series(0, $1::int - 1) AS g ON CONFLICT (id) DO NOTHING`
)

// nextToken draws a fencing token the way pgfence does.
const nextToken = `SELECT pgfence.pgfence_next_token()`

// insertBenchLease makes worker leases that the lease-checked write
// requires; the token comes from pgfence's sequence, and the secret of
// lease bench-write-g is benchLeaseSecret(g), stored as its SHA-256 as
// pgfence_acquire stores a secret (migration 000012).
const insertBenchLease = `INSERT INTO pgfence.pgfence_leases AS l (name, owner, fence, expires_at, secret_hash)
SELECT 'bench-write-' || g, 'bench', pgfence.pgfence_next_token(), pg_catalog.now() + interval '1 day',
       pg_catalog.sha256(pg_catalog.convert_to('bench-write-secret-' || g, 'UTF8'))
FROM pg_catalog.generate_series(0, $1::pg_catalog.int4 - 1) AS g
ON CONFLICT (name) DO UPDATE SET owner = 'bench', fence = pgfence.pgfence_next_token(), expires_at = pg_catalog.now() + interval '1 day',
    secret_hash = excluded.secret_hash
RETURNING l.fence, l.name`

// benchLeaseSecret is the secret of the lease insertBenchLease makes for
// worker i.
func benchLeaseSecret(i int) string { return fmt.Sprintf("bench-write-secret-%d", i) }

// The write statements compared. $1 amount, $2 row id, $3 token, $4 lease
// name, $5 its secret.
const (
	writePlain   = `UPDATE %s SET balance = balance + $1 WHERE id = $2`
	writeGuarded = `UPDATE %s SET balance = balance + $1, fence_token = $3 WHERE id = $2 AND fence_token <= $3`
	// writeLeaseChecked also requires, atomically, that the lease is still
	// held with this token and secret and unexpired, locking the lease row
	// FOR SHARE so no takeover commits between the check and the write.
	writeLeaseChecked = `WITH lease AS (
    SELECT 1 FROM pgfence.pgfence_leases
    WHERE name = $4 AND fence = $3 AND secret_hash = pg_catalog.sha256(pg_catalog.convert_to($5, 'UTF8'))
      AND expires_at > pg_catalog.now() FOR SHARE
)
UPDATE bench_accounts SET balance = balance + $1, fence_token = $3
WHERE id = $2 AND fence_token <= $3 AND EXISTS (SELECT 1 FROM lease)`
)

// writeMode is how a raw writer builds its statement.
type writeMode int

const (
	modePlain writeMode = iota
	modeGuarded
	modeLeaseChecked
)

func rawWriter(name, note string, table string, mode writeMode) harness.WriterSpec {
	return harness.WriterSpec{
		Name: name,
		Kind: harness.Ceiling,
		Note: note,
		Open: func(ctx context.Context, env *harness.Env, clients int) (harness.Writer, error) {
			pool, err := openPool(ctx, env, env.DatabaseURL, clients)
			if err != nil {
				return nil, err
			}
			w, err := setupRawWriter(ctx, pool, clients, table, mode)
			if err != nil {
				pool.Close()
				return nil, err
			}
			return w, nil
		},
	}
}

func setupRawWriter(ctx context.Context, pool *pgxpool.Pool, clients int, table string, mode writeMode) (*rawWrite, error) {
	for _, stmt := range []string{createAccounts, createGuardedAccounts, dropGuardTrigger, createGuardTrigger} {
		if _, err := pool.Exec(ctx, stmt); err != nil {
			return nil, fmt.Errorf("set up write tables: %w", err)
		}
	}
	for _, t := range []string{"bench_accounts", "bench_accounts_guarded"} {
		if _, err := pool.Exec(ctx, fmt.Sprintf(seedAccounts, t), clients); err != nil {
			return nil, fmt.Errorf("seed %s: %w", t, err)
		}
	}
	w := &rawWrite{pool: pool, tokens: make([]int64, clients), leases: make([]string, clients)}
	switch mode {
	case modePlain:
		w.sql = fmt.Sprintf(writePlain, table)
	case modeGuarded:
		w.sql = fmt.Sprintf(writeGuarded, table)
		for i := range w.tokens {
			if err := pool.QueryRow(ctx, nextToken).Scan(&w.tokens[i]); err != nil {
				return nil, fmt.Errorf("draw token: %w", err)
			}
		}
	case modeLeaseChecked:
		w.sql = writeLeaseChecked
		rows, err := pool.Query(ctx, insertBenchLease, clients)
		if err != nil {
			return nil, fmt.Errorf("create leases: %w", err)
		}
		for rows.Next() {
			var token int64
			var name string
			if err := rows.Scan(&token, &name); err != nil {
				return nil, err
			}
			var i int
			if _, err := fmt.Sscanf(name, "bench-write-%d", &i); err != nil {
				return nil, err
			}
			w.tokens[i], w.leases[i] = token, name
		}
		if err := rows.Err(); err != nil {
			return nil, fmt.Errorf("create leases: %w", err)
		}
	}
	w.mode = mode
	return w, nil
}

type rawWrite struct {
	pool   *pgxpool.Pool
	sql    string
	mode   writeMode
	tokens []int64
	leases []string
}

func (w *rawWrite) args(worker int) []any {
	var args []any
	switch w.mode {
	case modePlain:
		args = []any{1, worker}
	case modeGuarded:
		args = []any{1, worker, w.tokens[worker]}
	case modeLeaseChecked:
		args = []any{1, worker, w.tokens[worker], w.leases[worker], benchLeaseSecret(worker)}
	}
	return args
}

func (w *rawWrite) Write(ctx context.Context, worker int) error {
	tag, err := w.pool.Exec(ctx, w.sql, w.args(worker)...)
	if err != nil {
		return err
	}
	if tag.RowsAffected() != 1 {
		return fmt.Errorf("write to row %d changed %d rows", worker, tag.RowsAffected())
	}
	return nil
}

func (w *rawWrite) Close() error { w.pool.Close(); return nil }

// RawWriters are the raw-SQL write paths of the fenced-write scenario, the
// first being the baseline the others are compared to.
var RawWriters = []harness.WriterSpec{
	rawWriter("plain UPDATE", "UPDATE ... SET balance = balance + $1 WHERE id = $2", "bench_accounts", modePlain),
	rawWriter("guarded UPDATE", "adds fence_token = $3 to SET and fence_token <= $3 to WHERE", "bench_accounts", modeGuarded),
	rawWriter("plain UPDATE + trigger", "the plain UPDATE on a table with the pgfence_guard trigger", "bench_accounts_guarded", modePlain),
	rawWriter("guarded UPDATE + trigger", "the guarded UPDATE on a table with the pgfence_guard trigger", "bench_accounts_guarded", modeGuarded),
	rawWriter("lease-checked UPDATE", "guarded UPDATE that also requires the lease row (name, token, the secret's SHA-256, unexpired) FOR SHARE in a CTE", "bench_accounts", modeLeaseChecked),
}

// FenceWriters are the pgfence fence builder's write paths, written to the
// same rows as RawWriters: fence.Update(...).Exec, and the same with
// UnderLease on a lease in pgfence.pgfence_leases.
var FenceWriters = []harness.WriterSpec{
	fenceWriter("fence.Update", "fence.Update(\"bench_accounts\").Set(\"balance = balance + $1\").Where(\"id = $2\").Exec: one statement that presents the token as pgfence.token too, writes the row if its token is not newer and, only when nothing was written, locks and reads the row to report stale (newest token) or missing",
		fence.Update("bench_accounts").Set("balance = balance + $1").Where("id = $2"), modeGuarded),
	fenceWriter("fence.Update.UnderLease", "the same with .UnderLease(name, secret): also requires pgfence.pgfence_lease_held(name, token, secret), a SECURITY DEFINER function that checks the lease row (token, the secret's SHA-256, expires_at > clock_timestamp()) and locks it FOR SHARE",
		fence.Update("bench_accounts").Set("balance = balance + $1").Where("id = $2"), modeLeaseChecked),
}

func fenceWriter(name, note string, stmt *fence.UpdateStmt, mode writeMode) harness.WriterSpec {
	return harness.WriterSpec{
		Name: name,
		Kind: harness.Pgfence,
		Note: note,
		Open: func(ctx context.Context, env *harness.Env, clients int) (harness.Writer, error) {
			pool, err := openPool(ctx, env, env.DatabaseURL, clients)
			if err != nil {
				return nil, err
			}
			w, err := setupRawWriter(ctx, pool, clients, "bench_accounts", mode)
			if err != nil {
				pool.Close()
				return nil, err
			}
			fw := &fenceWrite{rawWrite: w, stmts: make([]*fence.UpdateStmt, clients)}
			for i := range fw.stmts {
				fw.stmts[i] = stmt
				if mode == modeLeaseChecked {
					fw.stmts[i] = stmt.UnderLease(w.leases[i], pgfence.NewSecret(benchLeaseSecret(i)))
				}
			}
			return fw, nil
		},
	}
}

type fenceWrite struct {
	*rawWrite
	stmts []*fence.UpdateStmt // per worker: UnderLease names the worker's lease
}

func (w *fenceWrite) Write(ctx context.Context, worker int) error {
	tag, err := w.stmts[worker].Exec(ctx, w.pool, w.tokens[worker], 1, worker)
	if err != nil {
		return err
	}
	if tag.RowsAffected() != 1 {
		return fmt.Errorf("write to row %d changed %d rows", worker, tag.RowsAffected())
	}
	return nil
}

func (w *rawWrite) Explain(ctx context.Context, worker int) (string, error) {
	return explain(ctx, w.pool, w.sql, w.args(worker))
}

func (w *fenceWrite) Explain(ctx context.Context, worker int) (string, error) {
	sql, err := w.stmts[worker].SQL(2)
	if err != nil {
		return "", err
	}
	args := []any{1, worker, w.tokens[worker]}
	if w.mode == modeLeaseChecked {
		args = append(args, w.leases[worker], benchLeaseSecret(worker))
	}
	return explain(ctx, w.pool, sql, args)
}

// explain runs EXPLAIN (ANALYZE, BUFFERS, WAL, COSTS OFF) of sql in a
// transaction that it rolls back, and returns the plan's text.
func explain(ctx context.Context, pool *pgxpool.Pool, sql string, args []any) (string, error) {
	tx, err := pool.Begin(ctx)
	if err != nil {
		return "", err
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	rows, err := tx.Query(ctx, "EXPLAIN (ANALYZE, BUFFERS, WAL, COSTS OFF) "+sql, args...)
	if err != nil {
		return "", err
	}
	var lines []string
	var line string
	_, err = pgx.ForEachRow(rows, []any{&line}, func() error {
		lines = append(lines, line)
		return nil
	})
	return strings.Join(lines, "\n"), err
}
