package notifier_test

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence/internal/notifier"
	"github.com/pgfence/pgfence/internal/pgtest"
)

// countWarns is a slog handler counting Warn records that contain a text.
type countWarns struct {
	sub string
	n   atomic.Int64
}

func (c *countWarns) Enabled(context.Context, slog.Level) bool { return true }
func (c *countWarns) WithAttrs([]slog.Attr) slog.Handler       { return c }
func (c *countWarns) WithGroup(string) slog.Handler            { return c }
func (c *countWarns) Handle(_ context.Context, r slog.Record) error {
	if r.Level == slog.LevelWarn && strings.Contains(r.Message, c.sub) {
		c.n.Add(1)
	}
	return nil
}

// The probe: sent from another session, it arrives and the connection is
// used (the owner never sees the probe's payload); never arriving, the
// notifier logs one Warn and stops without reconnecting. The second case
// is the first's negative control: the same probe, not sent.
func TestProbe(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDB(t)
	ctx := t.Context()

	t.Run("arrives", func(t *testing.T) {
		h := newHooks()
		cfg := h.config(t, db, "chan_probe_ok")
		cfg.ProbeTimeout = 5 * time.Second
		cfg.Probe = func(ctx context.Context, payload string) error {
			require.True(t, strings.HasPrefix(payload, notifier.ProbePrefix))
			_, err := db.Pool.Exec(ctx, "SELECT pg_notify('chan_probe_ok', $1)", payload)
			return err
		}
		var wg sync.WaitGroup
		pctx, cancel := context.WithCancel(ctx)
		n := notifier.Start(pctx, cfg, &wg)
		within(t, h.listening, "listening after the probe")
		_, err := db.Pool.Exec(ctx, "SELECT pg_notify('chan_probe_ok', 'after')")
		require.NoError(t, err)
		require.Equal(t, "after", within(t, h.payloads, "the first notification is not the probe's"))
		cancel()
		within(t, n.Done(), "stop")
		wg.Wait()
	})

	t.Run("never arrives", func(t *testing.T) {
		h := newHooks()
		cfg := h.config(t, db, "chan_probe_deaf")
		warns := &countWarns{sub: "LISTEN does not receive notifications"}
		cfg.Logger = slog.New(warns)
		cfg.ProbeTimeout = 200 * time.Millisecond
		var probes atomic.Int64
		cfg.Probe = func(context.Context, string) error { probes.Add(1); return nil }
		var wg sync.WaitGroup
		n := notifier.Start(ctx, cfg, &wg)
		within(t, n.Done(), "the notifier stops")
		wg.Wait()
		require.Equal(t, int64(1), warns.n.Load(), "one Warn")
		require.Equal(t, int64(1), probes.Load(), "no reconnect")
		require.Empty(t, h.listening, "never reported listening")
	})
}
