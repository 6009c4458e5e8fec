package fence_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence"
	"github.com/pgfence/pgfence/fence"
)

var claimAccount = fence.Claim("accounts").Where("id = $1").Returning("balance")

func TestClaimReadsAndExcludesOlderHolders(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	old, tok := b.nextToken(t), b.nextToken(t)
	b.account(t, 1, 100, old)

	var balance int64
	require.NoError(t, claimAccount.QueryRow(ctx, b.pool, tok, 1).Scan(&balance))
	require.Equal(t, int64(100), balance)
	_, got := b.row(t, 1)
	require.Equal(t, tok, got, "the claim writes the token")

	// The older holder is now excluded, the claimant is not.
	_, err := addBalance.Exec(ctx, b.pool, old, 5, 1)
	var stale *fence.StaleTokenError
	require.ErrorAs(t, err, &stale)
	require.Equal(t, fence.StaleTokenError{Table: `"accounts"`, Presented: old, Current: tok}, *stale)
	require.NoError(t, claimAccount.QueryRow(ctx, b.pool, tok, 1).Scan(&balance), "a holder can claim again")
	_, err = addBalance.Exec(ctx, b.pool, tok, 5, 1)
	require.NoError(t, err)

	// Stale and missing, told apart.
	err = claimAccount.QueryRow(ctx, b.pool, old, 1).Scan(&balance)
	require.ErrorAs(t, err, &stale)
	require.Equal(t, tok, stale.Current)
	err = claimAccount.QueryRow(ctx, b.pool, tok, 2).Scan(&balance)
	require.ErrorIs(t, err, pgx.ErrNoRows)
	_, err = fence.Claim("accounts").Where("id = $1").Exec(ctx, b.pool, tok, 2)
	require.ErrorIs(t, err, pgx.ErrNoRows)
}

func TestClaimSetIsAllOrNothing(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	tok, newer := b.nextToken(t), b.nextToken(t)
	b.account(t, 1, 10, 0)
	b.account(t, 2, 20, 0)
	b.account(t, 3, 30, newer)
	claimSet := fence.Claim("accounts").Where("id = ANY($1)").Returning("id, balance")

	_, err := claimSet.Query(ctx, b.pool, tok, []int32{1, 2, 3})
	var stale *fence.StaleTokenError
	require.ErrorAs(t, err, &stale)
	require.Equal(t, newer, stale.Current)
	for id := 1; id <= 2; id++ {
		_, got := b.row(t, id)
		require.Zero(t, got, "no row of the set is claimed when one is stale")
	}

	rows, err := claimSet.Query(ctx, b.pool, tok, []int32{1, 2})
	require.NoError(t, err)
	got := map[int32]int64{}
	for rows.Next() {
		var id int32
		var bal int64
		require.NoError(t, rows.Scan(&id, &bal))
		got[id] = bal
	}
	require.NoError(t, rows.Err())
	require.Equal(t, map[int32]int64{1: 10, 2: 20}, got)
	require.Equal(t, "UPDATE 2", rows.CommandTag().String())
	require.Equal(t, []string{"id", "balance"}, fieldNames(rows))
}

func fieldNames(rows pgx.Rows) []string {
	var out []string
	for _, f := range rows.FieldDescriptions() {
		out = append(out, f.Name)
	}
	return out
}

func TestReturning(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	tok := b.nextToken(t)
	b.account(t, 1, 100, 0)

	var balance, token int64
	require.NoError(t, addBalance.Returning("balance, fence_token").QueryRow(ctx, b.pool, tok, 5, 1).Scan(&balance, &token))
	require.Equal(t, []int64{105, tok}, []int64{balance, token})

	upsert := fence.Upsert("accounts").Columns("id", "balance").Values("$1", "$2").OnConflict("id").
		Set("balance = accounts.balance + excluded.balance").Returning("balance")
	require.NoError(t, upsert.QueryRow(ctx, b.pool, tok, 1, 10).Scan(&balance))
	require.Equal(t, int64(115), balance)
	require.NoError(t, upsert.QueryRow(ctx, b.pool, tok, 2, 7).Scan(&balance))
	require.Equal(t, int64(7), balance, "inserted")

	var id int32
	require.NoError(t, deleteAccount.Returning("id, balance").QueryRow(ctx, b.pool, tok, 2).Scan(&id, &balance))
	require.Equal(t, int32(2), id)
	require.Equal(t, int64(7), balance)
	err := deleteAccount.Returning("id").QueryRow(ctx, b.pool, tok, 2).Scan(&id)
	require.ErrorIs(t, err, pgx.ErrNoRows)

	_, err = addBalance.Query(ctx, b.pool, tok, 5, 1)
	require.ErrorContains(t, err, "needs a Returning list")
	_, err = addBalance.Returning("balance + $1").Query(ctx, b.pool, tok, 5, 1)
	require.ErrorContains(t, err, "placeholder")
}

// statementLog records the statements a pool sends, with the value of
// ctxKey in each statement's ctx.
type statementLog struct {
	mu    sync.Mutex
	sql   []string
	value []any
}

type ctxKey struct{}

func (l *statementLog) TraceQueryStart(ctx context.Context, _ *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.sql = append(l.sql, data.SQL)
	l.value = append(l.value, ctx.Value(ctxKey{}))
	return ctx
}

func (l *statementLog) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (l *statementLog) reset() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.sql, l.value = nil, nil
}

func (l *statementLog) statements() ([]string, []any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.sql...), append([]any(nil), l.value...)
}

func tracedPool(t *testing.T, b *testBundle) (*pgxpool.Pool, *statementLog) {
	log := &statementLog{}
	pool := b.db.NewPool(t, func(c *pgxpool.Config) { c.ConnConfig.Tracer = log })
	return pool, log
}

// A success costs one statement, the guarded write alone; the full
// statement is sent only when that wrote nothing.
func TestOneStatementOnSuccess(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	pool, log := tracedPool(t, b)
	tok, newer := b.nextToken(t), b.nextToken(t)
	b.account(t, 1, 0, 0)
	b.account(t, 2, 0, newer)

	_, err := addBalance.Exec(ctx, pool, tok, 5, 1)
	require.NoError(t, err)
	sqls, _ := log.statements()
	require.Len(t, sqls, 1)
	require.True(t, strings.HasPrefix(sqls[0], "UPDATE "), sqls[0])

	log.reset()
	_, err = addBalance.Exec(ctx, pool, tok, 5, 2)
	require.ErrorIs(t, err, pgfence.ErrFenced)
	sqls, _ = log.statements()
	require.Len(t, sqls, 2, "a rejected write sends the full statement")
	full, err := addBalance.SQL(2)
	require.NoError(t, err)
	require.Equal(t, full, sqls[1])

	log.reset()
	_, err = fence.Update("accounts").Set("balance = balance + $1").Where("id = ANY($2)").Exec(ctx, pool, newer, 1, []int32{1, 2})
	require.NoError(t, err)
	sqls, _ = log.statements()
	require.Len(t, sqls, 2, "several matched rows: the full statement locks them first")
}

// recorder is an Observer and OpObserver that records what it is told.
type recorder struct {
	mu     sync.Mutex
	events []pgfence.Event
	starts []pgfence.Op
	ends   []error
}

func (r *recorder) Observe(_ context.Context, e pgfence.Event) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events = append(r.events, e)
}

func (r *recorder) StartOp(ctx context.Context, op pgfence.Op) context.Context {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.starts = append(r.starts, op)
	return context.WithValue(ctx, ctxKey{}, "span")
}

func (r *recorder) EndOp(_ context.Context, _ pgfence.Op, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.ends = append(r.ends, err)
}

func TestObserver(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	pool, log := tracedPool(t, b)
	tok, newer := b.nextToken(t), b.nextToken(t)
	b.account(t, 1, 0, 0)
	b.account(t, 2, 0, newer)
	rec := &recorder{}
	stmt := addBalance.Observer(rec)

	_, err := stmt.Exec(ctx, pool, tok, 5, 1)
	require.NoError(t, err)
	_, err = stmt.Exec(ctx, pool, tok, 5, 2)
	require.ErrorIs(t, err, pgfence.ErrFenced)
	want := pgfence.Op{Kind: pgfence.OpFencedWrite, Strategy: pgfence.StrategyFence, Batch: 1,
		Table: `"accounts"`, Statement: "update"}
	require.Equal(t, []pgfence.Op{want, want}, rec.starts)
	require.Len(t, rec.ends, 2)
	require.NoError(t, rec.ends[0])
	require.ErrorIs(t, rec.ends[1], pgfence.ErrFenced)
	require.Equal(t, []pgfence.Event{pgfence.StaleWrite{Table: `"accounts"`, Presented: tok, Current: newer}}, rec.events)
	_, values := log.statements()
	require.Equal(t, []any{"span", "span", "span"}, values, "every statement runs on StartOp's ctx")

	// Query ends the operation when its rows are closed.
	log.reset()
	var balance int64
	require.NoError(t, claimAccount.Observer(rec).QueryRow(ctx, pool, tok, 1).Scan(&balance))
	require.Equal(t, int64(5), balance)
	want.Statement = "claim"
	require.Equal(t, want, rec.starts[2])
	require.Len(t, rec.ends, 3)
	require.NoError(t, rec.ends[2])

	// Negative control: without an Observer nothing is reported and the
	// statements run on the caller's ctx.
	log.reset()
	_, err = addBalance.Exec(ctx, pool, tok, 5, 2)
	require.ErrorIs(t, err, pgfence.ErrFenced)
	require.Len(t, rec.events, 1)
	require.Len(t, rec.starts, 3)
	_, values = log.statements()
	require.Equal(t, []any{nil, nil}, values)

	// A plain Observer (no OpObserver) gets the events only.
	var events []pgfence.Event
	plain := pgfence.ObserverFunc(func(_ context.Context, e pgfence.Event) { events = append(events, e) })
	_, err = addBalance.Observer(plain).Exec(ctx, pool, tok, 5, 2)
	require.ErrorIs(t, err, pgfence.ErrFenced)
	require.Equal(t, []pgfence.Event{pgfence.StaleWrite{Table: `"accounts"`, Presented: tok, Current: newer}}, events)
}

func TestUpsertOnConstraint(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	b.exec(t, `CREATE TABLE settings (
    tenant int NOT NULL, key text NOT NULL, value text NOT NULL,
    fence_token bigint NOT NULL DEFAULT 0,
    CONSTRAINT settings_tenant_key UNIQUE (tenant, key))`)
	tok, newer := b.nextToken(t), b.nextToken(t)
	put := fence.Upsert("settings").Columns("tenant", "key", "value").Values("$1", "$2", "$3").
		OnConstraint("settings_tenant_key", "tenant", "key")
	sql, err := put.SQL(3)
	require.NoError(t, err)
	require.Contains(t, sql, `ON CONFLICT ON CONSTRAINT "settings_tenant_key" DO UPDATE`)

	_, err = put.Exec(ctx, b.pool, newer, 1, "color", "red")
	require.NoError(t, err)
	_, err = put.Exec(ctx, b.pool, tok, 1, "color", "blue")
	var stale *fence.StaleTokenError
	require.ErrorAs(t, err, &stale)
	require.Equal(t, newer, stale.Current)
	var value string
	require.NoError(t, b.pool.QueryRow(ctx, "SELECT value FROM settings").Scan(&value))
	require.Equal(t, "red", value)

	for _, bad := range []*fence.UpsertStmt{
		put.OnConstraint("settings_tenant_key"),
		put.OnConstraint("", "tenant"),
		put.OnConstraint("c", "nope"),
	} {
		_, err := bad.SQL(3)
		require.Error(t, err)
	}
	_, err = put.OnConflict("tenant", "key").SQL(3)
	require.NoError(t, err, "OnConflict replaces OnConstraint")
}

// An upsert whose conflicting row was inserted after its snapshot reports
// that row's token; the full statement alone (the negative control)
// cannot read it.
func TestUpsertLostRaceReportsCurrent(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	tok, newer := b.nextToken(t), b.nextToken(t)
	put := fence.Upsert("accounts").Columns("id", "balance").Values("$1", "$2").OnConflict("id")
	full, err := put.SQL(2)
	require.NoError(t, err)

	for _, control := range []bool{false, true} {
		id := 10
		if control {
			id = 11
		}
		tx, err := b.pool.Begin(ctx)
		require.NoError(t, err)
		_, err = tx.Exec(ctx, "INSERT INTO accounts (id, balance, fence_token) VALUES ($1, 1, $2)", id, newer)
		require.NoError(t, err)

		marker := "upsert-race-" + map[bool]string{false: "builder", true: "control"}[control]
		done := make(chan error, 1)
		var matched int64
		go func() {
			conn, err := b.pool.Acquire(ctx)
			if err != nil {
				done <- err
				return
			}
			defer conn.Release()
			if _, err := conn.Exec(ctx, "SELECT pg_catalog.set_config('application_name', $1, false)", marker); err != nil {
				done <- err
				return
			}
			if control {
				var written, nulls int64
				var current *int64
				var held bool
				done <- conn.QueryRow(ctx, full, id, 2, tok).Scan(&written, &matched, &current, &nulls, &held)
				return
			}
			_, err = put.Exec(ctx, conn, tok, id, 2)
			done <- err
		}()
		b.waitForAppLockWait(t, marker)
		require.NoError(t, tx.Commit(ctx))
		err = <-done
		if control {
			require.NoError(t, err)
			require.Zero(t, matched, "the full statement's snapshot does not have the row")
			continue
		}
		var stale *fence.StaleTokenError
		require.ErrorAs(t, err, &stale)
		require.Equal(t, newer, stale.Current)
	}
}

// waitForAppLockWait returns once the backend with application_name app
// waits for a lock.
func (b *testBundle) waitForAppLockWait(t *testing.T, app string) {
	t.Helper()
	ctx := context.Background()
	for i := 0; ; i++ {
		var waiting bool
		require.NoError(t, b.pool.QueryRow(ctx, `SELECT EXISTS (
			SELECT FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock' AND application_name = $1)`, app).Scan(&waiting))
		if waiting {
			return
		}
		require.Less(t, i, 100000, "backend %q never waited for a lock", app)
		_, err := b.pool.Exec(ctx, "SELECT pg_sleep(0.005)")
		require.NoError(t, err)
	}
}

// How a rejection leaves the caller's transaction: the builder's own
// predicate rejects without an error from the database, so the
// transaction goes on; a pgfence_guard trigger raises PF001, which aborts
// it.
func TestRejectionAndTheTransaction(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	tok, newer := b.nextToken(t), b.nextToken(t)
	b.account(t, 1, 0, newer)

	tx, err := b.pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = addBalance.Exec(ctx, tx, tok, 5, 1)
	require.ErrorIs(t, err, pgfence.ErrFenced)
	var one int
	require.NoError(t, tx.QueryRow(ctx, "SELECT 1").Scan(&one), "the builder's rejection leaves tx usable")

	_, err = fence.Check(tx.Exec(ctx, "UPDATE accounts SET balance = balance + 5, fence_token = $1 WHERE id = 1", tok))
	var stale *fence.StaleTokenError
	require.ErrorAs(t, err, &stale)
	require.NotNil(t, stale.Err, "the trigger rejected it")
	err = tx.QueryRow(ctx, "SELECT 1").Scan(&one)
	var pgErr interface{ SQLState() string }
	require.True(t, errors.As(err, &pgErr))
	require.Equal(t, "25P02", pgErr.SQLState(), "the trigger's rejection aborts tx")
}

// The upsert's full statement itself loses a race: after the fast
// statement wrote nothing (the row was stale), another transaction
// replaces the row, and commits while the full statement waits for it;
// the full statement's snapshot still has the old row, which it then
// finds deleted. The rerun reads the replacement's token; with the rerun
// turned off (the negative control) Current is 0.
func TestUpsertRerunReadsTheRowThatWon(t *testing.T) {
	t.Parallel()
	for _, noRerun := range []bool{false, true} {
		ctx := context.Background()
		b := setup(t)
		tok, newer, newest := b.nextToken(t), b.nextToken(t), b.nextToken(t)
		b.account(t, 20, 1, newer)
		app := fmt.Sprintf("upserter-%v", noRerun)
		pool := b.db.NewPool(t, func(c *pgxpool.Config) { c.ConnConfig.RuntimeParams["application_name"] = app })
		put := fence.Upsert("accounts").Columns("id", "balance").Values("$1", "$2").OnConflict("id")

		committed := make(chan error, 1)
		replace := func() {
			tx, err := b.pool.Begin(ctx)
			if err == nil {
				_, err = tx.Exec(ctx, "DELETE FROM accounts WHERE id = 20")
			}
			if err == nil {
				_, err = tx.Exec(ctx, "INSERT INTO accounts (id, balance, fence_token) VALUES (20, 5, $1)", newest)
			}
			if err != nil {
				committed <- err
				return
			}
			go func() {
				for {
					var waiting bool
					err := b.pool.QueryRow(ctx, `SELECT EXISTS (SELECT FROM pg_stat_activity
						WHERE datname = current_database() AND wait_event_type = 'Lock' AND application_name = $1)`, app).Scan(&waiting)
					if err != nil {
						committed <- err
						return
					}
					if waiting {
						committed <- tx.Commit(ctx)
						return
					}
					time.Sleep(2 * time.Millisecond)
				}
			}()
		}
		_, err := fence.WithAfterFast(put, replace, noRerun).Exec(ctx, pool, tok, 20, 2)
		require.NoError(t, <-committed)
		var stale *fence.StaleTokenError
		require.ErrorAs(t, err, &stale)
		if noRerun {
			require.Zero(t, stale.Current, "negative control: the full statement alone cannot read the row")
		} else {
			require.Equal(t, newest, stale.Current)
		}
	}
}
