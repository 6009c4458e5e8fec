package advisory_test

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence/advisory"
	"github.com/pgfence/pgfence/internal/pgtest"
)

// keySeeds are the seed corpus of FuzzNameKey, also checked against
// NameKeySQL by TestNameKeySeedsMatchSQL.
var keySeeds = []string{
	"a", "account:42", "Straße", "日本語のロック", "emoji 🔒", "", " ", "\t\n", "'; SELECT 1; --",
	strings.Repeat("long ", 200), "\xff", "a\x00b", "migrate",
}

// referenceKey is Name's documented definition, written independently:
// the first 8 bytes of SHA-256, big-endian, signed, with bit 62 set when the
// upper 32 bits are zero.
func referenceKey(name string) int64 {
	sum := sha256.Sum256([]byte(name))
	k := int64(binary.BigEndian.Uint64(sum[:8]))
	if uint64(k)>>32 == 0 {
		k |= 1 << 62
	}
	return k
}

// FuzzNameKey checks that Name is stable, matches its documented
// definition, never falls in golang-migrate's range [0, 2^32), and that its
// String shows the number; and that ID keys are used as given.
func FuzzNameKey(f *testing.F) {
	for _, s := range keySeeds {
		f.Add(s, int64(len(s)))
	}
	f.Fuzz(func(t *testing.T, name string, id int64) {
		k := advisory.Name(name)
		require.Equal(t, k, advisory.Name(name))
		require.Equal(t, referenceKey(name), k.Int64())
		require.False(t, k.Int64() >= 0 && k.Int64() < 1<<32, "%q maps into [0, 2^32)", name)
		require.Contains(t, k.String(), strconv.FormatInt(k.Int64(), 10))
		require.Equal(t, id, advisory.ID(id).Int64())
		require.Equal(t, strconv.FormatInt(id, 10), advisory.ID(id).String())
	})
}

// TestNameKeySeedsMatchSQL checks the fuzz seeds that PostgreSQL text can
// hold (valid UTF-8 without NUL) against NameKeySQL.
func TestNameKeySeedsMatchSQL(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.NewDB(t)
	for _, name := range keySeeds {
		if !utf8.ValidString(name) || strings.ContainsRune(name, 0) {
			continue
		}
		var fromSQL int64
		require.NoError(t, db.Pool.QueryRow(ctx, advisory.NameKeySQL, name).Scan(&fromSQL), "%q", name)
		require.Equal(t, advisory.Name(name).Int64(), fromSQL, "%q", name)
	}
}
