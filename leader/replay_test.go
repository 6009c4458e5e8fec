package leader_test

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence/internal/notifier"
	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/leader"
)

// readCounter counts the observers' reads of the election.
type readCounter struct{ n atomic.Int64 }

func (c *readCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	if strings.Contains(d.SQL, "pgfence_leaders") {
		c.n.Add(1)
	}
	return ctx
}

func (c *readCounter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// TestReplayedNotificationsCostNoRead: replays of an older term's
// notification (valid, so only their token tells them apart) make an
// observer read nothing; a notification of the current term makes it read
// (the control).
func TestReplayedNotificationsCostNoRead(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	db := pgtest.NewDB(t)
	counter := &readCounter{}
	observed := db.NewPool(t, func(c *pgxpool.Config) { c.ConnConfig.Tracer = counter })
	o := newCandidate(t, observed, "replay", "observer", nil, func(c *leader.Config) { c.ObserveInterval = time.Hour })
	a := newCandidate(t, db.Pool, "replay", "addr-a", nil, nil)
	term, err := a.e.Campaign(ctx)
	require.NoError(t, err)
	key, err := notifier.LoadKey(ctx, db.Pool, `"pgfence"`)
	require.NoError(t, err)

	ch := o.e.Observe(ctx)
	require.Equal(t, term.Token(), (<-ch).Token)
	// Let the observer learn of the current term through a notification,
	// sent once it listens (one sent before is never delivered, and the
	// replays below would then each wake it).
	require.Eventually(t, func() bool { return leader.Listening(o.e) }, 30*time.Second, time.Millisecond)
	before := counter.n.Load()
	_, err = db.Pool.Exec(ctx, "SELECT pg_notify($1, $2)", leader.NotifyChannel, key.Payload("replay", term.Token()))
	require.NoError(t, err)
	require.Eventually(t, func() bool { return counter.n.Load() > before }, 30*time.Second, time.Millisecond)

	conn, err := db.Pool.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	before = counter.n.Load()
	for i := range 500 {
		_, err = conn.Exec(ctx, "SELECT pg_notify($1, $2)", leader.NotifyChannel, key.Payload("replay", term.Token()-1-int64(i%3)))
		require.NoError(t, err)
		// And forgeries: what a role without the key can send (junk, and a
		// newer token under a made-up MAC) is dropped by the MAC check.
		forged := []string{"replay", fmt.Sprintf("x:%d:00", term.Token()+1), fmt.Sprintf("%s0", key.Payload("replay", term.Token()+1))}
		_, err = conn.Exec(ctx, "SELECT pg_notify($1, $2)", leader.NotifyChannel, forged[i%3])
		require.NoError(t, err)
	}
	// Then one of the current term: once read for it, the replays before
	// it were read too (notifications arrive in order).
	_, err = conn.Exec(ctx, "SELECT pg_notify($1, $2)", leader.NotifyChannel, key.Payload("replay", term.Token()))
	require.NoError(t, err)
	require.Eventually(t, func() bool { return counter.n.Load() > before }, 30*time.Second, time.Millisecond,
		"control: a notification of the current term makes the observer read")
	reads := counter.n.Load() - before
	t.Logf("500 replays of older terms and 500 forgeries, then one current: %d reads", reads)
	require.LessOrEqual(t, reads, int64(2), "replays of older terms and forgeries cost no read")
	require.NoError(t, term.Resign(ctx))
}
