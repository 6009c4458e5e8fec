package fence

import (
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

// wantParams is 1..n.
func wantParams(n int) []int {
	out := []int{}
	for i := 1; i <= n; i++ {
		out = append(out, i)
	}
	return out
}

// FuzzBuilderFragments hands arbitrary Set and Where fragments to the
// builders. Whenever SQL accepts them, the generated statement must use
// exactly the placeholders $1..$n of the caller plus the token's $n+1 (and
// the lease name's $n+2): a fragment can never hide the generated SQL that
// follows it (an unterminated quote, comment or dollar quote) or smuggle in
// a placeholder of its own.
func FuzzBuilderFragments(f *testing.F) {
	for _, s := range [][2]string{
		{"v = $1", "id = $2"}, {"v = 1 -- c", "id = $1"}, {"v = '$1'", "id = $1"},
		{"v = $$ x $$", "id = 1 /* c */"}, {"v = 'open", "id = $1"}, {"v = $a$", "true"},
		{`v = "$1"`, "id = $1 OR id = $2"}, {"v = E'\\''", "id = $1"}, {"v = 1", "id = 1 /* /* */"},
		{"v = $1 --", "true --"},
	} {
		f.Add(s[0], s[1], uint8(2), "lease")
	}
	f.Fuzz(func(t *testing.T, set, where string, nargs uint8, lease string) {
		n := int(nargs % 4)
		stmts := map[string]interface{ SQL(int) (string, error) }{
			"update":       Update("t").Set(set).Where(where),
			"update-lease": Update("t").Set(set).Where(where).UnderLease(lease),
			"delete":       Delete("t").Where(where),
			"upsert":       Upsert("t").Columns("id", "v").Values("$1", where).Set(set).OnConflict("id"),
		}
		for kind, st := range stmts {
			sql, err := st.SQL(n)
			if err != nil {
				continue
			}
			extra := 1
			if kind == "update-lease" && lease != "" && len(lease) <= 512 {
				extra = 2
			}
			got, err := params(t, sql)
			require.NoError(t, err, "%s: generated SQL does not scan: %q", kind, sql)
			require.Equal(t, wantParams(n+extra), got, "%s: %q", kind, sql)
		}
	})
}

// FuzzBuilderIdentifiers hands arbitrary table and column names to the
// *Ident constructors and Column. Whenever SQL accepts them, each appears
// only quoted by pgx.Identifier.Sanitize, and the statement's placeholders
// are exactly the caller's and the token's: a name cannot inject SQL.
func FuzzBuilderIdentifiers(f *testing.F) {
	for _, s := range [][3]string{
		{"accounts", "public", "fence_token"}, {`a"b`, "", `c"; DROP TABLE x; --`}, {"t$1", "s", "c/*"},
		{"", "", ""}, {"a.b", "x", "$2"}, {"ünï", "çødé", "'"},
	} {
		f.Add(s[0], s[1], s[2])
	}
	f.Fuzz(func(t *testing.T, table, schema, column string) {
		id := pgx.Identifier{table}
		if schema != "" {
			id = pgx.Identifier{schema, table}
		}
		stmts := map[string]interface{ SQL(int) (string, error) }{
			"update": UpdateIdent(id).Column(column).Set("v = $1").Where("id = $2"),
			"delete": DeleteIdent(id).Column(column).Where("id = $1 AND $2 = 2"),
			"upsert": UpsertIdent(id).Column(column).Columns("id", "v").Values("$1", "$2").OnConflict("id"),
		}
		for kind, st := range stmts {
			sql, err := st.SQL(2)
			if err != nil {
				continue
			}
			got, err := params(t, sql)
			require.NoError(t, err, "%s: generated SQL does not scan: %q", kind, sql)
			require.Equal(t, wantParams(3), got, "%s: %q", kind, sql)
			require.Contains(t, sql, id.Sanitize(), kind)
			require.Contains(t, sql, pgx.Identifier{column}.Sanitize(), kind)
			// Outside quoted identifiers, nothing of the names remains.
			require.NotContains(t, stripQuotedIdents(sql), "DROP TABLE", kind)
		}
	})
}

// stripQuotedIdents removes every "..." quoted identifier from sql.
func stripQuotedIdents(sql string) string {
	var b strings.Builder
	in := false
	for i := 0; i < len(sql); i++ {
		c := sql[i]
		if c == '"' {
			if in && i+1 < len(sql) && sql[i+1] == '"' {
				i++
				continue
			}
			in = !in
			continue
		}
		if !in {
			b.WriteByte(c)
		}
	}
	return b.String()
}
