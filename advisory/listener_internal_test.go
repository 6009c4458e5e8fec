package advisory

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence/internal/pgtest"
)

// TestUnlockSQLAnnouncesOnlyAReleasedKey runs the unlock statements on a
// connection that listens on NotifyChannel itself: an unlock that releases
// nothing, or that is told not to announce, must not notify.
func TestUnlockSQLAnnouncesOnlyAReleasedKey(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.NewDB(t)
	conn := db.Conn(t)
	_, err := conn.Exec(ctx, listenSQL)
	require.NoError(t, err)
	next := func() string {
		wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		n, err := conn.WaitForNotification(wctx)
		require.NoError(t, err)
		return n.Payload
	}
	marker := func() {
		_, err := conn.Exec(ctx, "NOTIFY "+NotifyChannel+", 'marker'")
		require.NoError(t, err)
	}

	for _, tc := range []struct {
		unlock, lock string
	}{
		{unlockSQL, "SELECT pg_advisory_lock($1)"},
		{unlockSharedSQL, "SELECT pg_advisory_lock_shared($1)"},
	} {
		const key = int64(-7)
		var released bool
		var pid int32
		// Enough runs for the server to switch to a generic plan.
		for i := range 8 {
			announce := i%2 == 0
			require.NoError(t, conn.QueryRow(ctx, tc.unlock, key, announce).Scan(&released, &pid))
			require.False(t, released, "not held")
			marker()
			require.Equal(t, "marker", next(), "nothing released, nothing announced")
		}

		_, err = conn.Exec(ctx, tc.lock, key)
		require.NoError(t, err)
		require.NoError(t, conn.QueryRow(ctx, tc.unlock, key, false).Scan(&released, &pid))
		require.True(t, released)
		marker()
		require.Equal(t, "marker", next(), "released but not to be announced")

		_, err = conn.Exec(ctx, tc.lock, key)
		require.NoError(t, err)
		require.NoError(t, conn.QueryRow(ctx, tc.unlock, key, true).Scan(&released, &pid))
		require.True(t, released)
		require.Equal(t, strconv.FormatInt(key, 10), next())
	}
}
