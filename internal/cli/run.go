package cli

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/pgfence/pgfence/internal/supervise"
)

// Environment variables that tell the command which lease it runs under,
// so that its own SQL can be fenced with the token.
const (
	EnvLease = "PGFENCE_LEASE"
	EnvToken = "PGFENCE_TOKEN"
)

const runHelp = `
Usage:
  pgfence run [flags] NAME -- COMMAND [ARGS...]

Runs COMMAND while holding the lease NAME, like flock(1) across machines:
acquires the lease (waiting for it unless --no-wait), runs the command,
renews the lease while it runs, and releases it when the command exits.

The command gets PGFENCE_LEASE (the name) and PGFENCE_TOKEN (the fencing
token of this acquisition) in its environment, so its own SQL can be fenced.
It runs in its own process group; SIGINT, SIGTERM and SIGHUP sent to pgfence
are forwarded to that group. If the lease is lost while the command runs
(it could not be renewed in time, or an operator ran pgfence release
--force), the whole group gets SIGTERM, then SIGKILL after a grace period.

Run exit codes (instead of the general ones below):
  the command's   its exit code, or 128+N when signal N ended it
  1, or -E N      the lease is held by another owner (--no-wait, or --wait ran out)
  2               usage error
  124             the lease was lost; the command was terminated
  125             pgfence run itself failed (database unreachable, release failed)
  126             the command could not be executed
  127             the command was not found

Examples:
  pgfence run nightly-report -- ./report.sh --since yesterday
  pgfence run -n -E 0 billing-sync -- billing sync     # cron: skip quietly if running elsewhere
  pgfence run -w 30s --ttl 1m --at-least 5m import -- sh -c 'psql -v token=$PGFENCE_TOKEN -f import.sql'
`

// runOptions are the parsed flags and arguments of `pgfence run`.
type runOptions struct {
	database     string
	noWait       bool
	wait         time.Duration // 0: wait until acquired (unless noWait)
	ttl          time.Duration // 0: the lock package's default
	atLeast      time.Duration
	conflictExit int
	name         string
	argv         []string
}

// parseRun parses `pgfence run [flags] NAME -- COMMAND [ARGS...]`.
func parseRun(args []string) (runOptions, *flags, error) {
	o := runOptions{conflictExit: ExitFailure}
	f := newFlags("run")
	f.Bool(&o.noWait, "n", "no-wait", "fail at once (exit with the conflict code) if the lease is held")
	f.Duration(&o.wait, "w", "wait", "give up (exit with the conflict code) if the lease is not acquired within DURATION")
	f.Duration(&o.ttl, "", "ttl", "lease time to live; renewed at about a third of it while the command runs")
	f.Duration(&o.atLeast, "", "at-least", "keep the lease at least DURATION after acquiring it, even if the command ends sooner")
	f.fs.IntVar(&o.conflictExit, "E", o.conflictExit, "")
	f.fs.IntVar(&o.conflictExit, "conflict-exit-code", o.conflictExit, "")
	f.add("E", "conflict-exit-code", "N", "exit status when the lease is held by another owner", strconv.Itoa(o.conflictExit))
	f.String(&o.database, "d", "database", "URL", databaseFlagUsage)
	pos, argv, err := f.parse(args)
	if err != nil {
		return o, f, err
	}
	switch {
	case len(pos) == 0:
		return o, f, usageErrorf("expected a lease name and a command: pgfence run NAME -- COMMAND [ARGS...]")
	case len(pos) > 1:
		return o, f, usageErrorf("expected one lease name before --, got %q; put the command after --", strings.Join(pos, " "))
	case len(argv) == 0:
		return o, f, usageErrorf("no command: put it after --, as in pgfence run %s -- COMMAND [ARGS...]", pos[0])
	case pos[0] == "":
		return o, f, usageErrorf("the lease name is empty")
	case o.noWait && o.wait != 0:
		return o, f, usageErrorf("--no-wait and --wait exclude each other")
	case o.wait < 0 || o.ttl < 0 || o.atLeast < 0:
		return o, f, usageErrorf("durations must not be negative")
	case o.conflictExit < 0 || o.conflictExit > 255:
		return o, f, usageErrorf("--conflict-exit-code must be between 0 and 255, not %d", o.conflictExit)
	}
	o.name, o.argv = pos[0], argv
	return o, f, nil
}

// heldLease is what run needs of a lease it holds. A leasetable lease
// provides it.
type heldLease interface {
	Name() string
	Token() int64
	// Done is closed when the lease is lost or released.
	Done() <-chan struct{}
	// Err is nil while the lease is held, and matches pgfence.ErrLeaseLost
	// once it was lost.
	Err() error
	Release(ctx context.Context) error
}

// releaseTimeout bounds releasing the lease after the command ended.
const releaseTimeout = 10 * time.Second

// superviseUnderLease runs argv while lease is held and returns the exit
// status of `pgfence run`: the command's, or ExitLeaseLost,
// ExitCannotExecute, ExitNotFound or ExitRunFailure. The command runs in its
// own process group with EnvLease and EnvToken set; signals from sigs are
// forwarded to the group; when the lease is lost the group gets SIGTERM,
// then SIGKILL after grace. The lease is released when the command ends.
func (a *App) superviseUnderLease(lease heldLease, argv []string, sigs <-chan os.Signal, grace time.Duration) int {
	res, err := supervise.Run(&supervise.Config{
		Path:   argv[0],
		Args:   argv[1:],
		Env:    leaseEnv(os.Environ(), lease),
		Stdin:  os.Stdin,
		Stdout: os.Stdout,
		Stderr: os.Stderr,
	}, &supervise.RunOpts{Signals: sigs, Lost: lease.Done(), Grace: grace})

	// The command's context is over; the release must still happen.
	ctx, cancel := context.WithTimeout(context.Background(), releaseTimeout)
	defer cancel()
	relErr := lease.Release(ctx)

	switch {
	case errors.Is(err, supervise.ErrNotFound):
		fmt.Fprintf(a.Stderr, "pgfence run: %v\n", err)
		return ExitNotFound
	case errors.Is(err, supervise.ErrNotExecutable):
		fmt.Fprintf(a.Stderr, "pgfence run: %v\n", err)
		return ExitCannotExecute
	case err != nil:
		fmt.Fprintf(a.Stderr, "pgfence run: %v\n", err)
		return ExitRunFailure
	case res.Lost:
		fmt.Fprintf(a.Stderr, "pgfence run: lease %q (token %d) was lost: %v; the command was terminated (%s)\n",
			lease.Name(), lease.Token(), lease.Err(), res.Exit)
		return ExitLeaseLost
	case lease.Err() != nil:
		// Lost as the command ended: its last moments were not protected.
		fmt.Fprintf(a.Stderr, "pgfence run: lease %q (token %d) was lost as the command ended (%s): %v\n",
			lease.Name(), lease.Token(), res.Exit, lease.Err())
		return ExitLeaseLost
	case relErr != nil:
		fmt.Fprintf(a.Stderr, "pgfence run: the command ended (%s), but releasing lease %q failed: %v; it expires after its TTL\n",
			res.Exit, lease.Name(), relErr)
		return ExitRunFailure
	}
	return res.Exit.Status()
}

// leaseEnv returns env with EnvLease and EnvToken set for lease, replacing
// any inherited values.
func leaseEnv(env []string, lease heldLease) []string {
	out := make([]string, 0, len(env)+2)
	for _, kv := range env {
		if strings.HasPrefix(kv, EnvLease+"=") || strings.HasPrefix(kv, EnvToken+"=") {
			continue
		}
		out = append(out, kv)
	}
	return append(out, EnvLease+"="+lease.Name(), EnvToken+"="+strconv.FormatInt(lease.Token(), 10))
}
