package cli

import (
	"encoding/json"
	"testing"
	"time"

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

// TestLsTimesNeverOverflow: an expiry centuries ahead (set by hand past
// pgfence's 7-day bound) is shown in seconds, not as a wrapped negative
// duration, and clamped to year 9999 for JSON, which cannot write later
// years. Control: converting the same seconds to a time.Duration, as ls
// once did, wraps negative, and encoding the year 10000 fails.
func TestLsTimesNeverOverflow(t *testing.T) {
	far := time.Date(2500, 1, 1, 0, 0, 0, 0, time.UTC).Sub(time.Now()) // saturates at the maximum Duration
	s := far.Seconds()
	require.Equal(t, "9223372037s", seconds(s))
	require.Negative(t, time.Duration(s*float64(time.Second)), "control: the old conversion overflows (amd64)")
	require.Equal(t, "1.5s", seconds(1.5))
	require.Equal(t, "3m12s", seconds(192))

	y10k := time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC)
	_, err := json.Marshal(y10k)
	require.Error(t, err, "control: JSON cannot write year 10000")
	b, err := json.Marshal(jsonTime(y10k))
	require.NoError(t, err)
	require.Equal(t, `"9999-12-31T23:59:59.999999999Z"`, string(b))
	now := time.Now().UTC()
	require.Equal(t, now, jsonTime(now))
}
