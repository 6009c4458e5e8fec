package fence_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence/fence"
)

// sqlBuilder is what the golden tests need of a builder.
type sqlBuilder interface {
	SQL(nargs int) (string, error)
}

func TestSQLGolden(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		stmt  sqlBuilder
		nargs int
		want  string
	}{
		{
			name:  "update",
			stmt:  fence.Update("accounts").Set("balance = balance + $1").Where("id = $2"),
			nargs: 2,
			want: `WITH pgfence_locked AS (
    SELECT "fence_token" AS pgfence_token FROM "accounts"
    WHERE (id = $2)
    AND (SELECT pg_catalog.count(*) OPERATOR(pg_catalog.>) 1 FROM (SELECT FROM "accounts" WHERE (id = $2) LIMIT 2) AS pgfence_rows)
    FOR UPDATE
), pgfence_write AS (
    UPDATE "accounts" SET balance = balance + $1, "fence_token" = $3
    WHERE (id = $2)
    AND "fence_token" OPERATOR(pg_catalog.<=) $3
    AND NOT EXISTS (SELECT FROM pgfence_locked WHERE (pgfence_token OPERATOR(pg_catalog.<=) $3) IS NOT TRUE)
    AND pg_catalog.set_config('pgfence.token', $3::pg_catalog.int8::pg_catalog.text, true) IS NOT NULL
    RETURNING 1
)
SELECT (SELECT pg_catalog.count(*) FROM pgfence_write), pg_catalog.count(*), pg_catalog.max(pgfence_token),
    pg_catalog.count(*) FILTER (WHERE pgfence_token IS NULL), true
FROM (
    SELECT "fence_token" AS pgfence_token FROM "accounts"
    WHERE (id = $2)
    AND NOT EXISTS (SELECT FROM pgfence_write)
    FOR UPDATE
) AS pgfence_current`,
		},
		{
			name:  "update strict, custom column, schema-qualified",
			stmt:  fence.Update("billing.accounts").Set("note = 'pay $5'").Where("id = $1").Column("Token").Strict(),
			nargs: 1,
			want: `WITH pgfence_locked AS (
    SELECT "Token" AS pgfence_token FROM "billing"."accounts"
    WHERE (id = $1)
    AND (SELECT pg_catalog.count(*) OPERATOR(pg_catalog.>) 1 FROM (SELECT FROM "billing"."accounts" WHERE (id = $1) LIMIT 2) AS pgfence_rows)
    FOR UPDATE
), pgfence_write AS (
    UPDATE "billing"."accounts" SET note = 'pay $5', "Token" = $2
    WHERE (id = $1)
    AND "Token" OPERATOR(pg_catalog.<) $2
    AND NOT EXISTS (SELECT FROM pgfence_locked WHERE (pgfence_token OPERATOR(pg_catalog.<) $2) IS NOT TRUE)
    AND pg_catalog.set_config('pgfence.token', $2::pg_catalog.int8::pg_catalog.text, true) IS NOT NULL
    RETURNING 1
)
SELECT (SELECT pg_catalog.count(*) FROM pgfence_write), pg_catalog.count(*), pg_catalog.max(pgfence_token),
    pg_catalog.count(*) FILTER (WHERE pgfence_token IS NULL), true
FROM (
    SELECT "Token" AS pgfence_token FROM "billing"."accounts"
    WHERE (id = $1)
    AND NOT EXISTS (SELECT FROM pgfence_write)
    FOR UPDATE
) AS pgfence_current`,
		},
		{
			name:  "update under lease, identifier with a dot",
			stmt:  fence.UpdateIdent(pgx.Identifier{"odd.name"}).Set("v = 1").Where("true").UnderLease("jobs", testSecret),
			nargs: 0,
			want: `WITH pgfence_lease AS (
    SELECT WHERE "pgfence"."pgfence_lease_held"($2::pg_catalog.text, $1::pg_catalog.int8, $3::pg_catalog.text)
), pgfence_locked AS (
    SELECT "fence_token" AS pgfence_token FROM "odd.name"
    WHERE (true)
    AND (SELECT pg_catalog.count(*) OPERATOR(pg_catalog.>) 1 FROM (SELECT FROM "odd.name" WHERE (true) LIMIT 2) AS pgfence_rows)
    AND EXISTS (SELECT FROM pgfence_lease)
    FOR UPDATE
), pgfence_write AS (
    UPDATE "odd.name" SET v = 1, "fence_token" = $1
    WHERE (true)
    AND "fence_token" OPERATOR(pg_catalog.<=) $1
    AND EXISTS (SELECT FROM pgfence_lease)
    AND NOT EXISTS (SELECT FROM pgfence_locked WHERE (pgfence_token OPERATOR(pg_catalog.<=) $1) IS NOT TRUE)
    AND pg_catalog.set_config('pgfence.token', $1::pg_catalog.int8::pg_catalog.text, true) IS NOT NULL
    RETURNING 1
)
SELECT (SELECT pg_catalog.count(*) FROM pgfence_write), pg_catalog.count(*), pg_catalog.max(pgfence_token),
    pg_catalog.count(*) FILTER (WHERE pgfence_token IS NULL), EXISTS (SELECT FROM pgfence_lease)
FROM (
    SELECT "fence_token" AS pgfence_token FROM "odd.name"
    WHERE (true)
    AND NOT EXISTS (SELECT FROM pgfence_write)
    AND EXISTS (SELECT FROM pgfence_lease)
    FOR UPDATE
) AS pgfence_current`,
		},
		{
			name:  "delete",
			stmt:  fence.Delete("accounts").Where("id = $1"),
			nargs: 1,
			want: `WITH pgfence_locked AS (
    SELECT "fence_token" AS pgfence_token FROM "accounts"
    WHERE (id = $1)
    AND (SELECT pg_catalog.count(*) OPERATOR(pg_catalog.>) 1 FROM (SELECT FROM "accounts" WHERE (id = $1) LIMIT 2) AS pgfence_rows)
    FOR UPDATE
), pgfence_write AS (
    DELETE FROM "accounts"
    WHERE (id = $1)
    AND "fence_token" OPERATOR(pg_catalog.<=) $2
    AND NOT EXISTS (SELECT FROM pgfence_locked WHERE (pgfence_token OPERATOR(pg_catalog.<=) $2) IS NOT TRUE)
    AND pg_catalog.set_config('pgfence.token', $2::pg_catalog.int8::pg_catalog.text, true) IS NOT NULL
    RETURNING 1
)
SELECT (SELECT pg_catalog.count(*) FROM pgfence_write), pg_catalog.count(*), pg_catalog.max(pgfence_token),
    pg_catalog.count(*) FILTER (WHERE pgfence_token IS NULL), true
FROM (
    SELECT "fence_token" AS pgfence_token FROM "accounts"
    WHERE (id = $1)
    AND NOT EXISTS (SELECT FROM pgfence_write)
    FOR UPDATE
) AS pgfence_current`,
		},
		{
			name:  "upsert, default set",
			stmt:  fence.Upsert("accounts").Columns("id", "balance").Values("$1", "$2").OnConflict("id"),
			nargs: 2,
			want: `WITH pgfence_write AS (
    INSERT INTO "accounts" ("id", "balance", "fence_token")
    SELECT ($1), ($2), $3::pg_catalog.int8
    WHERE pg_catalog.set_config('pgfence.token', $3::pg_catalog.int8::pg_catalog.text, true) IS NOT NULL
    ON CONFLICT ("id") DO UPDATE SET "balance" = excluded."balance", "fence_token" = excluded."fence_token"
    WHERE "accounts"."fence_token" OPERATOR(pg_catalog.<=) excluded."fence_token"
    RETURNING 1
)
SELECT (SELECT pg_catalog.count(*) FROM pgfence_write), pg_catalog.count(*), pg_catalog.max(pgfence_token),
    pg_catalog.count(*) FILTER (WHERE pgfence_token IS NULL), true
FROM (
    SELECT "fence_token" AS pgfence_token FROM "accounts"
    WHERE "id" = ($1)
    AND NOT EXISTS (SELECT FROM pgfence_write)
    FOR UPDATE
) AS pgfence_current`,
		},
		{
			name: "upsert, schema, custom set, strict, lease in a schema that needs quoting",
			stmt: fence.Upsert("s.accounts").Columns("id", "balance").Values("$1", "$2").OnConflict("id").
				Set("balance = accounts.balance + excluded.balance").Strict().UnderLease("l", testSecret).LeaseSchema(`my "locks"`),
			nargs: 2,
			want: `WITH pgfence_lease AS (
    SELECT WHERE "my ""locks"""."pgfence_lease_held"($4::pg_catalog.text, $3::pg_catalog.int8, $5::pg_catalog.text)
), pgfence_write AS (
    INSERT INTO "s"."accounts" ("id", "balance", "fence_token")
    SELECT ($1), ($2), $3::pg_catalog.int8
    WHERE EXISTS (SELECT FROM pgfence_lease)
    AND pg_catalog.set_config('pgfence.token', $3::pg_catalog.int8::pg_catalog.text, true) IS NOT NULL
    ON CONFLICT ("id") DO UPDATE SET balance = accounts.balance + excluded.balance, "fence_token" = excluded."fence_token"
    WHERE "accounts"."fence_token" OPERATOR(pg_catalog.<) excluded."fence_token"
    RETURNING 1
)
SELECT (SELECT pg_catalog.count(*) FROM pgfence_write), pg_catalog.count(*), pg_catalog.max(pgfence_token),
    pg_catalog.count(*) FILTER (WHERE pgfence_token IS NULL), EXISTS (SELECT FROM pgfence_lease)
FROM (
    SELECT "fence_token" AS pgfence_token FROM "s"."accounts"
    WHERE "id" = ($1)
    AND NOT EXISTS (SELECT FROM pgfence_write)
    AND EXISTS (SELECT FROM pgfence_lease)
    FOR UPDATE
) AS pgfence_current`,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, err := tt.stmt.SQL(tt.nargs)
			require.NoError(t, err)
			require.Equal(t, tt.want, got)
		})
	}
}

// noDB fails the test if a statement reaches it: bad input must be
// reported before anything is sent.
type noDB struct{ t *testing.T }

func (d noDB) Exec(context.Context, string, ...any) (pgconn.CommandTag, error) {
	d.t.Error("Exec reached the database")
	return pgconn.CommandTag{}, nil
}

func (d noDB) Query(context.Context, string, ...any) (pgx.Rows, error) {
	d.t.Error("Query reached the database")
	return nil, nil
}

func (d noDB) QueryRow(context.Context, string, ...any) pgx.Row {
	d.t.Error("QueryRow reached the database")
	return nil
}

func TestBadInputIsRejectedBeforeSending(t *testing.T) {
	t.Parallel()
	ok := fence.Update("accounts").Set("balance = $1").Where("id = $2")
	long := "a123456789b123456789c123456789d123456789e123456789f123456789g1234"
	tests := []struct {
		name  string
		exec  func(db noDB) error
		token int64
		want  string
	}{
		{"empty table", func(db noDB) error {
			_, err := fence.Update("").Set("v = 1").Where("true").Exec(context.Background(), db, 1)
			return err
		}, 1, "empty table name"},
		{"empty schema", func(db noDB) error {
			_, err := fence.Update(".accounts").Set("v = 1").Where("true").Exec(context.Background(), db, 1)
			return err
		}, 1, "empty table name"},
		{"three parts", func(db noDB) error {
			_, err := fence.Delete("a.b.c").Where("true").Exec(context.Background(), db, 1)
			return err
		}, 1, "more than two"},
		{"quoted name", func(db noDB) error {
			_, err := fence.Delete(`"Accounts"`).Where("true").Exec(context.Background(), db, 1)
			return err
		}, 1, "double quote"},
		{"empty ident", func(db noDB) error {
			_, err := fence.UpdateIdent(nil).Set("v = 1").Where("true").Exec(context.Background(), db, 1)
			return err
		}, 1, "empty table name"},
		{"NUL in ident", func(db noDB) error {
			_, err := fence.UpdateIdent(pgx.Identifier{"a\x00b"}).Set("v = 1").Where("true").Exec(context.Background(), db, 1)
			return err
		}, 1, "NUL byte"},
		{"too long", func(db noDB) error {
			_, err := fence.Update(long).Set("v = 1").Where("true").Exec(context.Background(), db, 1)
			return err
		}, 1, "longer than 63 bytes"},
		{"empty column", func(db noDB) error {
			_, err := ok.Column("").Exec(context.Background(), db, 1, 1, 2)
			return err
		}, 1, "empty guard column name"},
		{"zero token", func(db noDB) error {
			_, err := ok.Exec(context.Background(), db, 0, 1, 2)
			return err
		}, 0, "token 0 is not positive"},
		{"negative token", func(db noDB) error {
			_, err := fence.Delete("accounts").Where("id = $1").Exec(context.Background(), db, -5, 1)
			return err
		}, -5, "token -5 is not positive"},
		{"too few args", func(db noDB) error {
			_, err := ok.Exec(context.Background(), db, 1, 1)
			return err
		}, 1, "placeholders up to $2 but 1 argument(s)"},
		{"too many args", func(db noDB) error {
			_, err := ok.Exec(context.Background(), db, 1, 1, 2, 3)
			return err
		}, 1, "placeholders up to $2 but 3 argument(s)"},
		{"gap", func(db noDB) error {
			_, err := fence.Update("accounts").Set("balance = $1").Where("id = $3").Exec(context.Background(), db, 1, 1, 2, 3)
			return err
		}, 1, "$2 is never used"},
		{"placeholder in a string does not count", func(db noDB) error {
			_, err := fence.Update("accounts").Set("note = '$2'").Where("id = $1").Exec(context.Background(), db, 1, 1, 2)
			return err
		}, 1, "placeholders up to $1 but 2 argument(s)"},
		{"unterminated string", func(db noDB) error {
			_, err := fence.Update("accounts").Set("note = 'x").Where("id = $1").Exec(context.Background(), db, 1, 1)
			return err
		}, 1, "unterminated string constant"},
		{"$0", func(db noDB) error {
			_, err := fence.Delete("accounts").Where("id = $0").Exec(context.Background(), db, 1)
			return err
		}, 1, "out of range"},
		{"no set", func(db noDB) error {
			_, err := fence.Update("accounts").Where("id = $1").Exec(context.Background(), db, 1, 1)
			return err
		}, 1, "no Set fragment"},
		{"no where", func(db noDB) error {
			_, err := fence.Update("accounts").Set("balance = $1").Exec(context.Background(), db, 1, 1)
			return err
		}, 1, "no Where fragment"},
		{"delete without where", func(db noDB) error {
			_, err := fence.Delete("accounts").Exec(context.Background(), db, 1)
			return err
		}, 1, "no Where fragment"},
		{"empty lease schema", func(db noDB) error {
			_, err := ok.UnderLease("l", testSecret).LeaseSchema("").Exec(context.Background(), db, 1, 1, 2)
			return err
		}, 1, "empty lease schema name"},
		{"lease schema too long", func(db noDB) error {
			_, err := fence.Delete("accounts").Where("id = $1").LeaseSchema(long).Exec(context.Background(), db, 1, 1)
			return err
		}, 1, "lease schema name"},
		{"lease schema with NUL", func(db noDB) error {
			_, err := fence.Upsert("accounts").Columns("id").Values("$1").OnConflict("id").LeaseSchema("a\x00").Exec(context.Background(), db, 1, 1)
			return err
		}, 1, "NUL byte"},
		{"empty lease", func(db noDB) error {
			_, err := ok.UnderLease("", testSecret).Exec(context.Background(), db, 1, 1, 2)
			return err
		}, 1, "empty lease name"},
		{"upsert without columns", func(db noDB) error {
			_, err := fence.Upsert("accounts").OnConflict("id").Exec(context.Background(), db, 1)
			return err
		}, 1, "no Columns"},
		{"upsert values mismatch", func(db noDB) error {
			_, err := fence.Upsert("accounts").Columns("id", "balance").Values("$1").OnConflict("id").Exec(context.Background(), db, 1, 1)
			return err
		}, 1, "2 Columns but 1 Values"},
		{"upsert without conflict", func(db noDB) error {
			_, err := fence.Upsert("accounts").Columns("id").Values("$1").Exec(context.Background(), db, 1, 1)
			return err
		}, 1, "no OnConflict"},
		{"upsert conflict not a column", func(db noDB) error {
			_, err := fence.Upsert("accounts").Columns("id").Values("$1").OnConflict("key").Exec(context.Background(), db, 1, 1)
			return err
		}, 1, `"key" is not one of Columns`},
		{"upsert sets guard column", func(db noDB) error {
			_, err := fence.Upsert("accounts").Columns("id", "fence_token").Values("$1", "$2").OnConflict("id").Exec(context.Background(), db, 1, 1, 2)
			return err
		}, 1, "guard column"},
		{"upsert duplicate column", func(db noDB) error {
			_, err := fence.Upsert("accounts").Columns("id", "id").Values("$1", "$1").OnConflict("id").Exec(context.Background(), db, 1, 1)
			return err
		}, 1, "listed twice"},
		{"nil db", func(noDB) error {
			_, err := ok.Exec(context.Background(), nil, 1, 1, 2)
			return err
		}, 1, "nil DB"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			err := tt.exec(noDB{t})
			require.Error(t, err)
			require.Contains(t, err.Error(), tt.want)
		})
	}
}

func TestPredicate(t *testing.T) {
	t.Parallel()
	require.Equal(t, `"fence_token" <= $3`, fence.Predicate("", 3, false))
	require.Equal(t, `"fence_token" < $3`, fence.Predicate("fence_token", 3, true))
	require.Equal(t, `"Odd""Col" <= $1`, fence.Predicate(`Odd"Col`, 1, false))
	require.Panics(t, func() { fence.Predicate("", 0, false) })
	require.Panics(t, func() { fence.Predicate("", 65536, false) })
}

// SQL is rendered once per statement and argument count; a derived
// statement renders its own, and the one it came from is unchanged.
func TestSQLIsCachedPerStatement(t *testing.T) {
	t.Parallel()
	base := fence.Update("accounts").Set("balance = balance + $1").Where("id = $2")
	first, err := base.SQL(2)
	require.NoError(t, err)

	type result struct {
		sql string
		err error
	}
	results := make(chan result, 8)
	for range cap(results) {
		go func() {
			sql, err := base.SQL(2)
			results <- result{sql, err}
		}()
	}
	for range cap(results) {
		r := <-results
		require.NoError(t, r.err)
		require.Equal(t, first, r.sql)
	}

	strict, err := base.Strict().SQL(2)
	require.NoError(t, err)
	require.Contains(t, strict, `"fence_token" OPERATOR(pg_catalog.<) $3`)
	leased, err := base.UnderLease("a", testSecret).SQL(2)
	require.NoError(t, err)
	require.Contains(t, leased, `"pgfence"."pgfence_lease_held"`)
	other, err := base.UnderLease("a", testSecret).LeaseSchema("locks").SQL(2)
	require.NoError(t, err)
	require.Contains(t, other, `"locks"."pgfence_lease_held"`)
	other, err = base.UnderLease("a", testSecret).UnderLease("b", testSecret).SQL(2)
	require.NoError(t, err)
	require.Equal(t, leased, other, "the lease name is a parameter, not part of the SQL")
	where, err := base.Where("id = $2 AND balance > 0").SQL(2)
	require.NoError(t, err)
	require.Contains(t, where, "balance > 0")
	_, err = base.SQL(3)
	require.Error(t, err)

	again, err := base.SQL(2)
	require.NoError(t, err)
	require.Equal(t, first, again)
}
