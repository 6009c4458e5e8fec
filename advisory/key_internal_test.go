package advisory

import (
	"context"
	"math"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence/internal/pgtest"
)

// TestRemapNameKey checks the remapping out of [0, 2^32) in Go and in
// NameKeySQL on hash values that no practical name produces (1 in 2^32).
func TestRemapNameKey(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDB(t)
	head, _, ok := strings.Cut(NameKeySQL, "FROM (")
	require.True(t, ok)
	remapSQL := head + "FROM (SELECT $1::bigint AS h) AS s"
	for _, tc := range []struct{ h, want int64 }{
		{0, 1 << 62},
		{1, 1<<62 | 1},
		{1<<32 - 1, 1<<62 | (1<<32 - 1)},
		{1 << 32, 1 << 32},
		{-1, -1},
		{math.MinInt64, math.MinInt64},
		{math.MaxInt64, math.MaxInt64},
	} {
		require.Equal(t, tc.want, remapNameKey(tc.h), "Go, h=%d", tc.h)
		var got int64
		require.NoError(t, db.Pool.QueryRow(context.Background(), remapSQL, tc.h).Scan(&got))
		require.Equal(t, tc.want, got, "SQL, h=%d", tc.h)
	}
}
