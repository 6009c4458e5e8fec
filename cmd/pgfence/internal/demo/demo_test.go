package demo_test

import (
	"bytes"
	"context"
	"errors"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/pgfence/pgfence/cmd/pgfence/internal/demo"
	"github.com/pgfence/pgfence/migrations"
)

// workerEnv makes the test binary run as a demo worker with testHandler.
const workerEnv = "DEMO_TEST_WORKER"

func TestMain(m *testing.M) {
	if os.Getenv(workerEnv) == "1" {
		if err := demo.Serve(context.Background(), os.Stdin, os.Stdout, testHandler); err != nil {
			os.Exit(1)
		}
		os.Exit(0)
	}
	goleak.VerifyTestMain(m)
}

// testHandler answers "pid" with its process id as the token, "double" with
// twice the balance, and fails every other operation.
func testHandler(_ context.Context, cmd demo.Command) demo.Event {
	switch cmd.Op {
	case "pid":
		return demo.Event{Token: int64(os.Getpid())}
	case "double":
		return demo.Event{Balance: 2 * cmd.Balance, Fenced: cmd.Fenced}
	default:
		return demo.Event{Error: "unknown op " + strconv.Quote(cmd.Op)}
	}
}

func startWorker(t *testing.T) *demo.Worker {
	t.Helper()
	self, err := os.Executable()
	require.NoError(t, err)
	w, err := demo.StartWorker("worker-1", self, nil, []string{workerEnv + "=1"}, os.Stderr)
	require.NoError(t, err)
	return w
}

// state returns the process state letter from /proc (R, S, T, ...).
func state(t *testing.T, pid int) byte {
	t.Helper()
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	require.NoError(t, err)
	s := string(b)
	return s[strings.LastIndexByte(s, ')')+2]
}

func TestWorkerProtocol(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	w := startWorker(t)

	ev, err := w.Do(ctx, demo.Command{Op: "pid"})
	require.NoError(t, err)
	require.Equal(t, demo.Event{Op: "pid", Token: int64(w.Pid())}, ev)

	ev, err = w.Do(ctx, demo.Command{Op: "double", Balance: 21, Fenced: true})
	require.NoError(t, err)
	require.Equal(t, demo.Event{Op: "double", Balance: 42, Fenced: true}, ev)

	ev, err = w.Do(ctx, demo.Command{Op: "fly"})
	require.NoError(t, err)
	require.Equal(t, demo.Event{Op: "fly", Error: `unknown op "fly"`}, ev)

	require.NoError(t, w.Close())
}

func TestWorkerPauseAndResume(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	w := startWorker(t)

	require.NoError(t, w.Pause())
	require.Eventually(t, func() bool { return state(t, w.Pid()) == 'T' }, 10*time.Second, 5*time.Millisecond,
		"the whole process is stopped")
	var ev demo.Event
	var err error
	answered := make(chan struct{})
	go func() {
		defer close(answered)
		ev, err = w.Do(ctx, demo.Command{Op: "double", Balance: 1})
	}()
	require.NoError(t, w.Resume())
	<-answered
	require.NoError(t, err)
	require.Equal(t, demo.Event{Op: "double", Balance: 2}, ev)
	require.NotEqual(t, byte('T'), state(t, w.Pid()))

	// Closing a stopped worker resumes it so it can exit.
	require.NoError(t, w.Pause())
	require.NoError(t, w.Close())
}

func TestWorkerDoEndsWithContext(t *testing.T) {
	t.Parallel()
	w := startWorker(t)
	require.NoError(t, w.Pause())
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := w.Do(ctx, demo.Command{Op: "pid"})
	require.ErrorIs(t, err, context.Canceled)
	require.Error(t, w.Close(), "the worker was killed")
}

func TestServeReportsBadCommands(t *testing.T) {
	t.Parallel()
	var out bytes.Buffer
	in := strings.NewReader("{\"op\":\"double\",\"balance\":4}\nnot json\n")
	require.NoError(t, demo.Serve(context.Background(), in, &out, testHandler))
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	require.Len(t, lines, 2)
	require.Equal(t, `{"op":"double","balance":8}`, lines[0])
	require.Contains(t, lines[1], `"error":"bad command \"not json\"`)

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	err := demo.Serve(ctx, strings.NewReader("{\"op\":\"pid\"}\n"), &out, testHandler)
	require.True(t, errors.Is(err, context.Canceled))
}

func TestTimeline(t *testing.T) {
	t.Parallel()
	var out bytes.Buffer
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	tl := demo.NewTimeline(&out, func() time.Time { return now }, 8)
	tl.Event("demo", "starting")
	now = now.Add(1234 * time.Millisecond)
	tl.Event("worker-1", "acquired %s with token %d", "account:42", 7)
	require.Equal(t, "  +0.000s  demo      starting\n  +1.234s  worker-1  acquired account:42 with token 7\n", out.String())
}

func ExampleTimeline() {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	tl := demo.NewTimeline(os.Stdout, func() time.Time { return now }, 8)
	tl.Event("worker-1", "acquired account:42, token 7")
	now = now.Add(2500 * time.Millisecond)
	tl.Event("worker-2", "write rejected: fenced")
	// Output:
	//   +0.000s  worker-1  acquired account:42, token 7
	//   +2.500s  worker-2  write rejected: fenced
}

func TestStartDatabasePrepareDrop(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	db, err := demo.StartDatabase(ctx)
	require.NoError(t, err)
	defer db.Close()
	require.Contains(t, db.URL, "/"+demo.DatabaseName+"?")

	require.NoError(t, demo.Prepare(ctx, db.URL, ""))
	latest := migrations.Latest()
	v, dirty, err := migrations.Version(ctx, migrations.Target{URL: db.URL}, nil)
	require.NoError(t, err)
	require.False(t, dirty)
	require.Equal(t, latest, v)

	conn, err := pgx.Connect(ctx, db.URL)
	require.NoError(t, err)
	defer func() { _ = conn.Close(context.Background()) }()
	var listen string
	require.NoError(t, conn.QueryRow(ctx, "SELECT pg_catalog.current_setting('listen_addresses')").Scan(&listen))
	require.Empty(t, listen, "the throwaway server listens on its private socket only")
	account := func() (balance, token int64) {
		require.NoError(t, conn.QueryRow(ctx, "SELECT balance, fence_token FROM "+demo.AccountsTable.Sanitize()+" WHERE id = $1",
			demo.AccountID).Scan(&balance, &token))
		return balance, token
	}
	b, tok := account()
	require.Equal(t, int64(demo.InitialBalance), b)
	require.Zero(t, tok)

	// Preparing again resets the account.
	_, err = conn.Exec(ctx, "UPDATE "+demo.AccountsTable.Sanitize()+" SET balance = 1, fence_token = 9")
	require.NoError(t, err)
	require.NoError(t, demo.Prepare(ctx, db.URL, ""))
	b, tok = account()
	require.Equal(t, int64(demo.InitialBalance), b)
	require.Zero(t, tok)

	require.NoError(t, demo.Drop(ctx, db.URL))
	var exists bool
	require.NoError(t, conn.QueryRow(ctx, "SELECT pg_catalog.to_regnamespace('pgfence_demo') IS NOT NULL").Scan(&exists))
	require.False(t, exists)
	require.NoError(t, conn.QueryRow(ctx, "SELECT pg_catalog.to_regclass('pgfence.pgfence_leases') IS NOT NULL").Scan(&exists))
	require.True(t, exists, "pgfence's own schema is left alone")
	require.NoError(t, conn.Close(ctx))

	// Close stops the server and removes its files.
	db.Close()
	_, err = pgx.Connect(ctx, db.URL+"&connect_timeout=5")
	require.Error(t, err)
	db.Close()
}
