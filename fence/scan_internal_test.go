package fence

import (
	"maps"
	"slices"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

func params(t *testing.T, frag string) ([]int, error) {
	t.Helper()
	used := map[int]struct{}{}
	_, err := scanParams(frag, used)
	return slices.Sorted(maps.Keys(used)), err
}

func TestScanParams(t *testing.T) {
	t.Parallel()
	tests := []struct {
		frag string
		want []int
		err  string
	}{
		{frag: "", want: []int{}},
		{frag: "id = $1", want: []int{1}},
		{frag: "a = $2 AND b = $10 OR c = $2", want: []int{2, 10}},
		{frag: "note = '$1'", want: []int{}},
		{frag: "note = 'it''s $1' || $2", want: []int{2}},
		{frag: `note = E'\' $1' || $2`, want: []int{2}},
		{frag: `note = e'\\' || $3`, want: []int{3}},
		// With standard_conforming_strings off, \' would not end the string.
		{frag: `note = 'a\' || $1`, err: "backslash before a quote"},
		{frag: `"col$1" = $2`, want: []int{2}},
		{frag: `"a""$1" = $2`, want: []int{2}},
		{frag: "x = '-- /* ; ( ]' AND \"a(--\" = $$ ) /* $$ AND y = $1", want: []int{1}},
		{frag: "x = 'a\\\\' || $1", want: []int{1}}, // an even run of backslashes is read alike either way
		{frag: `x = E'a\'b' || 'it''s' || $1`, want: []int{1}},
		{frag: "f((a[1]), ARRAY[$1, (2)])", want: []int{1}},
		{frag: "x = $$ $1 $$ || $2", want: []int{2}},
		{frag: "x = $tag$ $1 $$ $tag$ || $2", want: []int{2}},
		{frag: "a$1 = $2", want: []int{2}},
		{frag: "x = $1::int", want: []int{1}},
		{frag: "x = $", want: []int{}},
		{frag: "x = $ 1", want: []int{}},
		{frag: "x = 'open", err: "unterminated string"},
		{frag: `x = "open`, err: "unterminated quoted identifier"},
		{frag: "x = 1 -- $1\n AND y = $2", err: `comment "--" at byte 6`},
		{frag: "x = 1 --", err: "may not contain comments"},
		{frag: "x = /* $1 */ $2", err: `comment "/*" at byte 4`},
		{frag: "x = 1*/*/", err: "may not contain comments"},
		{frag: "x = 1; DROP TABLE t", err: "semicolon at byte 5"},
		{frag: "id = $2) OR (id = $2", err: `unbalanced ')' at byte 7: it closes no '('`},
		{frag: "(id = 1", err: `unbalanced '(' at byte 0: the fragment does not close it`},
		{frag: "a[1", err: `unbalanced '['`},
		{frag: "f(a]", err: `unbalanced ']'`},
		{frag: "x = 'a\\' ) OR (true OR '' = '", err: "backslash before a quote"},
		{frag: "x = 'a\\'''", err: "backslash before a quote"},
		{frag: "x = $a$ open", err: "unterminated dollar-quoted"},
		{frag: "x = $0", err: "out of range"},
		{frag: "x = $65536", err: "out of range"},
		{frag: "x = $99999999999999999999999", err: "out of range"},
		{frag: "x = $65535", want: []int{65535}},
	}
	for _, tt := range tests {
		got, err := params(t, tt.frag)
		if tt.err != "" {
			require.ErrorContains(t, err, tt.err, "%q", tt.frag)
			continue
		}
		require.NoError(t, err, "%q", tt.frag)
		if len(tt.want) == 0 {
			require.Empty(t, got, "%q", tt.frag)
			continue
		}
		require.Equal(t, tt.want, got, "%q", tt.frag)
	}
}

// FuzzScanParams checks that the scanner never panics, that what it
// reports is in range, and that text inside a string constant, a quoted
// identifier or a dollar quote never counts as a placeholder.
func FuzzScanParams(f *testing.F) {
	for _, s := range []string{
		"id = $1", "'$1'", `E'\'$1'`, `"$1"`, "-- $1\n$2", "/* $1 /* */ */ $2",
		"$$ $1 $$", "$q$ $1 $q$ $2", "a$1", "$", "$0", "'", `"`, "/*", "$a$",
		"a) OR (b", "(", "]", ";", `'\'`, `'a\\'`, "$$ ) $$", "f(a[1])",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		used := map[int]struct{}{}
		highest, err := scanParams(s, used)
		if err == nil {
			for p := range used {
				require.True(t, p >= 1 && p <= maxParams && p <= highest)
			}
			if len(used) > 0 {
				_, ok := used[highest]
				require.True(t, ok)
			}
			// An accepted fragment leaves nothing open: what follows it is
			// read on its own, so a placeholder after it counts.
			got, err := params(t, "("+s+") AND $1 IN ("+s+")")
			require.NoError(t, err)
			require.Contains(t, got, 1)
		}
		quoted := []string{
			`"` + strings.ReplaceAll(s, `"`, `""`) + `"`,
			"E'" + strings.NewReplacer(`\`, `\\`, "'", `\'`).Replace(s) + "'",
		}
		if !strings.Contains(s, `\`) {
			quoted = append(quoted, "'"+strings.ReplaceAll(s, "'", "''")+"'")
		}
		for _, quoted := range quoted {
			got, err := params(t, "x = "+quoted+" AND y = $1")
			require.NoError(t, err, "%q", quoted)
			require.Equal(t, []int{1}, got, "%q", quoted)
		}
		if !strings.Contains(s, "$z$") {
			got, err := params(t, "x = $z$"+s+"$z$ AND y = $1")
			require.NoError(t, err)
			require.Equal(t, []int{1}, got)
		}
	})
}

// FuzzParseTable checks that a table name is either rejected or split into
// non-empty parts that join back to it and sanitise to quoted identifiers.
func FuzzParseTable(f *testing.F) {
	for _, s := range []string{"accounts", "billing.accounts", "a.b.c", ".a", "a.", `"A"`, "a\x00b", "Ünïcode.tåble"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		id, err := parseTable(s)
		if err != nil {
			return
		}
		require.Equal(t, s, strings.Join(id, "."))
		require.True(t, len(id) == 1 || len(id) == 2)
		for _, p := range id {
			require.NotEmpty(t, p)
			require.NotContains(t, p, `"`)
		}
		require.Equal(t, `"`+strings.Join(id, `"."`)+`"`, pgx.Identifier(id).Sanitize())
	})
}
