package notifier_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence/internal/notifier"
	"github.com/pgfence/pgfence/internal/pgtest"
)

// TestPayloadMatchesDatabase checks that the Go side computes and verifies
// exactly the payloads pgfence_notify_payload writes, and refuses a payload
// with any part changed or written under another key.
func TestPayloadMatchesDatabase(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.NewDB(t)
	key, err := notifier.LoadKey(ctx, db.Pool, `"pgfence"`)
	require.NoError(t, err)
	require.Len(t, key, 32)
	for _, c := range []struct {
		name  string
		token int64
	}{{"q", 1}, {"account:42", 1 << 40}, {"ünïcode ✓", 9223372036854775807}} {
		var payload string
		require.NoError(t, db.Pool.QueryRow(ctx, "SELECT pgfence.pgfence_notify_payload($1, $2)", c.name, c.token).Scan(&payload))
		require.Equal(t, key.Payload(c.name, c.token), payload)
		tag, token, ok := key.Verify(payload)
		require.True(t, ok)
		require.Equal(t, key.Tag(c.name), tag)
		require.Equal(t, c.token, token)
		require.NotContains(t, payload, c.name)

		// Controls: a changed token, tag or MAC, another key.
		for _, bad := range []string{
			key.Tag(c.name) + ":" + "7" + payload[len(key.Tag(c.name))+1:],
			key.Tag(c.name+"x") + payload[32:],
			payload[:len(payload)-1] + "0",
			c.name,
			"",
		} {
			if bad == payload {
				continue
			}
			_, _, ok := key.Verify(bad)
			require.False(t, ok, bad)
		}
		other := append(notifier.Key{}, key...)
		other[0] ^= 1
		_, _, ok = other.Verify(payload)
		require.False(t, ok)
	}
}

// TestInterestIDIsTheTagsFirstBytes: a name's interest key is the first 4
// bytes of its tag as a big-endian int32, as pgfence_notify_waiters reads
// them; names differ, keys too (for these).
func TestInterestIDIsTheTagsFirstBytes(t *testing.T) {
	t.Parallel()
	key := notifier.Key(make([]byte, 32))
	seen := map[int32]string{}
	for _, name := range []string{"a", "b", "account:42", "\u00e9t\u00e9"} {
		id := key.InterestID(name)
		var want uint32
		_, err := fmt.Sscanf(key.Tag(name)[:8], "%08x", &want)
		require.NoError(t, err)
		require.Equal(t, int32(want), id, name)
		require.NotContains(t, seen, id)
		seen[id] = name
	}
}
