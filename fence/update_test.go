package fence_test

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence"
	"github.com/pgfence/pgfence/fence"
)

var addBalance = fence.Update("accounts").Set("balance = balance + $1").Where("id = $2")

func TestUpdateNewerTokenWrites(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	old, tok := b.nextToken(t), b.nextToken(t)
	b.account(t, 1, 100, old)

	tag, err := addBalance.Exec(ctx, b.pool, tok, 5, 1)
	require.NoError(t, err)
	require.Equal(t, "UPDATE 1", tag.String())
	bal, got := b.row(t, 1)
	require.Equal(t, int64(105), bal)
	require.Equal(t, tok, got)

	// The default <= lets the same holder write again.
	_, err = addBalance.Exec(ctx, b.pool, tok, 5, 1)
	require.NoError(t, err)
	bal, _ = b.row(t, 1)
	require.Equal(t, int64(110), bal)
}

func TestUpdateStaleTokenIsFencedAndRowUnchanged(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	stale, current := b.nextToken(t), b.nextToken(t)
	b.account(t, 1, 100, current)

	tag, err := addBalance.Exec(ctx, b.pool, stale, 5, 1)
	require.ErrorIs(t, err, pgfence.ErrFenced)
	require.NotErrorIs(t, err, pgx.ErrNoRows)
	require.NotErrorIs(t, err, pgfence.ErrLeaseLost)
	var se *fence.StaleTokenError
	require.ErrorAs(t, err, &se)
	require.Equal(t, stale, se.Presented)
	require.Equal(t, current, se.Current)
	require.Equal(t, `"accounts"`, se.Table)
	require.Nil(t, se.Err, "the builder's own check rejected it, not the trigger")
	require.Zero(t, tag.RowsAffected())

	bal, tok := b.row(t, 1)
	require.Equal(t, int64(100), bal)
	require.Equal(t, current, tok)
}

func TestUpdateMissingRowIsNoRows(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.account(t, 1, 100, 1)
	_, err := addBalance.Exec(context.Background(), b.pool, b.nextToken(t), 5, 2)
	require.ErrorIs(t, err, pgx.ErrNoRows)
	require.NotErrorIs(t, err, pgfence.ErrFenced)
}

func TestUpdateStrictAllowsOneWritePerToken(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	b.account(t, 1, 100, 0)
	tok := b.nextToken(t)
	strict := addBalance.Strict()

	_, err := strict.Exec(ctx, b.pool, tok, 5, 1)
	require.NoError(t, err)
	_, err = strict.Exec(ctx, b.pool, tok, 5, 1)
	var se *fence.StaleTokenError
	require.ErrorAs(t, err, &se)
	require.Equal(t, tok, se.Presented)
	require.Equal(t, tok, se.Current)
	bal, _ := b.row(t, 1)
	require.Equal(t, int64(105), bal)

	_, err = strict.Exec(ctx, b.pool, b.nextToken(t), 5, 1)
	require.NoError(t, err)
}

func TestUpdateSeveralRowsIsAllOrNothing(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	t1, t2, t3 := b.nextToken(t), b.nextToken(t), b.nextToken(t)
	b.account(t, 1, 100, t1)
	b.account(t, 2, 100, t3) // written by a newer holder
	b.account(t, 3, 100, t1)

	all := fence.Update("accounts").Set("balance = 0").Where("id = ANY($1)")
	_, err := all.Exec(ctx, b.pool, t2, []int32{1, 2, 3})
	var se *fence.StaleTokenError
	require.ErrorAs(t, err, &se)
	require.Equal(t, t3, se.Current)
	for id := 1; id <= 3; id++ {
		bal, _ := b.row(t, id)
		require.Equal(t, int64(100), bal, "row %d must be unchanged", id)
	}

	tag, err := all.Exec(ctx, b.pool, t3, []int32{1, 2, 3})
	require.NoError(t, err)
	require.Equal(t, int64(3), tag.RowsAffected())
}

func TestUpdateNullGuardIsReported(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	b.exec(t, "CREATE TABLE loose (id int PRIMARY KEY, v int, fence_token bigint)")
	b.exec(t, "INSERT INTO loose VALUES (1, 1, NULL)")
	_, err := fence.Update("loose").Set("v = 2").Where("id = $1").Exec(ctx, b.pool, b.nextToken(t), 1)
	require.ErrorContains(t, err, "NULL")
	require.NotErrorIs(t, err, pgfence.ErrFenced)
	var v int
	require.NoError(t, b.pool.QueryRow(ctx, "SELECT v FROM loose").Scan(&v))
	require.Equal(t, 1, v)
}

func TestUpdateCustomColumnAndSchema(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	b.exec(t, `CREATE SCHEMA billing;
		CREATE TABLE billing."Ledger" (id int PRIMARY KEY, note text NOT NULL, "Epoch" bigint NOT NULL DEFAULT 0)`)
	b.exec(t, `INSERT INTO billing."Ledger" (id, note) VALUES (1, 'a')`)
	stmt := fence.UpdateIdent(pgx.Identifier{"billing", "Ledger"}).Column("Epoch").
		Set("note = $1 || ' costs $2'").Where("id = $2")
	stale, tok := b.nextToken(t), b.nextToken(t)
	_, err := stmt.Exec(ctx, b.pool, tok, "b", 1)
	require.NoError(t, err)
	var note string
	var epoch int64
	require.NoError(t, b.pool.QueryRow(ctx, `SELECT note, "Epoch" FROM billing."Ledger"`).Scan(&note, &epoch))
	require.Equal(t, "b costs $2", note)
	require.Equal(t, tok, epoch)

	_, err = stmt.Exec(ctx, b.pool, stale, "c", 1)
	require.ErrorIs(t, err, pgfence.ErrFenced)
}

func TestUpdateInTransactionAndOnConn(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	b.account(t, 1, 100, 0)

	stale, tok := b.nextToken(t), b.nextToken(t)
	tx, err := b.pool.Begin(ctx)
	require.NoError(t, err)
	t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
	_, err = addBalance.Exec(ctx, tx, tok, 5, 1)
	require.NoError(t, err)
	// A rejected write does not abort the transaction.
	_, err = addBalance.Exec(ctx, tx, stale, 5, 1)
	require.ErrorIs(t, err, pgfence.ErrFenced)
	_, err = addBalance.Exec(ctx, tx, tok, 1, 1)
	require.NoError(t, err)
	require.NoError(t, tx.Rollback(ctx))
	bal, got := b.row(t, 1)
	require.Equal(t, int64(100), bal)
	require.Zero(t, got)

	conn := b.db.Conn(t)
	_, err = addBalance.Exec(ctx, conn, tok, 7, 1)
	require.NoError(t, err)
	bal, _ = b.row(t, 1)
	require.Equal(t, int64(107), bal)
}

func TestUpdateDatabaseErrorIsWrapped(t *testing.T) {
	t.Parallel()
	b := setup(t)
	_, err := fence.Update("nope").Set("v = 1").Where("true").Exec(context.Background(), b.pool, 1)
	require.ErrorContains(t, err, `guarded write to "nope"`)
	require.False(t, errors.Is(err, pgfence.ErrFenced))
}

// Fragments are pieces of one expression: a fragment that could swallow or
// end the SQL the builder puts after it is refused before anything is sent,
// with an error naming the fragment and what is wrong with it.
func TestUnsafeFragmentsAreRejectedBeforeSending(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	tests := []struct {
		name string
		stmt interface {
			Exec(context.Context, pgfence.DB, int64, ...any) (pgconn.CommandTag, error)
		}
		nargs int
		want  string
	}{
		{"where escapes its parentheses", fence.Update("accounts").Set("balance = $1").Where("id = $2) OR (id = $2"), 2,
			`Where fragment "id = $2) OR (id = $2": unbalanced ')' at byte 7`},
		{"delete where escapes", fence.Delete("accounts").Where("true) OR (true"), 0, `unbalanced ')'`},
		{"unclosed parenthesis", fence.Update("accounts").Set("balance = f($1").Where("id = $2"), 2, `Set fragment "balance = f($1": unbalanced '('`},
		{"line comment", fence.Update("accounts").Set("balance = $1 -- add").Where("id = $2"), 2, "may not contain comments"},
		{"block comment", fence.Delete("accounts").Where("id = $1 /* x */"), 1, "may not contain comments"},
		{"unterminated string", fence.Delete("accounts").Where("id = $1 OR 'x"), 1, "unterminated string constant"},
		{"unterminated identifier", fence.Delete("accounts").Where(`"id = $1`), 1, "unterminated quoted identifier"},
		{"unterminated dollar quote", fence.Delete("accounts").Where("id = $1 OR $q$"), 1, "unterminated dollar-quoted string $q$"},
		{"semicolon", fence.Delete("accounts").Where("id = $1; DELETE FROM accounts"), 1, "semicolon"},
		{"backslash before quote", fence.Delete("accounts").Where(`id = $1 AND 'a\' = 'a\'`), 1, "backslash before a quote"},
		{"upsert value", fence.Upsert("accounts").Columns("id", "balance").Values("$1", "$2) UNION (SELECT 1, 2").OnConflict("id"), 2,
			`Values fragment "$2) UNION (SELECT 1, 2": unbalanced ')'`},
		{"upsert set", fence.Upsert("accounts").Columns("id", "balance").Values("$1", "$2").OnConflict("id").Set("balance = 1 --"), 2,
			"may not contain comments"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			args := make([]any, tt.nargs)
			for i := range args {
				args[i] = i + 1
			}
			_, err := tt.stmt.Exec(ctx, noDB{t}, 5, args...)
			require.ErrorContains(t, err, tt.want)
		})
	}
}

// Every pgx handle a caller may hold can run a guarded write.
var (
	_ pgfence.DB = (*pgxpool.Pool)(nil)
	_ pgfence.DB = (*pgxpool.Conn)(nil)
	_ pgfence.DB = (*pgx.Conn)(nil)
	_ pgfence.DB = pgx.Tx(nil)
)

// Behind a transaction-pooling proxy, pgx is often set to the simple
// protocol, which interpolates arguments client-side.
func TestSimpleProtocolAndPoolConn(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	pool := b.db.NewPool(t, func(c *pgxpool.Config) {
		c.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeSimpleProtocol
	})
	stale, tok := b.nextToken(t), b.nextToken(t)
	tokL, secL := b.acquireLease(t, "ledger", "A")

	_, err := upsertAccount.Exec(ctx, pool, tok, 1, 100)
	require.NoError(t, err)
	_, err = addBalance.Exec(ctx, pool, stale, 5, 1)
	require.ErrorIs(t, err, pgfence.ErrFenced)
	_, err = addBalance.LeaseSchema(b.schema).UnderLease("ledger", secL).Exec(ctx, pool, tokL, 5, 1)
	require.NoError(t, err)

	conn, err := pool.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	_, err = deleteAccount.Exec(ctx, conn, tokL, 1)
	require.NoError(t, err)
	require.Equal(t, 0, countAccounts(t, b))
}
