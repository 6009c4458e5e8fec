package fence

import (
	"slices"
	"strconv"
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

// FuzzBuilderFragments hands arbitrary Set, Where and Values fragments to
// the builders. Whenever SQL accepts them:
//
//   - the generated statement uses exactly the placeholders $1..$n of the
//     caller plus the token's $n+1 (and the lease name's $n+2 and secret's $n+3): a fragment
//     cannot smuggle in a placeholder of its own;
//   - the statement's structure outside the fragments is the one rendered
//     for harmless fragments (see sameShape): every fragment stays inside
//     the clause it was given for, so the guard predicate, the gates and
//     the setting of pgfence.token stay top-level conjuncts of the write's
//     WHERE, and no fragment hides the SQL after it (an unterminated quote,
//     comment or dollar quote) or escapes its parentheses.
func FuzzBuilderFragments(f *testing.F) {
	for _, s := range [][2]string{
		{"v = $1", "id = $2"}, {"v = 1 -- c", "id = $1"}, {"v = '$1'", "id = $1"},
		{"v = $$ x $$", "id = 1 /* c */"}, {"v = 'open", "id = $1"}, {"v = $a$", "true"},
		{`v = "$1"`, "id = $1 OR id = $2"}, {"v = E'\\''", "id = $1"}, {"v = 1", "id = 1 /* /* */"},
		{"v = $1 --", "true --"},
		// Attempts to escape the fragment's place.
		{"v = $1", "id = $2) OR (id = $2"}, {"v = $1", "true) OR (true"},
		{"v = 1 WHERE true OR true", "id = $1"}, {"v = 1, fence_token = 0", "id = $1"},
		{"v = $1", "id = $2 OR true"}, {"v = $1", "id = $2; DELETE FROM t"},
		{"v = $1", "id = 'a\\' ) OR (true OR '' = '"}, {"v = $1", "id = $$ ) OR ( $$"},
		{"v = $1", "id = $q$ ) $q$ AND $2 = 1"}, {"v = $1", "x = ARRAY[$2] OR (true"},
		{"v = $1", "x = \"a)\" OR $2"}, {"v = $1) OR (true", "id = $2"},
		{"v = $1", "1, 5 UNION SELECT 2, 3"}, {"v = $1", "$2) UNION (SELECT 1, 2"},
		{"v = $1", "id = $2 RETURNING *"}, {"v = CASE WHEN true THEN $1", "id = $2"},
	} {
		f.Add(s[0], s[1], uint8(2), "lease")
	}
	f.Fuzz(func(t *testing.T, set, where string, nargs uint8, lease string) {
		n := int(nargs % 4)
		stmts := map[string]renderable{
			"update":       Update("t").Set(set).Where(where),
			"update-lease": Update("t").Set(set).Where(where).UnderLease(lease, testSecret),
			"delete":       Delete("t").Where(where),
			"delete-lease": Delete("t").Where(where).UnderLease(lease, testSecret),
			"upsert":       Upsert("t").Columns("id", "v").Values("$1", where).Set(set).OnConflict("id"),
			"upsert-lease": Upsert("t").Columns("id", "v").Values("$1", where).Set(set).OnConflict("id").UnderLease(lease, testSecret),
		}
		for kind, st := range stmts {
			sql, err := st.SQL(n)
			if err != nil {
				continue
			}
			leased := strings.HasSuffix(kind, "-lease")
			extra := 1
			if leased {
				extra = 3 // the lease name and its secret
			}
			got, err := params(t, sql)
			require.NoError(t, err, "%s: generated SQL does not scan: %q", kind, sql)
			require.Equal(t, wantParams(n+extra), got, "%s: %q", kind, sql)
			sameShape(t, kind, sql, n, leased)

			// The statement Exec sends first: the same placeholders, and
			// the same top level outside the caller's SET list.
			fast, err := st.render(n, formFast)
			require.NoError(t, err, "%s: SQL accepts what the fast form refuses", kind)
			got, err = params(t, fast)
			require.NoError(t, err, "%s: generated SQL does not scan: %q", kind, fast)
			require.Equal(t, wantParams(n+extra), got, "%s: %q", kind, fast)
			ref := shapeRefs[kind]
			refFast, err := ref.stmt.render(ref.nargs, formFast)
			require.NoError(t, err)
			wp, ws := splitSet(shape(t, refFast, ref.nargs, leased).top)
			gp, gs := splitSet(shape(t, fast, n, leased).top)
			require.Equal(t, wp, gp, "%s: fast statement before SET in %q", kind, fast)
			require.Equal(t, ws, gs, "%s: fast statement's guard assignment and WHERE in %q", kind, fast)
		}
	})
}

// renderable is what every builder has: the full statement (SQL) and its
// forms.
type renderable interface {
	SQL(nargs int) (string, error)
	render(nargs int, f form) (string, error)
}

// shapeRefs are the statements rendered with harmless fragments, and their
// argument counts, that sameShape compares against.
var shapeRefs = map[string]struct {
	stmt  renderable
	nargs int
}{
	"update":       {Update("t").Set("v = 1").Where("true"), 0},
	"update-lease": {Update("t").Set("v = 1").Where("true").UnderLease("l", testSecret), 0},
	"delete":       {Delete("t").Where("true"), 0},
	"delete-lease": {Delete("t").Where("true").UnderLease("l", testSecret), 0},
	"upsert":       {Upsert("t").Columns("id", "v").Values("$1", "2").Set("v = 3").OnConflict("id"), 1},
	"upsert-lease": {Upsert("t").Columns("id", "v").Values("$1", "2").Set("v = 3").OnConflict("id").UnderLease("l", testSecret), 1},
}

// sameShape checks that sql, a statement of kind rendered for nargs
// arguments, has the structure of the one rendered for harmless fragments,
// compared token by token with every parenthesised or bracketed group
// collapsed, string constants and quoted identifiers as single tokens, and
// placeholders named by role ($tok, $lease, $secret, $arg):
//
//   - the statement's top level (the WITH list, the final SELECT);
//   - the top level of every CTE body and subquery there, except that in the
//     write's body the caller's SET list, which sits at its top level, is
//     skipped: what precedes its SET keyword and what follows the last
//     top-level comma before the last top-level WHERE (the guard column's
//     assignment, and the whole WHERE with the guard predicate, the gates
//     and the setting of pgfence.token) must match.
//
// Fragments other than Set are always inside parentheses there, so they
// collapse; a fragment that escaped them would change a top level.
func sameShape(t *testing.T, kind, sql string, nargs int, leased bool) {
	t.Helper()
	ref := shapeRefs[kind]
	refSQL, err := ref.stmt.SQL(ref.nargs)
	require.NoError(t, err)
	want := shape(t, refSQL, ref.nargs, leased)
	got := shape(t, sql, nargs, leased)
	require.Equal(t, want.top, got.top, "%s: top level of %q", kind, sql)
	require.Equal(t, len(want.groups), len(got.groups), "%s: %q", kind, sql)
	for i := range want.groups {
		w, g := want.groups[i], got.groups[i]
		if !slices.Contains(w, "pgfence_write_body") {
			require.Equal(t, w, g, "%s: group %d of %q", kind, i, sql)
			continue
		}
		wp, ws := splitSet(w)
		gp, gs := splitSet(g)
		require.Equal(t, wp, gp, "%s: write before SET in %q", kind, sql)
		require.Equal(t, ws, gs, "%s: write's guard assignment and WHERE in %q", kind, sql)
	}
}

// splitSet returns the part of a write body before and including its SET
// keyword, and the part from the last comma before the last WHERE. A body
// without SET (a DELETE) is all prefix.
func splitSet(body []string) (prefix, suffix []string) {
	set := slices.Index(body, "SET")
	if set < 0 {
		return body, nil
	}
	where := len(body) - 1
	for where > set && body[where] != "WHERE" {
		where--
	}
	comma := where
	for comma > set && body[comma] != "," {
		comma--
	}
	return body[:set+1], body[comma:]
}

// statementShape is a statement's top level and the top level of each
// group directly inside it.
type statementShape struct {
	top    []string
	groups [][]string
}

// shape lexes sql and returns its statementShape. A group that follows
// "pgfence_write AS" gets the marker token pgfence_write_body first.
func shape(t *testing.T, sql string, nargs int, leased bool) statementShape {
	t.Helper()
	toks := lexSQL(t, sql)
	name := func(tk string) string {
		if len(tk) > 1 && tk[0] == '$' && isDigit(tk[1]) {
			switch n, _ := strconv.Atoi(tk[1:]); {
			case n == nargs+1:
				return "$tok"
			case leased && n == nargs+2:
				return "$lease"
			case leased && n == nargs+3:
				return "$secret"
			default:
				return "$arg"
			}
		}
		if isIdentStart(tk[0]) {
			return strings.ToUpper(tk)
		}
		return tk
	}
	var s statementShape
	depth := 0
	var cur []string
	for i, tk := range toks {
		switch tk {
		case "(", "[":
			depth++
			if depth == 1 {
				s.top = append(s.top, tk)
				cur = []string{}
				if i >= 2 && toks[i-2] == "pgfence_write" && strings.EqualFold(toks[i-1], "AS") {
					cur = append(cur, "pgfence_write_body")
				}
				continue
			}
			if depth == 2 {
				cur = append(cur, tk)
			}
		case ")", "]":
			depth--
			require.GreaterOrEqual(t, depth, 0, "unbalanced %q", sql)
			if depth == 0 {
				s.top = append(s.top, tk)
				s.groups = append(s.groups, cur)
				continue
			}
			if depth == 1 {
				cur = append(cur, tk)
			}
		default:
			switch depth {
			case 0:
				s.top = append(s.top, name(tk))
			case 1:
				cur = append(cur, name(tk))
			}
		}
	}
	require.Zero(t, depth, "unbalanced %q", sql)
	return s
}

// lexSQL splits generated SQL into tokens: words (identifiers, keywords,
// numbers, placeholders), string constants, quoted identifiers and dollar
// quotes as single tokens, and single punctuation characters. It is written
// apart from scanParams, so the property does not trust the code under
// test; it fails on anything scanParams should have rejected in a fragment.
func lexSQL(t *testing.T, sql string) []string {
	t.Helper()
	var toks []string
	n := len(sql)
	for i := 0; i < n; {
		c := sql[i]
		start := i
		switch {
		case c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f':
			i++
			continue
		case c == '\'':
			esc := start > 0 && (sql[start-1] == 'e' || sql[start-1] == 'E') && (start < 2 || !isIdentChar(sql[start-2]))
			i++
			for {
				require.Less(t, i, n, "unterminated string in %q", sql)
				if esc && sql[i] == '\\' {
					i += 2
					continue
				}
				if sql[i] == '\'' {
					if i+1 < n && sql[i+1] == '\'' {
						i += 2
						continue
					}
					i++
					break
				}
				i++
			}
		case c == '"':
			i++
			for {
				require.Less(t, i, n, "unterminated identifier in %q", sql)
				if sql[i] == '"' {
					if i+1 < n && sql[i+1] == '"' {
						i += 2
						continue
					}
					i++
					break
				}
				i++
			}
		case c == '$' && i+1 < n && isDigit(sql[i+1]):
			i++
			for i < n && isDigit(sql[i]) {
				i++
			}
		case c == '$':
			j := i + 1
			for j < n && sql[j] != '$' && (isIdentStart(sql[j]) || (j > i+1 && isDigit(sql[j]))) {
				j++
			}
			if j >= n || sql[j] != '$' {
				i++ // a lone $
				break
			}
			tag := sql[i : j+1]
			end := strings.Index(sql[j+1:], tag)
			require.GreaterOrEqual(t, end, 0, "unterminated dollar quote in %q", sql)
			i = j + 1 + end + len(tag)
		case isIdentChar(c):
			for i < n && isIdentChar(sql[i]) {
				i++
			}
		default:
			require.False(t, c == '-' && i+1 < n && sql[i+1] == '-', "comment in %q", sql)
			require.False(t, c == '/' && i+1 < n && sql[i+1] == '*', "comment in %q", sql)
			require.NotEqual(t, byte(';'), c, "semicolon in %q", sql)
			i++
		}
		toks = append(toks, sql[start:i])
	}
	return toks
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
		stmts := map[string]renderable{
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
