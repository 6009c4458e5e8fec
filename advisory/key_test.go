package advisory_test

import (
	"context"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence/advisory"
	"github.com/pgfence/pgfence/internal/pgtest"
)

func TestNameMatchesSQL(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.NewDB(t)
	names := []string{
		"a", "account:42", "migrate", "Straße", "日本語のロック", "emoji 🔒 lock",
		"with\ttab and \"quotes\" and 'apostrophes'", strings.Repeat("long name ", 60),
	}
	for _, name := range names {
		var fromSQL int64
		require.NoError(t, db.Pool.QueryRow(ctx, advisory.NameKeySQL, name).Scan(&fromSQL), name)
		require.Equal(t, advisory.Name(name).Int64(), fromSQL, "name %q", name)
		require.False(t, fromSQL >= 0 && fromSQL < 1<<32, "name %q maps into golang-migrate's key range", name)
	}
}

func TestKeys(t *testing.T) {
	t.Parallel()
	// The hash is part of the on-disk contract with other clients: it must
	// never change. (Checked independently: Python
	// struct.unpack(">q", hashlib.sha256(b"account:42").digest()[:8]).)
	require.Equal(t, int64(4097093253131737194), advisory.Name("account:42").Int64())
	require.Equal(t, advisory.Name("account:42"), advisory.Name("account:42"))
	require.NotEqual(t, advisory.Name("account:42").Int64(), advisory.Name("account:43").Int64())
	require.Equal(t, int64(-7), advisory.ID(-7).Int64())
	require.Equal(t, "-7", advisory.ID(-7).String())
	require.Equal(t, `"account:42" (4097093253131737194)`, advisory.Name("account:42").String())
	require.Equal(t, advisory.ID(0), advisory.Key{})
}
