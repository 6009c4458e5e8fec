package advisory_test

import (
	"context"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence/advisory"
	"github.com/pgfence/pgfence/internal/pgtest"
)

// recordHandler keeps the records logged through it.
type recordHandler struct {
	mu      sync.Mutex
	records []slog.Record
	reqs    []string                 // the request id of each record's ctx
	waiters map[string]chan struct{} // closed once their message is logged
}

// logged returns a channel closed once a record with message msg is logged.
func (h *recordHandler) logged(msg string) <-chan struct{} {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.waiters == nil {
		h.waiters = map[string]chan struct{}{}
	}
	ch := h.waiters[msg]
	if ch == nil {
		ch = make(chan struct{})
		h.waiters[msg] = ch
		for _, r := range h.records {
			if r.Message == msg {
				close(ch)
				break
			}
		}
	}
	return ch
}

func (h *recordHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h *recordHandler) Handle(ctx context.Context, r slog.Record) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.records = append(h.records, r.Clone())
	h.reqs = append(h.reqs, reqOf(ctx))
	if ch := h.waiters[r.Message]; ch != nil {
		select {
		case <-ch:
		default:
			close(ch)
		}
	}
	return nil
}
func (h *recordHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *recordHandler) WithGroup(string) slog.Handler      { return h }

// ctxReq returns the request id of the ctx of the first record with
// message msg.
func (h *recordHandler) ctxReq(msg string) string {
	h.mu.Lock()
	defer h.mu.Unlock()
	for i, r := range h.records {
		if r.Message == msg {
			return h.reqs[i]
		}
	}
	return ""
}

// count returns the number of records with message msg.
func (h *recordHandler) count(msg string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := 0
	for _, r := range h.records {
		if r.Message == msg {
			n++
		}
	}
	return n
}

// find returns the attributes of the first record with message msg.
func (h *recordHandler) find(msg string) map[string]string {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, r := range h.records {
		if r.Message == msg {
			attrs := map[string]string{}
			r.Attrs(func(a slog.Attr) bool {
				attrs[a.Key] = a.Value.String()
				return true
			})
			return attrs
		}
	}
	return nil
}

func TestSessionSettingsAndLogger(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.NewDB(t)
	h := &recordHandler{}
	// Over TCP: the server's TCP settings read 0 on a Unix-domain socket.
	l := newLocker(t, db.NewTCPPool(t, nil), &advisory.Config{
		TCPKeepalivesIdle:     7 * time.Second,
		TCPKeepalivesInterval: 3 * time.Second,
		TCPKeepalivesCount:    4,
		TCPUserTimeout:        12500 * time.Millisecond,
		Logger:                slog.New(h),
	})
	lk, err := l.TryAcquireKey(ctx, advisory.ID(3), nil)
	require.NoError(t, err)

	// The settings as the server reports them on the lock session.
	opened := h.find("pgfence: advisory: lock session opened")
	require.NotNil(t, opened)
	require.Equal(t, "7", opened["tcp_keepalives_idle"])
	require.Equal(t, "3", opened["tcp_keepalives_interval"])
	require.Equal(t, "4", opened["tcp_keepalives_count"])
	require.Equal(t, "12500", opened["tcp_user_timeout"])
	require.Equal(t, 1, sessionCount(t, db.Pool, advisory.DefaultApplicationName))

	_, err = db.Pool.Exec(ctx, "SELECT pg_terminate_backend($1, 5000)", holderPID(t, db, lk.Key()))
	require.NoError(t, err)
	waitDone(t, lk)
	select { // logged just after the holders are told
	case <-h.logged("pgfence: advisory: lock session lost"):
	case <-time.After(30 * time.Second):
		t.Fatal("the loss was not logged")
	}
	lost := h.find("pgfence: advisory: lock session lost")
	require.NotNil(t, lost)
	require.Equal(t, "1", lost["locks"])
}

func TestIdleSessionsClose(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.NewDB(t)
	h := &recordHandler{}
	cfg := fastConfig("pgfence-idle")
	cfg.SessionIdleTimeout = 200 * time.Millisecond
	cfg.Logger = slog.New(h)
	l := newLocker(t, db.Pool, cfg)

	lk, err := l.TryAcquireKey(ctx, advisory.ID(5), nil)
	require.NoError(t, err)
	require.NoError(t, lk.Release(ctx))
	select {
	case <-h.logged("pgfence: advisory: idle lock session closed"):
	case <-time.After(30 * time.Second):
		t.Fatal("the idle session was not closed")
	}
	// The backend exits just after the client's Terminate message.
	require.Eventually(t, func() bool { return sessionCount(t, db.Pool, "pgfence-idle") == 0 },
		10*time.Second, 10*time.Millisecond)

	lk, err = l.TryAcquireKey(ctx, advisory.ID(5), nil)
	require.NoError(t, err, "a new session is dialed")
	require.Equal(t, 1, sessionCount(t, db.Pool, "pgfence-idle"))
	require.NoError(t, lk.Release(ctx))
}

// countLevel returns the number of records at level.
func (h *recordHandler) countLevel(level slog.Level) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := 0
	for _, r := range h.records {
		if r.Level == level {
			n++
		}
	}
	return n
}
