package fence_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence"
	"github.com/pgfence/pgfence/fence"
	"github.com/pgfence/pgfence/internal/install"
)

// The trigger modes, as a user attaches them.
const (
	// strictDDL is strict mode: pgfence_guard_strict for rows and
	// pgfence_guard_truncate for TRUNCATE.
	strictDDL = `CREATE TRIGGER guarded_fence BEFORE UPDATE OR DELETE ON guarded
    FOR EACH ROW EXECUTE FUNCTION %[1]s.pgfence_guard_strict(%[2]s);
CREATE TRIGGER guarded_fence_truncate BEFORE TRUNCATE ON guarded
    FOR EACH STATEMENT EXECUTE FUNCTION %[1]s.pgfence_guard_truncate();`
	// defaultDDL is the default mode, pgfence_guard.
	defaultDDL = `CREATE TRIGGER guarded_fence BEFORE UPDATE OR DELETE ON guarded
    FOR EACH ROW EXECUTE FUNCTION %[1]s.pgfence_guard(%[2]s);`
)

// rowToken and lastIssued are the guarded row's token and the last token the
// sequence has handed out, in the mode tests. The sequence steps by
// install.TokenStep, and a value's whole block may have been handed out:
// setting it to lastValue makes lastIssued the largest token issued
// (pgfence_last_token).
const (
	rowToken   = 50
	lastIssued = 1060
	lastValue  = lastIssued - install.TokenStep + 1
)

// guardedSetup creates table guarded (id, v, and the guard column column,
// quoted as given) with the triggers of ddl, a row id 1 at rowToken, and
// moves the sequence to lastValue.
func guardedSetup(t *testing.T, ddl, column string) *testBundle {
	t.Helper()
	b := setup(t)
	q := pgx.Identifier{column}.Sanitize()
	b.exec(t, fmt.Sprintf(`CREATE TABLE guarded (id int PRIMARY KEY, v int NOT NULL DEFAULT 0, %s bigint NOT NULL DEFAULT 0);
		INSERT INTO guarded (id, %s) VALUES (1, %d);
		`, q, q, rowToken)+fmt.Sprintf(ddl, pgx.Identifier{b.schema}.Sanitize(), "'"+column+"'"))
	b.exec(t, "SELECT pg_catalog.setval($1::regclass, $2)", b.fn("pgfence_leases_fence_seq"), lastValue)
	return b
}

// inTx runs sql in a transaction that has pgfence.token set to setting
// (unless it is empty), returns the statement's error classified by
// fence.Classify and the guarded row's token as the statement left it (nil
// when the row is gone), then rolls back.
func (b *testBundle) inTx(t *testing.T, column, setting, sql string) (tokenAfter *int64, err error) {
	t.Helper()
	ctx := context.Background()
	tx, txErr := b.pool.Begin(ctx)
	require.NoError(t, txErr)
	defer func() { require.NoError(t, tx.Rollback(ctx)) }()
	if setting != "" {
		_, txErr = tx.Exec(ctx, "SELECT pg_catalog.set_config('pgfence.token', $1, true)", setting)
		require.NoError(t, txErr)
	}
	_, err = tx.Exec(ctx, sql)
	if err = fence.Classify(err); err != nil {
		return nil, err
	}
	var tok *int64
	row := tx.QueryRow(ctx, "SELECT "+pgx.Identifier{column}.Sanitize()+" FROM guarded WHERE id = 1")
	if scanErr := row.Scan(&tok); scanErr != nil {
		require.ErrorIs(t, scanErr, pgx.ErrNoRows)
	}
	return tok, nil
}

// modeCase is a write against the row at rowToken, run in both modes.
type modeCase struct {
	name, setting, sql string
	// presented is the token the strict rejection reports (0: none).
	presented int64
	// strict is what strict mode does: "reject" (PF001), "notoken"
	// (PF004: no token presented), or the row's
	// token afterwards (-1: the row is gone, or the table was emptied).
	strict string
	// def is what the default mode does, alike.
	def string
}

// staleCases are writes that present no token, an older one, or one never
// issued. Strict mode rejects every one; the default mode accepts those
// marked so: that is what it does not guard.
var staleCases = []modeCase{
	{"update without the column, older pgfence.token", "40", "UPDATE guarded SET v = v + 1 WHERE id = 1", 40, "reject", "50"},
	{"update without the column, no pgfence.token", "", "UPDATE guarded SET v = v + 1 WHERE id = 1", 0, "notoken", "50"},
	{"upsert without the column, older pgfence.token", "40",
		"INSERT INTO guarded (id, v) VALUES (1, 5) ON CONFLICT (id) DO UPDATE SET v = excluded.v", 40, "reject", "50"},
	{"upsert without the column, no pgfence.token", "",
		"INSERT INTO guarded (id, v) VALUES (1, 5) ON CONFLICT (id) DO UPDATE SET v = excluded.v", 0, "notoken", "50"},
	{"upsert with an older token", "", `INSERT INTO guarded (id, v, %[1]s) VALUES (1, 5, 40)
		ON CONFLICT (id) DO UPDATE SET v = excluded.v, %[1]s = excluded.%[1]s`, 40, "reject", "reject"},
	{"delete without pgfence.token", "", "DELETE FROM guarded WHERE id = 1", 0, "notoken", "-1"},
	{"delete with an older pgfence.token", "40", "DELETE FROM guarded WHERE id = 1", 40, "reject", "reject"},
	{"update with an older token", "", "UPDATE guarded SET %[1]s = 40 WHERE id = 1", 40, "reject", "reject"},
	{"update with an older token, newer pgfence.token", "55", "UPDATE guarded SET %[1]s = 40 WHERE id = 1", 40, "reject", "reject"},
	{"update to NULL", "55", "UPDATE guarded SET %[1]s = NULL WHERE id = 1", 0, "reject", "reject"},
	{"truncate", "55", "TRUNCATE guarded", 0, "reject", "-1"},
	{"update with a token never issued", "", "UPDATE guarded SET %[1]s = 2000 WHERE id = 1", 2000, "reject", "2000"},
	{"update without the column, pgfence.token never issued", "2000", "UPDATE guarded SET v = 1 WHERE id = 1", 2000, "reject", "50"},
	{"delete with pgfence.token never issued", "2000", "DELETE FROM guarded WHERE id = 1", 2000, "reject", "-1"},
}

// freshCases present a token at least as new as the row's (and issued):
// both modes accept them. Strict mode records a newer pgfence.token in the
// row when the statement leaves the column alone.
var freshCases = []modeCase{
	{"update without the column, same pgfence.token", "50", "UPDATE guarded SET v = v + 1 WHERE id = 1", 0, "50", "50"},
	{"update without the column, newer pgfence.token", "55", "UPDATE guarded SET v = v + 1 WHERE id = 1", 0, "55", "50"},
	{"pgfence.token with spaces and a sign", " +55 ", "UPDATE guarded SET v = v + 1 WHERE id = 1", 0, "55", "50"},
	{"update with a newer token", "", "UPDATE guarded SET %[1]s = 55 WHERE id = 1", 0, "55", "55"},
	{"update with the last token issued", "", "UPDATE guarded SET %[1]s = 1060 WHERE id = 1", 0, "1060", "1060"},
	{"upsert without the column, newer pgfence.token", "55",
		"INSERT INTO guarded (id, v) VALUES (1, 5) ON CONFLICT (id) DO UPDATE SET v = excluded.v", 0, "55", "50"},
	{"upsert with a newer token", "", `INSERT INTO guarded (id, v, %[1]s) VALUES (1, 5, 55)
		ON CONFLICT (id) DO UPDATE SET v = excluded.v, %[1]s = excluded.%[1]s`, 0, "55", "55"},
	{"delete with the same pgfence.token", "50", "DELETE FROM guarded WHERE id = 1", 0, "-1", "-1"},
	{"delete with a newer pgfence.token", "55", "DELETE FROM guarded WHERE id = 1", 0, "-1", "-1"},
}

// TestTriggerModes runs every case against a row at token 50 in strict mode
// (pgfence_guard_strict and pgfence_guard_truncate) and in the default mode
// (pgfence_guard), for the default column and for another one (read
// through the row's jsonb form), and checks each outcome, the rejection's
// classification, and the row's token afterwards.
func TestTriggerModes(t *testing.T) {
	t.Parallel()
	for _, column := range []string{"fence_token", "Lease Token"} {
		for _, mode := range []struct{ name, ddl string }{{"strict", strictDDL}, {"default", defaultDDL}} {
			t.Run(column+"/"+mode.name, func(t *testing.T) {
				t.Parallel()
				b := guardedSetup(t, mode.ddl, column)
				for _, c := range append(append([]modeCase{}, staleCases...), freshCases...) {
					want := c.strict
					if mode.name == "default" {
						want = c.def
					}
					sql := strings.ReplaceAll(c.sql, "%[1]s", pgx.Identifier{column}.Sanitize())
					tok, err := b.inTx(t, column, c.setting, sql)
					if want == "notoken" {
						var ne *fence.NoTokenError
						require.ErrorAs(t, err, &ne, c.name)
						require.ErrorIs(t, err, pgfence.ErrNoToken, c.name)
						require.NotErrorIs(t, err, pgfence.ErrFenced, "%s: no token is not a stale token", c.name)
						require.Equal(t, int64(rowToken), ne.Current, c.name)
						require.Equal(t, `"public"."guarded"`, ne.Table, c.name)
						var pgErr *pgconn.PgError
						require.ErrorAs(t, err, &pgErr, c.name)
						require.Equal(t, fence.SQLStateNoToken, pgErr.Code, c.name)
						require.Contains(t, pgErr.Hint, "pgfence_present(token)", c.name)
						continue
					}
					if want == "reject" {
						var se *fence.StaleTokenError
						require.ErrorAs(t, err, &se, c.name)
						require.ErrorIs(t, err, pgfence.ErrFenced, c.name)
						var pgErr *pgconn.PgError
						require.ErrorAs(t, err, &pgErr, c.name)
						require.Equal(t, fence.SQLState, pgErr.Code, c.name)
						require.Equal(t, c.presented, se.Presented, c.name)
						if c.name != "truncate" {
							require.Equal(t, int64(rowToken), se.Current, c.name)
						}
						continue
					}
					require.NoError(t, err, "%s: %s", c.name, sql)
					if want == "-1" {
						require.Nil(t, tok, "%s: the row is gone", c.name)
						continue
					}
					require.NotNil(t, tok, c.name)
					require.Equal(t, want, fmt.Sprint(*tok), "%s: the row's token", c.name)
				}
			})
		}
	}
}

// A token greater than any the sequence handed out is not a token: strict
// mode rejects it, with a message saying so.
func TestStrictRejectsTokenNeverIssued(t *testing.T) {
	t.Parallel()
	b := guardedSetup(t, strictDDL, "fence_token")
	_, err := b.inTx(t, "fence_token", "", "UPDATE guarded SET fence_token = 1061 WHERE id = 1")
	var se *fence.StaleTokenError
	require.ErrorAs(t, err, &se)
	require.Equal(t, int64(1061), se.Presented)
	require.Equal(t, int64(rowToken), se.Current)
	require.ErrorContains(t, err, "fencing token 1061 on public.guarded was never issued")

	// Builders are checked the same way.
	_, err = fence.Update("guarded").Set("v = $1").Where("id = $2").Exec(context.Background(), b.pool, 2000, 1, 1)
	require.ErrorAs(t, err, &se)
	require.Equal(t, `"guarded"`, se.Table)
	require.Equal(t, int64(2000), se.Presented)
	require.ErrorContains(t, err, "was never issued")
}

// A pgfence.token that is not a bigint is an error of its own (PF003), in
// both modes, never taken for "no token".
func TestMalformedPgfenceToken(t *testing.T) {
	t.Parallel()
	for _, mode := range []struct{ name, ddl string }{{"strict", strictDDL}, {"default", defaultDDL}} {
		t.Run(mode.name, func(t *testing.T) {
			t.Parallel()
			b := guardedSetup(t, mode.ddl, "fence_token")
			sqls := []string{"DELETE FROM guarded WHERE id = 1"}
			if mode.name == "strict" {
				sqls = append(sqls, "UPDATE guarded SET v = 1 WHERE id = 1")
			}
			for _, setting := range []string{"abc", "1.5", "5 5", "0x10", "99999999999999999999", "9223372036854775808"} {
				for _, sql := range sqls {
					_, err := b.inTx(t, "fence_token", setting, sql)
					require.ErrorIs(t, err, fence.ErrMalformedToken, "%q: %s", setting, sql)
					require.NotErrorIs(t, err, pgfence.ErrFenced)
					var pgErr *pgconn.PgError
					require.ErrorAs(t, err, &pgErr)
					require.Equal(t, fence.SQLStateMalformedToken, pgErr.Code)
					require.Contains(t, pgErr.Message, fmt.Sprintf("malformed pgfence.token setting '%s'", setting))
				}
			}
			// The largest bigint is well formed (and, here, never issued).
			_, err := b.inTx(t, "fence_token", "9223372036854775807", "DELETE FROM guarded WHERE id = 1")
			if mode.name == "strict" {
				require.ErrorIs(t, err, pgfence.ErrFenced)
			} else {
				require.NoError(t, err)
			}
		})
	}
}

// The builders present pgfence.token in every statement, so on a strict
// table a holder can write the same row again with the same token (the
// column does not change, so the trigger reads pgfence.token). The negative
// control shows a hand-written statement that sets the column to the same
// token but leaves pgfence.token unset is rejected there.
func TestBuildersOnStrictTable(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := guardedSetup(t, strictDDL, "fence_token")
	update := fence.Update("guarded").Set("v = v + $1").Where("id = $2")
	upsert := fence.Upsert("guarded").Columns("id", "v").Values("$1", "$2").OnConflict("id")
	del := fence.Delete("guarded").Where("id = $1")

	for range 2 {
		_, err := update.Exec(ctx, b.pool, 55, 1, 1)
		require.NoError(t, err)
		_, err = upsert.Exec(ctx, b.pool, 55, 1, 7)
		require.NoError(t, err)
	}
	_, err := update.Exec(ctx, b.pool, 40, 1, 1)
	var se *fence.StaleTokenError
	require.ErrorAs(t, err, &se)
	require.Nil(t, se.Err, "the builder's own check rejected it, before the trigger")
	require.Equal(t, int64(55), se.Current)

	_, err = fence.Check(b.pool.Exec(ctx, "UPDATE guarded SET v = 0, fence_token = 55 WHERE id = 1"))
	require.ErrorIs(t, err, pgfence.ErrNoToken, "negative control: the same token without pgfence.token presents none")
	require.NotErrorIs(t, err, pgfence.ErrFenced)

	_, err = del.Exec(ctx, b.pool, 40, 1)
	require.ErrorIs(t, err, pgfence.ErrFenced)
	_, err = del.Exec(ctx, b.pool, 56, 1)
	require.NoError(t, err)
}

// Strict mode guards the rows that exist. An INSERT is not checked: a new
// row carries the token it is inserted with, so after a holder deleted a
// row, a stale holder can insert it again (with its older token), and then
// every newer holder can write it. Tables where that matters keep the row
// and mark it deleted (an UPDATE, which the trigger checks) instead.
func TestStrictDoesNotGuardReinsert(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := guardedSetup(t, strictDDL, "fence_token")
	_, err := fence.Delete("guarded").Where("id = $1").Exec(ctx, b.pool, 55, 1)
	require.NoError(t, err)
	_, err = fence.Check(b.pool.Exec(ctx, "INSERT INTO guarded (id, v, fence_token) VALUES (1, 9, 40)"))
	require.NoError(t, err, "documented: an INSERT by a stale holder is accepted")
	_, err = fence.Upsert("guarded").Columns("id", "v").Values("$1", "$2").OnConflict("id").Exec(ctx, b.pool, 40, 2, 9)
	require.NoError(t, err, "documented: so is the insert of a stale holder's upsert")
	tok, err := b.inTx(t, "fence_token", "", "SELECT 1")
	require.NoError(t, err)
	require.Equal(t, int64(40), *tok, "the re-inserted row carries the stale holder's token")
	_, err = b.inTx(t, "fence_token", "", "UPDATE guarded SET v = 1 WHERE id = 1")
	require.ErrorIs(t, err, pgfence.ErrNoToken, "once inserted, the row is guarded again")
}

// Attached the wrong way, the strict and TRUNCATE trigger functions refuse
// every write with an error that says how to attach them (SQLSTATE 39P01),
// rather than guarding nothing.
func TestStrictTriggersAttachedWrongly(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	s := pgx.Identifier{b.schema}.Sanitize()
	for _, tt := range []struct{ ddl, write, want string }{
		{"CREATE TRIGGER g AFTER UPDATE ON t FOR EACH ROW EXECUTE FUNCTION " + s + ".pgfence_guard_strict()",
			"UPDATE t SET v = 1", "attach it BEFORE UPDATE OR DELETE ... FOR EACH ROW, not AFTER UPDATE FOR EACH ROW"},
		{"CREATE TRIGGER g BEFORE UPDATE ON t FOR EACH STATEMENT EXECUTE FUNCTION " + s + ".pgfence_guard_strict()",
			"UPDATE t SET v = 1", "not BEFORE UPDATE FOR EACH STATEMENT"},
		{"CREATE TRIGGER g BEFORE INSERT ON t FOR EACH ROW EXECUTE FUNCTION " + s + ".pgfence_guard_strict()",
			"INSERT INTO t VALUES (2, 0, 0)", "not BEFORE INSERT FOR EACH ROW"},
		{"CREATE TRIGGER g BEFORE UPDATE ON t FOR EACH ROW EXECUTE FUNCTION " + s + ".pgfence_guard_truncate()",
			"UPDATE t SET v = 1", "attach it BEFORE TRUNCATE ... FOR EACH STATEMENT, not BEFORE UPDATE FOR EACH ROW"},
	} {
		b.exec(t, "DROP TABLE IF EXISTS t; CREATE TABLE t (id int PRIMARY KEY, v int NOT NULL, fence_token bigint NOT NULL); "+
			"INSERT INTO t VALUES (1, 0, 0); "+tt.ddl)
		_, err := b.pool.Exec(ctx, tt.write)
		var pgErr *pgconn.PgError
		require.ErrorAs(t, err, &pgErr, tt.ddl)
		require.Equal(t, "39P01", pgErr.Code, tt.ddl)
		require.Contains(t, pgErr.Message, tt.want, tt.ddl)
	}
}

// TestNoTokenErrorNamesTable checks that Classify names the table of a
// strict trigger's PF004 raised through the caller's own SQL: quoted, with
// its schema, from the trigger's message. Controls: a table whose name
// holds a dot (the message cannot be split) and a PF004 raised by other
// SQL leave Table empty; the error's own table fields, when a driver error
// carries them, win.
func TestNoTokenErrorNamesTable(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	fn := b.fn("pgfence_guard_strict")
	b.exec(t, `CREATE SCHEMA "App Data";
		CREATE TABLE "App Data"."Ledger" (id int PRIMARY KEY, fence_token bigint NOT NULL DEFAULT 0);
		CREATE TABLE "App Data"."v1.ledger" (id int PRIMARY KEY, fence_token bigint NOT NULL DEFAULT 0);
		INSERT INTO "App Data"."Ledger" VALUES (1, 7);
		INSERT INTO "App Data"."v1.ledger" VALUES (1, 7);
		CREATE TRIGGER f BEFORE UPDATE OR DELETE ON "App Data"."Ledger" FOR EACH ROW EXECUTE FUNCTION `+fn+`();
		CREATE TRIGGER f BEFORE UPDATE OR DELETE ON "App Data"."v1.ledger" FOR EACH ROW EXECUTE FUNCTION `+fn+`();
		CREATE FUNCTION raise_pf004() RETURNS void LANGUAGE plpgsql AS $$
		BEGIN
			RAISE EXCEPTION 'pgfence: UPDATE on my.table presents no token' USING ERRCODE = 'PF004';
		END $$`)
	noToken := func(t *testing.T, sql string) *fence.NoTokenError {
		t.Helper()
		_, err := b.pool.Exec(ctx, sql)
		var ne *fence.NoTokenError
		require.ErrorAs(t, fence.Classify(err), &ne)
		return ne
	}

	ne := noToken(t, `UPDATE "App Data"."Ledger" SET id = 1 WHERE id = 1`)
	require.Equal(t, `"App Data"."Ledger"`, ne.Table)
	require.Equal(t, int64(7), ne.Current)
	require.Contains(t, ne.Error(), `write rejected on "App Data"."Ledger": it presented no fencing token`)
	ne = noToken(t, `DELETE FROM "App Data"."Ledger"`)
	require.Equal(t, `"App Data"."Ledger"`, ne.Table)

	ne = noToken(t, `UPDATE "App Data"."v1.ledger" SET id = 1 WHERE id = 1`)
	require.Empty(t, ne.Table, "control: App Data.v1.ledger is ambiguous")
	require.Equal(t, int64(7), ne.Current)
	require.Equal(t, "pgfence: write rejected: it presented no fencing token; call fence.Present (SQL: pgfence_present) in the transaction first", ne.Error())

	ne = noToken(t, `SELECT raise_pf004()`)
	require.Empty(t, ne.Table, "control: not the trigger's message")

	ne, ok := fence.Classify(&pgconn.PgError{Code: fence.SQLStateNoToken, SchemaName: "s", TableName: "t.u",
		Message: "pgfence: UPDATE on other.table presents no fencing token (strict mode; current 1)"}).(*fence.NoTokenError)
	require.True(t, ok)
	require.Equal(t, `"s"."t.u"`, ne.Table, "the error's table fields win over its message")
}
