package notifier_test

import (
	"context"
	"net"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence/internal/notifier"
	"github.com/pgfence/pgfence/internal/pgtest"
)

// TestSuspect: a LISTEN connection that went silently dead (a proxy that
// drops every byte) is replaced after Suspect, by the suspect check, not
// by the periodic one (an hour away); Lost reports it once and Restored
// once it listens again. The negative control is Suspect on a healthy
// connection: the check passes and nothing is lost.
func TestSuspect(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDB(t)
	ctx := t.Context()
	cc, err := pgx.ParseConfig(db.TCPURL)
	require.NoError(t, err)
	proxy, err := pgtest.NewProxy(net.JoinHostPort(cc.Host, strconv.Itoa(int(cc.Port))))
	require.NoError(t, err)
	t.Cleanup(func() { _ = proxy.Close() })
	cc.Host, cc.Port = "127.0.0.1", uint16(proxy.Port())

	h := newHooks()
	cfg := h.config(t, db, "chan_suspect")
	cfg.ConnConfig = cc
	cfg.CheckInterval = time.Hour
	cfg.Apply = nil
	cfg.Idle = nil
	lost := make(chan error, 4)
	restored := make(chan time.Duration, 4)
	cfg.Lost = func(err error) { lost <- err }
	cfg.Restored = func(d time.Duration) { restored <- d }
	var wg sync.WaitGroup
	nctx, cancel := context.WithCancel(ctx)
	n := notifier.Start(nctx, cfg, &wg)
	t.Cleanup(func() { cancel(); wg.Wait() })
	within(t, h.listening, "listening")
	require.True(t, n.Listening())

	// Negative control: a healthy connection passes the suspect check.
	n.Suspect()
	_, err = db.Pool.Exec(ctx, "SELECT pg_notify('chan_suspect', 'still')")
	require.NoError(t, err)
	require.Equal(t, "still", within(t, h.payloads, "a notification after the check"))
	require.Empty(t, lost, "nothing lost")

	proxy.Blackhole(true)
	// Suspect is ignored within a second of the last check; call it until
	// it takes.
	var cause error
	for cause == nil {
		n.Suspect()
		select {
		case cause = <-lost:
		case <-time.After(50 * time.Millisecond):
		}
	}
	require.ErrorContains(t, cause, "after an error of another statement")
	require.True(t, within(t, h.ended, "the end of the dead connection"), "it had been listening")
	proxy.Blackhole(false)
	within(t, restored, "restored")
	within(t, h.listening, "listening again")
	require.True(t, n.Listening())
	_, err = db.Pool.Exec(ctx, "SELECT pg_notify('chan_suspect', 'back')")
	require.NoError(t, err)
	require.Equal(t, "back", within(t, h.payloads, "a notification on the new connection"))
	require.Empty(t, lost, "one Lost per outage")
}
