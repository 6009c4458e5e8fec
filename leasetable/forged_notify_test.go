package leasetable_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence/internal/notifier"
	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/leasetable"
)

// TestForgedNotificationsCostNothing: a role with no pgfence grant floods
// the release channel while a Locker waits for a held lease: with payloads
// naming the lease, junk, and replays of a real release's payload. The
// waiter sends no acquire statement for any of them, and the outsider,
// listening, never reads the lease's name. Negative control: the same
// number of payloads MAC'd with the install's key (what a role that can
// read the key could send), each with a newer token, each make the waiter
// try again.
func TestForgedNotificationsCostNothing(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	db := pgtest.NewDB(t)

	var rnd [6]byte
	_, _ = rand.Read(rnd[:])
	outsider := "pgfence_outsider_" + hex.EncodeToString(rnd[:])
	_, err := db.Pool.Exec(ctx, "CREATE ROLE "+pgx.Identifier{outsider}.Sanitize()+" LOGIN")
	require.NoError(t, err)
	t.Cleanup(func() {
		_, _ = db.Pool.Exec(context.Background(), "DROP ROLE "+pgx.Identifier{outsider}.Sanitize())
	})
	forger := db.NewPool(t, func(c *pgxpool.Config) { c.ConnConfig.User = outsider })

	holder := newLocker(t, db.Pool, &leasetable.Config{TTL: time.Minute})
	counter := &acquireCounter{}
	waiterPool := db.NewPool(t, func(c *pgxpool.Config) { c.ConnConfig.Tracer = counter })
	waiter := newLocker(t, waiterPool, &leasetable.Config{TTL: time.Minute})
	// The waiter tries again only when a notification wakes it: not when
	// its LISTEN connection subscribes, which would retry at a moment of
	// its own.
	leasetable.SetNoListenWake(waiter)

	// A real release's payload, seen by the outsider on the channel.
	spy, err := forger.Acquire(ctx)
	require.NoError(t, err)
	defer spy.Release()
	_, err = spy.Exec(ctx, "LISTEN "+leasetable.NotifyChannel)
	require.NoError(t, err)
	key, err := notifier.LoadKey(ctx, db.Pool, `"pgfence"`)
	require.NoError(t, err)
	interest, err := db.Pool.Acquire(ctx) // someone waits: the release notifies
	require.NoError(t, err)
	_, err = interest.Exec(ctx, "SELECT pg_advisory_lock_shared($1, $2)", leasetable.InterestClassID, key.InterestID("customer@example.com"))
	require.NoError(t, err)
	seen, err := holder.TryAcquire(ctx, "customer@example.com", nil)
	require.NoError(t, err)
	require.NoError(t, seen.Release(ctx))
	interest.Conn().Close(ctx) //nolint:errcheck // ends the session, and its lock
	interest.Release()
	n, err := spy.Conn().WaitForNotification(ctx)
	require.NoError(t, err)
	require.NotContains(t, n.Payload, "customer@example.com", "a role without pgfence's grant reads no lease name")
	replay := n.Payload

	l, err := holder.TryAcquire(ctx, "customer@example.com", nil)
	require.NoError(t, err)
	defer func() { _ = l.Release(ctx) }()
	wctx, wcancel := context.WithCancel(ctx)
	defer wcancel()
	go func() { _, _ = waiter.Acquire(wctx, "customer@example.com", nil) }()
	require.Eventually(t, func() bool { return waiter.Stats().Listening && counter.n.Load() > 0 }, 30*time.Second, 10*time.Millisecond)

	// send sends each payload in a transaction of its own, as separate
	// notifications (PostgreSQL folds equal payloads of one transaction).
	send := func(pool *pgxpool.Pool, payloads []string) {
		t.Helper()
		conn, err := pool.Acquire(ctx)
		require.NoError(t, err)
		defer conn.Release()
		for _, p := range payloads {
			_, err := conn.Exec(ctx, "SELECT pg_notify($1, $2)", leasetable.NotifyChannel, p)
			require.NoError(t, err)
		}
	}

	forged := make([]string, 0, 5000)
	for i := range 5000 {
		switch i % 4 {
		case 0:
			forged = append(forged, "customer@example.com")
		case 1:
			forged = append(forged, replay)
		case 2:
			forged = append(forged, fmt.Sprintf("%032x:%d:%032x", i, l.Token(), i))
		default:
			forged = append(forged, fmt.Sprintf("junk %d", i))
		}
	}
	before := counter.n.Load()
	send(forger, forged)
	// One valid payload after the flood: the waiter reads notifications in
	// order, so once it has acted on this one it has read the flood too.
	send(db.Pool, []string{key.Payload("customer@example.com", l.Token()+1)})
	require.Eventually(t, func() bool { return counter.n.Load() > before }, 30*time.Second, time.Millisecond)
	statements := counter.n.Load() - before
	t.Logf("5000 forged notifications, then one valid: %d acquire statements", statements)
	require.Equal(t, int64(1), statements, "forged, junk and replayed notifications cost no statement")

	// Negative control: valid payloads, as only a holder of the key can
	// write them, each with a newer token, each make the waiter try again.
	for i := range 10 {
		before = counter.n.Load()
		send(db.Pool, []string{key.Payload("customer@example.com", l.Token()+int64(i)+2)})
		require.Eventually(t, func() bool { return counter.n.Load() > before }, 30*time.Second, time.Millisecond,
			"negative control: a payload that verifies wakes the waiter")
	}
	wcancel()
}
