package leasetable_test

import (
	"context"
	"log/slog"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence"
	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/leasetable"
)

func TestMain(m *testing.M) {
	if os.Getenv(pauseChildEnv) != "" {
		os.Exit(pauseChild())
	}
	pgtest.Main(m)
}

// newLocker returns a Locker on pool, closed when the test ends.
func newLocker(t *testing.T, pool *pgxpool.Pool, cfg *leasetable.Config) *leasetable.Locker {
	t.Helper()
	k, err := leasetable.New(t.Context(), pool, cfg)
	require.NoError(t, err)
	t.Cleanup(k.Close)
	return k
}

// logWatch is a slog handler that lets a test wait for a log message.
type logWatch struct {
	mu      sync.Mutex
	waiting map[string][]chan struct{}
	seen    map[string]int
	warned  strings.Builder // the error attributes of Warn records
}

func newLogWatch() *logWatch {
	return &logWatch{waiting: map[string][]chan struct{}{}, seen: map[string]int{}}
}

func (w *logWatch) logger() *slog.Logger { return slog.New(w) }

func (w *logWatch) Enabled(context.Context, slog.Level) bool { return true }
func (w *logWatch) WithAttrs([]slog.Attr) slog.Handler       { return w }
func (w *logWatch) WithGroup(string) slog.Handler            { return w }
func (w *logWatch) Handle(_ context.Context, r slog.Record) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if r.Level == slog.LevelWarn {
		r.Attrs(func(a slog.Attr) bool {
			if a.Key == "error" {
				w.warned.WriteString(a.Value.String() + "\n")
			}
			return true
		})
	}
	for sub, chans := range w.waiting {
		if strings.Contains(r.Message, sub) {
			for _, ch := range chans {
				close(ch)
			}
			delete(w.waiting, sub)
		}
	}
	for sub := range w.seen {
		if strings.Contains(r.Message, sub) {
			w.seen[sub]++
		}
	}
	return nil
}

// next returns a channel closed at the next log message containing sub.
func (w *logWatch) next(sub string) <-chan struct{} {
	w.mu.Lock()
	defer w.mu.Unlock()
	ch := make(chan struct{})
	w.waiting[sub] = append(w.waiting[sub], ch)
	return ch
}

// count starts counting log messages containing sub, and returns how many
// were seen since the first call.
func (w *logWatch) count(sub string) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	n, ok := w.seen[sub]
	if !ok {
		w.seen[sub] = 0
	}
	return n
}

// warnings returns the error attributes of the Warn records seen so far,
// one a line.
func (w *logWatch) warnings() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.warned.String()
}

// waitListening waits until the one call of k that waits has its LISTEN
// connection subscribed and has tried again since (the notifier wakes the
// Locker's waiters once it subscribes, as a release before then was not
// announced): from then on only a notification, or the holder's expiry,
// wakes it. The connection must not be subscribed when the call starts.
// logs is k's logger, and before is logs.count("waiting for lease") from
// before the call started.
func waitListening(t *testing.T, k *leasetable.Locker, logs *logWatch, before int) {
	t.Helper()
	require.Eventually(t, func() bool {
		return k.Stats().Listening && logs.count("waiting for lease")-before >= 2
	}, 30*time.Second, 2*time.Millisecond, "the waiter to listen and try again")
}

// waitFor waits for ch, failing the test after a generous bound.
func waitFor(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(30 * time.Second):
		t.Fatalf("timed out waiting for %s", what)
	}
}

// exampleDB returns a pool on a fresh migrated database for an Example, and
// a function that drops it.
func exampleDB() (*pgxpool.Pool, func()) {
	db, drop := pgtest.ExampleDB()
	return db.Pool, drop
}

type acquired struct {
	l   pgfence.Lease
	err error
}

// acquireAsync runs k.Acquire in a goroutine, giving up after waitTimeout.
func acquireAsync(k *leasetable.Locker, name string, waitTimeout time.Duration) <-chan acquired {
	got := make(chan acquired, 1)
	go func() {
		l, err := k.Acquire(context.Background(), name, &leasetable.AcquireOpts{WaitTimeout: waitTimeout})
		got <- acquired{l, err}
	}()
	return got
}
