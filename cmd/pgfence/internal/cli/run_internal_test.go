package cli

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence"
	"github.com/pgfence/pgfence/internal/leasename"
	"github.com/pgfence/pgfence/leasetable"
)

func TestParseRun(t *testing.T) {
	t.Parallel()
	o, _, err := parseRun([]string{"-n", "-E", "0", "--ttl", "1m", "--at-least=5m", "nightly", "--", "sh", "-c", "exit 3"})
	require.NoError(t, err)
	require.Equal(t, runOptions{schema: "pgfence", noWait: true, conflictExit: 0, ttl: time.Minute, atLeast: 5 * time.Minute,
		name: "nightly", argv: []string{"sh", "-c", "exit 3"}}, o)

	o, _, err = parseRun([]string{"nightly", "--wait", "30s", "--conflict-exit-code", "75", "-d", "postgres://h/db",
		"--schema", "Locks", "--", "job", "-n"})
	require.NoError(t, err)
	require.Equal(t, runOptions{wait: 30 * time.Second, conflictExit: 75, database: "postgres://h/db", schema: "Locks",
		name: "nightly", argv: []string{"job", "-n"}}, o)

	o, _, err = parseRun([]string{"x", "--", "true"})
	require.NoError(t, err)
	require.Equal(t, ExitFailure, o.conflictExit, "the conflict code defaults to 1, as flock's")

	for _, args := range [][]string{
		nil,
		{"--", "true"},
		{"nightly"},
		{"nightly", "--"},
		{"nightly", "job", "--", "true"},
		{"-n", "-w", "1s", "nightly", "--", "true"},
		{"-w", "-1s", "nightly", "--", "true"},
		{"--ttl", "-1s", "nightly", "--", "true"},
		{"--safety-margin", "1ms", "nightly", "--", "true"},
		{"-E", "256", "nightly", "--", "true"},
		{"-E", "-1", "nightly", "--", "true"},
		{"-E", "x", "nightly", "--", "true"},
		{"--bogus", "nightly", "--", "true"},
	} {
		_, _, err := parseRun(args)
		var uerr *usageError
		require.True(t, errors.As(err, &uerr), "%q: %v", args, err)
	}
}

func TestLeaseEnv(t *testing.T) {
	t.Parallel()
	l := newFakeLease("nightly", 42)
	env := leaseEnv([]string{"A=1", "PGFENCE_TOKEN=7", "PGFENCE_LEASE=old", "B=2"}, l)
	require.Equal(t, []string{"A=1", "B=2", "PGFENCE_LEASE=nightly", "PGFENCE_TOKEN=42"}, env)
}

// fakeLease stands in for a leasetable lease: run only uses its name, token,
// loss signal and release; losing it is the test's choice.
type fakeLease struct {
	name       string
	token      int64
	ctx        context.Context
	cancel     context.CancelCauseFunc
	releaseErr error

	mu       sync.Mutex
	err      error
	released int
}

var _ pgfence.Lease = (*fakeLease)(nil)

func newFakeLease(name string, token int64) *fakeLease {
	ctx, cancel := context.WithCancelCause(context.Background())
	return &fakeLease{name: name, token: token, ctx: ctx, cancel: cancel}
}

func (l *fakeLease) Name() string                { return l.name }
func (l *fakeLease) Token() int64                { return l.token }
func (l *fakeLease) Done() <-chan struct{}       { return l.ctx.Done() }
func (l *fakeLease) Context() context.Context    { return l.ctx }
func (l *fakeLease) Expiry() time.Time           { return time.Time{} }
func (l *fakeLease) Renew(context.Context) error { return l.Err() }

func (l *fakeLease) Err() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.err
}

func (l *fakeLease) Release(context.Context) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.released++
	return l.releaseErr
}

func (l *fakeLease) lose() {
	l.mu.Lock()
	l.err = pgfence.ErrLeaseLost
	l.mu.Unlock()
	l.cancel(pgfence.ErrLeaseLost)
}

func TestSuperviseUnderLease(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	notExec := filepath.Join(dir, "not-executable")
	require.NoError(t, os.WriteFile(notExec, []byte("#!/bin/sh\n"), 0o644))
	tests := []struct {
		name    string
		argv    []string
		status  int
		message string
	}{
		{"exit status", []string{"sh", "-c", "exit 3"}, 3, ""},
		{"success", []string{"true"}, 0, ""},
		{"killed by a signal", []string{"sh", "-c", "kill -TERM $$"}, 128 + int(syscall.SIGTERM), ""},
		{"not found", []string{"pgfence-no-such-command"}, ExitNotFound, "command not found"},
		{"not executable", []string{notExec}, ExitCannotExecute, "cannot be executed"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var stderr bytes.Buffer
			a := &App{Stderr: &stderr}
			l := newFakeLease("nightly", 42)
			require.Equal(t, tt.status, a.superviseUnderLease(l, tt.argv, nil, time.Second, 0, nil, func() {}, nil))
			require.Equal(t, 1, l.released, "the lease is released once")
			require.Contains(t, stderr.String(), tt.message)
		})
	}
}

func TestSuperviseUnderLeaseEnvironment(t *testing.T) {
	t.Parallel()
	out := filepath.Join(t.TempDir(), "env")
	a := &App{Stderr: &bytes.Buffer{}}
	l := newFakeLease("account:42", 1234)
	status := a.superviseUnderLease(l, []string{"sh", "-c", `printf '%s %s' "$PGFENCE_LEASE" "$PGFENCE_TOKEN" > "$0"`, out}, nil, time.Second, 0, nil, func() {}, nil)
	require.Equal(t, 0, status)
	b, err := os.ReadFile(out)
	require.NoError(t, err)
	require.Equal(t, "account:42 1234", string(b))
}

func TestSuperviseUnderLeaseLost(t *testing.T) {
	t.Parallel()
	fifo := filepath.Join(t.TempDir(), "ready")
	require.NoError(t, syscall.Mkfifo(fifo, 0o600))
	var stderr bytes.Buffer
	a := &App{Stderr: &stderr}
	l := newFakeLease("nightly", 42)
	events := newRunEvents()
	statusc := make(chan int, 1)
	go func() {
		// The command ignores SIGTERM: it takes the SIGKILL.
		statusc <- a.superviseUnderLease(l, []string{"sh", "-c", `trap '' TERM; echo ready > "$0"; while :; do sleep 1; done`, fifo},
			nil, 100*time.Millisecond, 0, nil, func() {}, events)
	}()
	ready, err := os.ReadFile(fifo)
	require.NoError(t, err)
	require.Equal(t, "ready\n", string(ready))
	// The Locker sends the Lost event as the lease ends.
	events.Observe(context.Background(), pgfence.Lost{Lock: pgfence.Lock{Kind: pgfence.StrategyLeaseTable, Name: "nightly", Token: 42},
		HeldFor: 1500 * time.Millisecond, Cause: fmt.Errorf("lease %q: %w", "nightly", pgfence.ErrLeaseTakenOver)})
	l.lose()
	require.Equal(t, ExitLeaseLost, <-statusc)
	require.Contains(t, stderr.String(), `lease "nightly" (token 42) was lost after 1.5s: lease "nightly": pgfence: lock was lost: no longer held in the database; `+
		`the command was terminated (killed by signal 9 (killed))`)
	require.Equal(t, 1, l.released)
}

// TestSuperviseUnderLeaseLostWithoutEvent: when the Lost event does not
// come (an Observer's queue was full), the loss is reported from Err.
func TestSuperviseUnderLeaseLostWithoutEvent(t *testing.T) {
	t.Parallel()
	var stderr bytes.Buffer
	a := &App{Stderr: &stderr}
	l := newFakeLease("nightly", 42)
	l.err = pgfence.ErrLeaseLost
	events := newRunEvents()
	events.wait = time.Millisecond
	// Another lease's event is not taken for this one's.
	events.Observe(context.Background(), pgfence.Lost{Lock: pgfence.Lock{Name: "nightly", Token: 41}, HeldFor: time.Hour, Cause: pgfence.ErrLeaseExpired})
	require.Equal(t, ExitLeaseLost, a.superviseUnderLease(l, []string{"true"}, nil, time.Second, 0, nil, func() {}, events))
	require.Contains(t, stderr.String(), `lease "nightly" (token 42) was lost: pgfence: lock was lost, as the command ended (exit status 0)`)
}

func TestSuperviseUnderLeaseLostAsTheCommandEnded(t *testing.T) {
	t.Parallel()
	var stderr bytes.Buffer
	a := &App{Stderr: &stderr}
	l := newFakeLease("nightly", 42)
	l.err = pgfence.ErrLeaseLost // lost, but the command ended first
	require.Equal(t, ExitLeaseLost, a.superviseUnderLease(l, []string{"true"}, nil, time.Second, 0, nil, func() {}, nil))
	require.Contains(t, stderr.String(), "was lost: pgfence: lock was lost, as the command ended (exit status 0)")
}

func TestSuperviseUnderLeaseReleaseFails(t *testing.T) {
	t.Parallel()
	var stderr bytes.Buffer
	a := &App{Stderr: &stderr}
	l := newFakeLease("nightly", 42)
	l.releaseErr = errors.New("connection refused")
	require.Equal(t, ExitRunFailure, a.superviseUnderLease(l, []string{"true"}, nil, time.Second, 0, nil, func() {}, nil))
	require.Contains(t, stderr.String(), `releasing lease "nightly" failed: connection refused; it expires after its TTL`)
}

// TestSuperviseUnderLeaseForwardsSignals sends SIGUSR1, not SIGHUP: this
// test process starts the command itself, which inherits its signal
// dispositions, and a test run under nohup ignores SIGHUP, which a
// non-interactive shell then cannot trap.
func TestSuperviseUnderLeaseForwardsSignals(t *testing.T) {
	t.Parallel()
	fifo := filepath.Join(t.TempDir(), "ready")
	require.NoError(t, syscall.Mkfifo(fifo, 0o600))
	a := &App{Stderr: &bytes.Buffer{}}
	l := newFakeLease("nightly", 42)
	sigs := make(chan os.Signal, 1)
	statusc := make(chan int, 1)
	go func() {
		statusc <- a.superviseUnderLease(l, []string{"sh", "-c", `trap 'exit 42' USR1; echo ready > "$0"; while :; do sleep 1; done`, fifo},
			sigs, time.Second, 0, nil, func() {}, nil)
	}()
	_, err := os.ReadFile(fifo)
	require.NoError(t, err)
	sigs <- syscall.SIGUSR1
	require.Equal(t, 42, <-statusc)
	require.Equal(t, 1, l.released)
}

func TestRunTiming(t *testing.T) {
	t.Parallel()
	tests := []struct {
		ttl, margin                time.Duration
		wantTTL, wantMargin, grace time.Duration
	}{
		{0, 0, 30 * time.Second, 6 * time.Second, 3 * time.Second},
		{10 * time.Second, 0, 10 * time.Second, 2 * time.Second, time.Second},
		{time.Minute, 20 * time.Second, time.Minute, 20 * time.Second, 10 * time.Second},
		{0, time.Second, 30 * time.Second, time.Second, 500 * time.Millisecond},
	}
	for _, tt := range tests {
		o := runOptions{ttl: tt.ttl, margin: tt.margin}
		ttl, margin, grace := o.timing()
		require.Equal(t, []time.Duration{tt.wantTTL, tt.wantMargin, tt.grace}, []time.Duration{ttl, margin, grace}, "%+v", tt)
		require.Less(t, grace, margin, "the group is killed before the database can expire the lease")
	}
}

func TestExitErrorCarriesItsCode(t *testing.T) {
	t.Parallel()
	var stderr bytes.Buffer
	a := &App{Stderr: &stderr}
	require.Equal(t, 75, a.exit("run", exitWith(75, nil)))
	require.Empty(t, stderr.String(), "a nil error exits silently")
	require.Equal(t, ExitRunFailure, a.exit("run", exitWith(ExitRunFailure, errors.New("database unreachable"))))
	require.Equal(t, "pgfence run: database unreachable\n", stderr.String())
}

func TestCheckName(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		ok   bool
	}{
		{"nightly", true},
		{"account:42 ü", true},
		{"tab\there", false},
		{"nul\x00", false},
		{"del\x7f", false},
		{"\xff", false},
		{"c1\u0085", true}, // leasetable's rule: C0 controls and DEL only
	}
	for _, tt := range tests {
		err := checkName(tt.name)
		if tt.ok {
			require.NoError(t, err, "%q", tt.name)
			continue
		}
		var uerr *usageError
		require.ErrorAs(t, err, &uerr, "%q", tt.name)
	}
}

func TestParseRunWaitZero(t *testing.T) {
	t.Parallel()
	o, _, err := parseRun([]string{"--wait", "0", "job", "--", "true"})
	require.NoError(t, err)
	require.True(t, o.noWait, "--wait 0 does not wait")
	o, _, err = parseRun([]string{"job", "--", "true"})
	require.NoError(t, err)
	require.False(t, o.noWait, "no --wait waits")
}

func TestRunLoggerFormat(t *testing.T) {
	t.Parallel()
	var b bytes.Buffer
	l := newLogger(&b, logText, "run")
	l.Info("not shown")
	l.With("lease", "job").Warn("pgfence: leasetable: lease lost", "token", 7, "cause", "a b")
	l.Warn("bare")
	require.Equal(t, "pgfence run: pgfence: leasetable: lease lost (lease=job token=7 cause=\"a b\")\npgfence run: bare\n", b.String())
}

func TestParseRunMaxHold(t *testing.T) {
	t.Parallel()
	o, _, err := parseRun([]string{"--max-hold", "2h", "job", "--", "true"})
	require.NoError(t, err)
	require.Equal(t, 2*time.Hour, o.maxHold)
	_, _, err = parseRun([]string{"--max-hold", "-1s", "job", "--", "true"})
	var uerr *usageError
	require.ErrorAs(t, err, &uerr)
}

// At --max-hold the command is stopped as on a loss, and the message says
// why; a command that ends sooner is not touched.
func TestSuperviseUnderLeaseMaxHold(t *testing.T) {
	t.Parallel()
	var stderr bytes.Buffer
	a := &App{Stderr: &stderr}
	l := newFakeLease("nightly", 42)
	status := a.superviseUnderLease(l, []string{"sh", "-c", "trap '' TERM; while :; do sleep 1; done"},
		nil, 100*time.Millisecond, 200*time.Millisecond, nil, func() {}, newRunEvents())
	require.Equal(t, ExitLeaseLost, status)
	require.Contains(t, stderr.String(), `lease "nightly" (token 42) reached --max-hold 200ms; the command was terminated (killed by signal 9 (killed))`)
	require.Equal(t, 1, l.released, "the lease is released")

	// Not reached: the command's own status.
	stderr.Reset()
	l = newFakeLease("nightly", 43)
	require.Equal(t, 3, a.superviseUnderLease(l, []string{"sh", "-c", "exit 3"}, nil, time.Second, time.Hour, nil, func() {}, nil))
	require.Empty(t, stderr.String())
	require.Equal(t, 1, l.released)
}

// When the Locker itself ends the lease at MaxHold (cause ErrMaxHold), run
// reports it as max-hold too.
func TestSuperviseUnderLeaseMaxHoldFromLocker(t *testing.T) {
	t.Parallel()
	fifo := filepath.Join(t.TempDir(), "ready")
	require.NoError(t, syscall.Mkfifo(fifo, 0o600))
	var stderr bytes.Buffer
	a := &App{Stderr: &stderr}
	l := newFakeLease("nightly", 42)
	statusc := make(chan int, 1)
	go func() {
		statusc <- a.superviseUnderLease(l, []string{"sh", "-c", `echo ready > "$0"; while :; do sleep 1; done`, fifo},
			nil, 100*time.Millisecond, time.Hour, nil, func() {}, nil)
	}()
	_, err := os.ReadFile(fifo)
	require.NoError(t, err)
	l.mu.Lock()
	l.err = pgfence.ErrMaxHold
	l.mu.Unlock()
	l.cancel(pgfence.ErrMaxHold)
	require.Equal(t, ExitLeaseLost, <-statusc)
	require.Contains(t, stderr.String(), `reached --max-hold 1h0m0s; the command was terminated`)
}

// TestRunOwner: the owner run writes names the command unless the table
// would refuse it: a name with a newline or too long is left out. The
// control is the plain command, which is kept.
func TestRunOwner(t *testing.T) {
	t.Parallel()
	require.Contains(t, runOwner("/usr/bin/backup"), "pgfence run backup on ", "control")
	for _, cmd := range []string{"/tmp/evil\nline", "/tmp/" + strings.Repeat("x", leasetable.MaxNameLength)} {
		owner := runOwner(cmd)
		require.Nil(t, leasename.Check(owner, leasetable.MaxNameLength), "%q", owner)
		require.NotContains(t, owner, "evil")
		require.NotContains(t, owner, "xxx")
		require.Contains(t, owner, fmt.Sprintf("(pid %d)", os.Getpid()))
	}
}
