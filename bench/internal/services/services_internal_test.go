package services

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestWithUser(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		in, user, password, want string
	}{
		{"postgres://postgres@127.0.0.1:5432/db?sslmode=disable", "app", "", "postgres://app@127.0.0.1:5432/db?sslmode=disable"},
		{"postgres://owner:secret@127.0.0.1/db", "app", "", "postgres://app@127.0.0.1/db"},
		{"postgres://owner:secret@127.0.0.1/db", "app", "c0ffee", "postgres://app:c0ffee@127.0.0.1/db"},
		{"postgres://127.0.0.1/db", "pgfence_app", "", "postgres://pgfence_app@127.0.0.1/db"},
		{"host=127.0.0.1 dbname=db user=owner", "app", "pw", "host=127.0.0.1 dbname=db user=owner user='app' password='pw'"},
		{"host=127.0.0.1 dbname=db", `o'b\x`, "", `host=127.0.0.1 dbname=db user='o\'b\\x' password=''`},
	} {
		got, err := withUser(tc.in, tc.user, tc.password)
		require.NoError(t, err, tc.in)
		require.Equal(t, tc.want, got, tc.in)
	}
	_, err := withUser("postgres://[bad", "app", "")
	require.Error(t, err)
}
