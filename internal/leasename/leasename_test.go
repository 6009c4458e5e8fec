package leasename_test

import (
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence/internal/leasename"
)

func TestCheck(t *testing.T) {
	t.Parallel()
	const limit = 8
	tests := []struct {
		name string
		v    string
		want *leasename.Problem // nil: valid
	}{
		{"plain", "job", nil},
		{"exactly the limit", strings.Repeat("x", limit), nil},
		{"one byte over", strings.Repeat("x", limit+1), &leasename.Problem{Kind: leasename.TooLong, Len: limit + 1, Max: limit}},
		{"multi-byte runes filling the limit", strings.Repeat("é", limit/2), nil},
		{"multi-byte rune crossing the limit", strings.Repeat("x", limit-1) + "é", &leasename.Problem{Kind: leasename.TooLong, Len: limit + 1, Max: limit}},
		{"four-byte rune at the limit", "1234🔒", nil},
		{"space only", " ", nil},
		{"empty", "", &leasename.Problem{Kind: leasename.Empty, Max: limit}},
		{"too long wins over invalid UTF-8", strings.Repeat("\xff", limit+1), &leasename.Problem{Kind: leasename.TooLong, Len: limit + 1, Max: limit}},
		{"invalid byte", "a\xffb", &leasename.Problem{Kind: leasename.NotUTF8, Len: 3, Max: limit}},
		{"truncated rune", "bad \xc3", &leasename.Problem{Kind: leasename.NotUTF8, Len: 5, Max: limit}},
		{"lone C1 byte 0x85", "a\x85", &leasename.Problem{Kind: leasename.NotUTF8, Len: 2, Max: limit}},
		{"invalid UTF-8 wins over NUL", "\x00\xff", &leasename.Problem{Kind: leasename.NotUTF8, Len: 2, Max: limit}},
		{"NUL", "a\x00b", &leasename.Problem{Kind: leasename.NUL, Len: 3, Max: limit, Index: 1, Char: 0}},
		{"NUL wins over an earlier control", "\x01a\x00", &leasename.Problem{Kind: leasename.NUL, Len: 3, Max: limit, Index: 2, Char: 0}},
		{"unit separator 0x1f", "ab\x1f", &leasename.Problem{Kind: leasename.Control, Len: 3, Max: limit, Index: 2, Char: 0x1f}},
		{"newline", "a\nb", &leasename.Problem{Kind: leasename.Control, Len: 3, Max: limit, Index: 1, Char: '\n'}},
		{"escape", "\x1b[31m", &leasename.Problem{Kind: leasename.Control, Len: 5, Max: limit, Index: 0, Char: 0x1b}},
		{"DEL 0x7f", "del\x7f", &leasename.Problem{Kind: leasename.Control, Len: 4, Max: limit, Index: 3, Char: 0x7f}},
		{"first control's offset after a multi-byte rune", "é\x02\x03", &leasename.Problem{Kind: leasename.Control, Len: 4, Max: limit, Index: 2, Char: 0x02}},
		{"0x20 is not a control", "a b", nil},
		{"0x7e is not a control", "a~", nil},
		{"C1 U+0080 is allowed", "a\u0080", nil},
		{"C1 U+0085 is allowed", "a\u0085", nil},
		{"C1 U+009F is allowed", "a\u009f", nil},
		{"U+00A0 is allowed", "a\u00a0", nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			require.Equal(t, tt.want, leasename.Check(tt.v, limit), "%q", tt.v)
		})
	}
}

// FuzzCheck checks that Check accepts exactly the non-empty valid UTF-8
// strings of at most the limit without C0 controls or DEL, and that a
// problem's fields describe the string.
func FuzzCheck(f *testing.F) {
	for _, s := range []string{"job", "", "a\x00b", "\xff", "a\x1f", "del\x7f", "\u0085", "\x85", "ééé", strings.Repeat("x", 17)} {
		f.Add(s)
	}
	const limit = 16
	f.Fuzz(func(t *testing.T, v string) {
		p := leasename.Check(v, limit)
		valid := v != "" && len(v) <= limit && utf8.ValidString(v) &&
			!strings.ContainsFunc(v, func(r rune) bool { return r < 0x20 || r == 0x7f })
		if valid {
			require.Nil(t, p, "%q", v)
			return
		}
		require.NotNil(t, p, "%q", v)
		require.Equal(t, len(v), p.Len)
		require.Equal(t, limit, p.Max)
		switch p.Kind {
		case leasename.Empty:
			require.Empty(t, v)
		case leasename.TooLong:
			require.Greater(t, len(v), limit)
		case leasename.NotUTF8:
			require.False(t, utf8.ValidString(v))
		case leasename.NUL, leasename.Control:
			require.Equal(t, rune(v[p.Index]), p.Char)
			require.True(t, p.Char < 0x20 || p.Char == 0x7f, "%U", p.Char)
			require.Equal(t, p.Kind == leasename.NUL, p.Char == 0)
		default:
			t.Fatalf("%q: unknown kind %d", v, p.Kind)
		}
	})
}
