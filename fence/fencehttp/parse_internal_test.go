package fencehttp

import (
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence/fence"
)

// FuzzParse: whatever the two headers hold, parse either refuses with a
// 4xx and a message, or returns a positive token and a lease name of 1 to
// 512 bytes of UTF-8; and what SetHeaders would send for a valid name and
// token parses back to them.
func FuzzParse(f *testing.F) {
	for _, s := range [][2]string{{"5", "n"}, {"", ""}, {"0", "n"}, {"+5", "n"}, {"9223372036854775807", "a%2Fb"},
		{"9223372036854775808", "n"}, {"5", "%zz"}, {"5", "%ff"}, {" 5", "n"}, {"5", "caf%C3%A9"}} {
		f.Add(s[0], s[1])
	}
	f.Fuzz(func(t *testing.T, token, lease string) {
		r := httptest.NewRequest(http.MethodPost, "/", nil)
		r.Header[TokenHeader] = []string{token}
		r.Header[LeaseHeader] = []string{lease}
		name, tok, status, msg := parse(r)
		if status != 0 {
			require.True(t, status == http.StatusBadRequest || status == http.StatusPreconditionRequired, status)
			require.NotEmpty(t, msg)
		} else {
			require.Positive(t, tok)
			require.Equal(t, token, strconv.FormatInt(tok, 10), "only the canonical decimal form is accepted")
			require.NotEmpty(t, name)
			require.LessOrEqual(t, len(name), fence.MaxResourceName)
			require.True(t, utf8.ValidString(name))
		}

		if lease == "" || len(lease) > fence.MaxResourceName || !utf8.ValidString(lease) {
			return
		}
		for _, n := range []int64{1, 1 << 62} {
			r := httptest.NewRequest(http.MethodPost, "/", nil)
			r.Header.Set(TokenHeader, strconv.FormatInt(n, 10))
			r.Header.Set(LeaseHeader, url.PathEscape(lease))
			name, tok, status, msg := parse(r)
			require.Zero(t, status, msg)
			require.Equal(t, lease, name)
			require.Equal(t, n, tok)
		}
	})
}
