package fence_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence"
	"github.com/pgfence/pgfence/fence"
	"github.com/pgfence/pgfence/internal/pgtest"
)

func TestTriggerRejectsRawUpdateWithOldToken(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	stale, cur := b.nextToken(t), b.nextToken(t)
	b.account(t, 1, 100, cur)

	_, err := fence.Check(b.pool.Exec(ctx,
		"UPDATE accounts SET balance = 0, fence_token = $1 WHERE id = $2", stale, 1))
	require.ErrorIs(t, err, pgfence.ErrFenced)
	var se *fence.StaleTokenError
	require.ErrorAs(t, err, &se)
	require.Equal(t, stale, se.Presented)
	require.Equal(t, cur, se.Current)
	var pgErr *pgconn.PgError
	require.ErrorAs(t, err, &pgErr)
	require.Equal(t, fence.SQLState, pgErr.Code)
	bal, _ := b.row(t, 1)
	require.Equal(t, int64(100), bal)

	_, err = fence.Check(b.pool.Exec(ctx, "UPDATE accounts SET fence_token = NULL WHERE id = 1"))
	require.ErrorIs(t, err, pgfence.ErrFenced, "NULL is not a token")

	_, err = fence.Check(b.pool.Exec(ctx,
		"UPDATE accounts SET balance = 1, fence_token = $1 WHERE id = $2", cur+1, 2))
	require.ErrorIs(t, err, pgx.ErrNoRows, "no such row")

	tag, err := fence.Check(b.pool.Exec(ctx,
		"UPDATE accounts SET balance = 1, fence_token = $1 WHERE id = $2", cur, 1))
	require.NoError(t, err)
	require.Equal(t, int64(1), tag.RowsAffected())
}

func TestTriggerRejectsRawDeleteWithOldToken(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	stale, cur := b.nextToken(t), b.nextToken(t)
	b.account(t, 1, 100, cur)

	// The plain-SQL delete from the package documentation.
	const del = `DELETE FROM accounts
	WHERE id = $1 AND set_config('pgfence.token', $2::bigint::text, true) IS NOT NULL`
	tx, err := b.pool.Begin(ctx)
	require.NoError(t, err)
	t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
	_, err = tx.Exec(ctx, "SELECT set_config('pgfence.token', $1::bigint::text, true)", stale)
	require.NoError(t, err)
	_, err = fence.Check(tx.Exec(ctx, "DELETE FROM accounts WHERE id = 1"))
	require.ErrorIs(t, err, pgfence.ErrFenced)
	require.NoError(t, tx.Rollback(ctx))
	require.Equal(t, 1, countAccounts(t, b))

	_, err = fence.Check(b.pool.Exec(ctx, del, 1, stale))
	require.ErrorIs(t, err, pgfence.ErrFenced)
	_, err = fence.Check(b.pool.Exec(ctx, del, 1, cur))
	require.NoError(t, err)
	require.Equal(t, 0, countAccounts(t, b))
}

func TestTriggerAllowsUpdatesThatCarryNoToken(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.account(t, 1, 100, 5)
	// An UPDATE that leaves the column alone carries no token: the trigger
	// cannot tell who sent it and lets it through (documented).
	_, err := fence.Check(b.pool.Exec(context.Background(), "UPDATE accounts SET balance = 1 WHERE id = 1"))
	require.NoError(t, err)
}

func TestClassifyLeavesOtherErrorsAlone(t *testing.T) {
	t.Parallel()
	require.NoError(t, fence.Classify(nil))
	other := &pgconn.PgError{Code: "23505"}
	require.Same(t, other, fence.Classify(other).(*pgconn.PgError))
	se, ok := fence.Classify(&pgconn.PgError{Code: fence.SQLState, Detail: "garbled"}).(*fence.StaleTokenError)
	require.True(t, ok)
	require.Zero(t, se.Presented)
}

// migrationUp and migrationDown are a user migration that attaches the
// default-mode trigger by hand, as docs/fencing.md shows.
const (
	migrationUp = `ALTER TABLE accounts ADD COLUMN fence_token bigint NOT NULL DEFAULT 0;
CREATE TRIGGER accounts_fence
    BEFORE UPDATE OR DELETE ON accounts
    FOR EACH ROW EXECUTE FUNCTION pgfence.pgfence_guard('fence_token');`
	migrationDown = `DROP TRIGGER IF EXISTS accounts_fence ON accounts;
ALTER TABLE accounts DROP COLUMN IF EXISTS fence_token;`
)

func TestUserMigrationProtectsExistingTable(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.NewDB(t)
	exec := func(sql string, args ...any) error { _, err := db.Pool.Exec(ctx, sql, args...); return err }
	require.NoError(t, exec("CREATE TABLE accounts (id int PRIMARY KEY, balance bigint NOT NULL)"))
	require.NoError(t, exec("INSERT INTO accounts VALUES (1, 100)"))

	require.NoError(t, exec(migrationUp))
	_, err := addBalance.Exec(ctx, db.Pool, 7, 5, 1)
	require.NoError(t, err)
	_, err = addBalance.Exec(ctx, db.Pool, 6, 5, 1)
	require.ErrorIs(t, err, pgfence.ErrFenced)
	_, err = fence.Check(db.Pool.Exec(ctx, "UPDATE accounts SET fence_token = 6 WHERE id = 1"))
	require.ErrorIs(t, err, pgfence.ErrFenced)

	require.NoError(t, exec(migrationDown))
	require.NoError(t, exec("UPDATE accounts SET balance = 0 WHERE id = 1"))
	require.NoError(t, exec(migrationUp), "the down migration removed everything the up created")
}

func TestBuilderMapsTriggerRejection(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	cur, tok := b.nextToken(t), b.nextToken(t)
	b.account(t, 1, 100, cur)
	// A misbehaving trigger (it fires before accounts_fence, by name) moves
	// the token backwards behind the builder's back; pgfence_guard catches it.
	b.exec(t, `CREATE FUNCTION rewind() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN NEW.fence_token := 0; RETURN NEW; END $$;
		CREATE TRIGGER accounts_a_rewind BEFORE UPDATE ON accounts
		    FOR EACH ROW EXECUTE FUNCTION rewind();`)
	_, err := addBalance.Exec(ctx, b.pool, tok, 5, 1)
	var se *fence.StaleTokenError
	require.ErrorAs(t, err, &se)
	require.Equal(t, `"accounts"`, se.Table)
	require.Zero(t, se.Presented)
	require.Equal(t, cur, se.Current)
	var pgErr *pgconn.PgError
	require.ErrorAs(t, err, &pgErr)
	require.Equal(t, fence.SQLState, pgErr.Code)
}

// TestTriggerForms checks every way of attaching pgfence_guard: with no
// argument, naming the default column, naming another column (read through
// the row's jsonb form), and with the WHEN conditions that skip the
// function for rows it would accept.
func TestTriggerForms(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, column, triggers string
	}{
		{"no argument", "fence_token", `CREATE TRIGGER g BEFORE UPDATE OR DELETE ON guarded
			FOR EACH ROW EXECUTE FUNCTION pgfence.pgfence_guard();`},
		{"default column", "fence_token", `CREATE TRIGGER g BEFORE UPDATE OR DELETE ON guarded
			FOR EACH ROW EXECUTE FUNCTION pgfence.pgfence_guard('fence_token');`},
		{"other column", `"Lease Token"`, `CREATE TRIGGER g BEFORE UPDATE OR DELETE ON guarded
			FOR EACH ROW EXECUTE FUNCTION pgfence.pgfence_guard('Lease Token');`},
		{"with WHEN", "fence_token", `CREATE TRIGGER g_update BEFORE UPDATE ON guarded FOR EACH ROW
			WHEN (NEW.fence_token IS NULL OR NEW.fence_token < OLD.fence_token)
			EXECUTE FUNCTION pgfence.pgfence_guard();
			CREATE TRIGGER g_delete BEFORE DELETE ON guarded FOR EACH ROW
			WHEN (current_setting('pgfence.token', true) <> '')
			EXECUTE FUNCTION pgfence.pgfence_guard();`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			db := pgtest.NewDB(t)
			exec := func(sql string, args ...any) error {
				_, err := fence.Check(db.Pool.Exec(ctx, sql, args...))
				return err
			}
			_, err := db.Pool.Exec(ctx, `CREATE TABLE guarded (id int PRIMARY KEY, v int NOT NULL, `+
				tt.column+` bigint); `+tt.triggers)
			require.NoError(t, err)
			require.NoError(t, exec(`INSERT INTO guarded VALUES (1, 0, 10), (2, 0, 10), (3, 0, NULL)`))
			set := "UPDATE guarded SET v = v + 1, " + tt.column + " = $1 WHERE id = $2"

			err = exec(set, 9, 1)
			var se *fence.StaleTokenError
			require.ErrorAs(t, err, &se)
			require.Equal(t, int64(9), se.Presented)
			require.Equal(t, int64(10), se.Current)
			require.ErrorIs(t, exec(set, nil, 1), pgfence.ErrFenced, "NULL is not a token")
			require.NoError(t, exec(set, 10, 1), "same token")
			require.NoError(t, exec(set, 11, 1), "newer token")
			require.NoError(t, exec(set, 1, 3), "a row without a token yet takes any token")

			del := `DELETE FROM guarded WHERE id = $1 AND set_config('pgfence.token', $2::bigint::text, true) IS NOT NULL`
			require.ErrorIs(t, exec(del, 2, 9), pgfence.ErrFenced)
			require.NoError(t, exec("DELETE FROM guarded WHERE id = 2"), "a DELETE without pgfence.token is not checked")
			require.NoError(t, exec(del, 1, 11))
			var n int
			require.NoError(t, db.Pool.QueryRow(ctx, "SELECT count(*) FROM guarded").Scan(&n))
			require.Equal(t, 1, n)
		})
	}
}

func TestTriggerOnMissingColumn(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.NewDB(t)
	_, err := db.Pool.Exec(ctx, `CREATE TABLE guarded (id int PRIMARY KEY, v int NOT NULL);
		CREATE TRIGGER g BEFORE UPDATE OR DELETE ON guarded
			FOR EACH ROW EXECUTE FUNCTION pgfence.pgfence_guard('tok');
		INSERT INTO guarded VALUES (1, 0);`)
	require.NoError(t, err)
	for _, sql := range []string{
		"UPDATE guarded SET v = 1",
		"DELETE FROM guarded WHERE set_config('pgfence.token', '5', true) IS NOT NULL",
	} {
		_, err = db.Pool.Exec(ctx, sql)
		var pgErr *pgconn.PgError
		require.ErrorAs(t, err, &pgErr, sql)
		require.Equal(t, "42703", pgErr.Code, sql)
		require.Contains(t, pgErr.Message, `has no column tok`, sql)
	}
}

func TestClassifyMalformedToken(t *testing.T) {
	t.Parallel()
	pgErr := &pgconn.PgError{Code: fence.SQLStateMalformedToken,
		Message: "pgfence: malformed pgfence.token setting 'abc': want a fencing token (a bigint) or an empty string"}
	for _, err := range []error{fence.Classify(pgErr), func() error { _, err := fence.Check(pgconn.CommandTag{}, pgErr); return err }()} {
		require.ErrorIs(t, err, fence.ErrMalformedToken)
		require.NotErrorIs(t, err, pgfence.ErrFenced)
		var got *pgconn.PgError
		require.ErrorAs(t, err, &got)
		require.Same(t, pgErr, got)
		require.Contains(t, err.Error(), "'abc'")
	}
}

// A trigger rejection that is not a stale token is described by the
// trigger's own message.
func TestStaleTokenErrorMessages(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		err  error
		want string
	}{
		{"builder", &fence.StaleTokenError{Table: `"t"`, Presented: 6, Current: 7},
			`pgfence: write rejected on "t": stale fencing token 6, row carries 7`},
		{"builder, current unknown", &fence.StaleTokenError{Presented: 6},
			`pgfence: write rejected: stale fencing token 6, row carries a newer token`},
		{"trigger, stale", fence.Classify(&pgconn.PgError{Code: fence.SQLState, Detail: "presented=6 current=7",
			Message: "pgfence: stale fencing token 6 on public.t (current 7)"}),
			`pgfence: write rejected: stale fencing token 6, row carries 7`},
		{"trigger, no token", fence.Classify(&pgconn.PgError{Code: fence.SQLState, Detail: "presented= current=7",
			Message: "pgfence: DELETE on public.t presents no fencing token (strict mode; current 7)"}),
			`pgfence: write rejected: DELETE on public.t presents no fencing token (strict mode; current 7)`},
		{"trigger, never issued", fence.Classify(&pgconn.PgError{Code: fence.SQLState, Detail: "presented=99 current=7",
			Message: "pgfence: fencing token 99 on public.t was never issued (current 7)"}),
			`pgfence: write rejected: fencing token 99 on public.t was never issued (current 7)`},
		{"trigger, truncate", fence.Classify(&pgconn.PgError{Code: fence.SQLState, Detail: "presented= current=",
			Message: "pgfence: TRUNCATE of fenced table public.t is not allowed"}),
			`pgfence: write rejected: TRUNCATE of fenced table public.t is not allowed`},
	}
	for _, tt := range tests {
		require.EqualError(t, tt.err, tt.want, tt.name)
		require.ErrorIs(t, tt.err, pgfence.ErrFenced, tt.name)
	}
}
