package cli

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestDisplayEscapesWhatATerminalWouldInterpret(t *testing.T) {
	t.Parallel()
	tests := []struct{ in, want string }{
		{"account:42", "account:42"},
		{"café ✓ 日本", "café ✓ 日本"},
		{"with space", "with space"},
		{`back\slash`, `back\slash`},
		{"a\nb", `"a\nb"`},
		{"\x1b[31mred", `"\x1b[31mred"`},
		{"tab\there", `"tab\there"`},
		{"bell\a", `"bell\a"`},
		{"nul\x00", `"nul\x00"`},
		{"del\x7f", `"del\x7f"`},
		{"c1\u0085next", `"c1\u0085next"`},
		{"csi\u009b31m", `"csi\u009b31m"`},
		{"bidi\u202eevil", `"bidi\u202eevil"`},
		{"bad\xffutf8", `"bad\xffutf8"`},
		{`"quoted"`, `"\"quoted\""`},
	}
	for _, tt := range tests {
		require.Equal(t, tt.want, display(tt.in), "%q", tt.in)
	}
}
