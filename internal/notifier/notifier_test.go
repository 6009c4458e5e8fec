package notifier_test

import (
	"context"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence/internal/notifier"
	"github.com/pgfence/pgfence/internal/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// hooks records what the notifier tells its owner.
type hooks struct {
	payloads  chan string
	listening chan struct{}
	ended     chan bool
	applied   atomic.Int64
	idle      atomic.Bool
}

func newHooks() *hooks {
	return &hooks{payloads: make(chan string, 16), listening: make(chan struct{}, 16), ended: make(chan bool, 16)}
}

func (h *hooks) config(t *testing.T, db *pgtest.DB, channel string) notifier.Config {
	cc, err := pgx.ParseConfig(db.URL)
	require.NoError(t, err)
	cc.RuntimeParams["application_name"] = "notifier-test-" + channel
	return notifier.Config{
		ConnConfig:    cc,
		Channel:       channel,
		CheckInterval: 200 * time.Millisecond,
		CheckTimeout:  time.Second,
		Logger:        slog.New(slog.DiscardHandler),
		LogPrefix:     "test",
		Notify:        func(p string) { h.payloads <- p },
		Listening:     func() { h.listening <- struct{}{} },
		Ended:         func(wasListening bool) { h.ended <- wasListening },
		Apply: func(ctx context.Context, conn *pgx.Conn) (time.Duration, error) {
			h.applied.Add(1)
			return 0, conn.Ping(ctx)
		},
		Idle:      func(bool) bool { return h.idle.Load() },
		IdleCheck: 50 * time.Millisecond,
	}
}

func within[T any](t *testing.T, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(30 * time.Second):
		t.Fatalf("never: %s", what)
		panic("unreachable")
	}
}

// The health check of a silently dead connection is tested through a
// freezing TCP proxy, with its negative control, in package leasetable
// (proxy_test.go), whose LISTEN connection is this notifier.

// TestDeliversReconnectsAndStops: notifications reach Notify; a killed
// connection is reported (Ended with wasListening) and replaced, after
// which the owner is told it is listening again (to wake every waiter);
// Kick runs Apply; Idle stops the loop.
func TestDeliversReconnectsAndStops(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDB(t)
	ctx := t.Context()
	h := newHooks()
	cfg := h.config(t, db, "chan_a")
	lost := make(chan error, 4)
	restored := make(chan time.Duration, 4)
	cfg.Lost = func(err error) { lost <- err }
	cfg.Restored = func(d time.Duration) { restored <- d }
	var wg sync.WaitGroup
	n := notifier.Start(ctx, cfg, &wg)

	within(t, h.listening, "listening")
	require.Positive(t, h.applied.Load(), "Apply runs on each new connection")
	_, err := db.Pool.Exec(ctx, "SELECT pg_notify('chan_a', 'hello')")
	require.NoError(t, err)
	require.Equal(t, "hello", within(t, h.payloads, "the notification"))

	before := h.applied.Load()
	n.Kick()
	require.Eventually(t, func() bool { return h.applied.Load() > before }, 30*time.Second, 5*time.Millisecond, "Kick runs Apply")

	var killed bool
	require.NoError(t, db.Pool.QueryRow(ctx,
		"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = 'notifier-test-chan_a'").Scan(&killed))
	require.True(t, killed)
	require.True(t, within(t, h.ended, "the end of the killed connection"), "it had been listening")
	require.Error(t, within(t, lost, "Lost"))
	require.Positive(t, within(t, restored, "Restored"))
	within(t, h.listening, "listening again")
	require.True(t, n.Listening())
	_, err = db.Pool.Exec(ctx, "SELECT pg_notify('chan_a', 'again')")
	require.NoError(t, err)
	require.Equal(t, "again", within(t, h.payloads, "a notification on the new connection"))

	h.idle.Store(true)
	within(t, n.Done(), "stop when idle")
	wg.Wait()
	require.False(t, n.Listening())
	require.Empty(t, lost, "stopping when idle is no loss")
}
