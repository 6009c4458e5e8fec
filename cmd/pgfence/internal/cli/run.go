package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence"
	"github.com/pgfence/pgfence/cmd/pgfence/internal/supervise"
	"github.com/pgfence/pgfence/internal/leasename"
	"github.com/pgfence/pgfence/internal/notifier"
	"github.com/pgfence/pgfence/leasetable"
)

// Environment variables that tell the command which lease it runs under,
// so that its own SQL can be fenced with the token.
const (
	EnvLease = "PGFENCE_LEASE"
	EnvToken = "PGFENCE_TOKEN"
	// With --permits: the semaphore's name and the permit's slot.
	EnvSemaphore = "PGFENCE_SEMAPHORE"
	EnvPermit    = "PGFENCE_PERMIT"
)

const runHelp = `
Usage:
  pgfence run [flags] NAME -- COMMAND [ARGS...]
  pgfence run --every DURATION [flags] JOB -- COMMAND [ARGS...]
  pgfence run --slot KEY [flags] JOB -- COMMAND [ARGS...]

Runs COMMAND while holding the lease NAME, like flock(1) across machines:
acquires the lease, runs the command, renews the lease while it runs, and
releases it when the command exits. Without --no-wait or --wait, run waits
for the lease as long as it takes (as flock does); it wakes as soon as the
holder releases it. --wait 0 does not wait, like --no-wait (flock -w 0). SIGINT or SIGTERM while waiting gives up (status 128+N).

The command gets PGFENCE_LEASE (the name) and PGFENCE_TOKEN (the fencing
token of this acquisition) in its environment, so its own SQL can be fenced.

With --permits N, NAME is a semaphore of N permits (1 to 1024): run takes
any free one, so at most N commands run at once under NAME across machines.
Each permit is a lease of its own, with its own token; the command also
gets PGFENCE_SEMAPHORE (NAME) and PGFENCE_PERMIT (the permit's slot, 0 to
N-1), and PGFENCE_LEASE is the permit's lease name (NAME, the byte 0x1f,
the slot): key fenced rows by it. Every user of NAME must give the same N
while a permit is held (else exit 125).
It does not get the lease's secret: renewing and releasing stay with
pgfence run, and a token is all a fenced write needs; a secret in the
environment would let any process that reads it release or renew the
lease.
It runs in its own process group; SIGINT, SIGTERM and SIGHUP sent to pgfence
are forwarded to that group. Its exit status becomes pgfence's.

Lease loss and the grace period:
  The lease is renewed every TTL/3. If renewals fail, pgfence gives the lease
  up at  SENT + TTL - MARGIN  on its own monotonic clock, where SENT is when
  the last successful acquire or renewal was sent. The database counts the
  TTL from its now() when that statement ran, which was after SENT, so when
  pgfence gives up at least MARGIN is left before the database could let
  anyone else acquire the lease. pgfence then sends SIGTERM to the command's
  process group, and SIGKILL to whatever is left GRACE = MARGIN/2 later; the
  other half of the margin absorbs clock-rate differences between this host
  and the database and the time the kill takes. The defaults, TTL 30s and
  MARGIN = TTL/5 = 6s, give the command 3s to stop after SIGTERM. For more,
  raise --safety-margin (at most TTL/3) or --ttl.
  The loss can also be found later than the lease's expiry: when a renewal
  finds the lease taken (an operator ran 'pgfence release --force'), or when
  pgfence itself was paused past the TTL. Another owner may then already
  hold the lease; only the command's fenced writes (with PGFENCE_TOKEN) are
  protected from that.
  A force release (or any release of the lease) is announced on a
  notification; run listens for it and checks the lease at once, so the
  command gets SIGTERM within about a round trip, not at the next renewal.

The whole job, even when pgfence is killed:
  The command is started by a supervisor, a second pgfence process that is
  a child subreaper (Linux): every process the command starts stays its
  descendant, even one that calls setsid() or leaves the process group. On
  loss, SIGTERM and then SIGKILL go to all of them. If pgfence dies for any
  reason, SIGKILL included, the supervisor sees its control pipe close and
  kills every descendant at once (milliseconds), long before the lease
  could expire and pass to another owner. Not covered: a process that
  escapes the supervisor's tree (started through another service, such as
  systemd-run, at or cron), or the supervisor itself being killed with
  SIGKILL (the command gets SIGKILL then, its descendants do not); on
  systems other than Linux only the command's process group is ended.

Once per slot (--every, --slot):
  With --every DURATION the command runs at most once per slot of that
  length on the database's clock (slots start at multiples of DURATION
  since the Unix epoch: --every 1m starts one each minute at :00); with
  --slot KEY, once for KEY (a date, a batch id). Every replica may run the
  same cron line: the first one runs the slot, the others wait while it
  runs and then find it done (exit with the conflict code) or, if its
  holder died or lost the lease, run it again. The slot is recorded done
  when the command exits 0, failed otherwise (a failed slot runs again the
  next time it is asked for); 'pgfence ls --jobs' lists them. The lease is
  pgfence:schedule:JOB; --max-hold defaults to 1h. The command gets
  PGFENCE_SLOT (the slot's key) too. A command that writes to the database
  must fence its writes with PGFENCE_TOKEN: the slot's record is fenced,
  the command's own writes only if it presents the token.

Exit codes:
  the command's   its exit code, or 128+N when signal N ended it
  1, or -E N      the lease is held by another owner (--no-wait, or --wait ran out),
                  or, with --every or --slot, the slot is done
  2               usage error
  124             the lease was lost, or held for --max-hold; the command was terminated
  125             pgfence run itself failed (database unreachable, schema missing, release failed)
  126             the command could not be executed
  127             the command was not found
  128+N           interrupted by signal N while waiting for the lease

Examples:
  pgfence run nightly-report -- ./report.sh --since yesterday
  pgfence run -n -q -E 0 billing-sync -- billing sync   # cron: skip quietly if running elsewhere
  pgfence run -w 30s --ttl 1m --at-least 5m import -- sh -c 'psql -v token=$PGFENCE_TOKEN -f import.sql'
  pgfence run --max-hold 2h nightly-report -- ./report.sh   # stop it, as on a loss, after 2h
  pgfence run -q -E 0 --every 1m billing-sync -- billing sync   # cron on every replica: once a minute
  pgfence run --slot "$(date -u +%F)" daily-report -- ./report.sh
  pgfence run --permits 4 transcode -- ./transcode.sh   # at most 4 at once, anywhere
`

// runOptions are the parsed flags and arguments of `pgfence run`.
type runOptions struct {
	database     string
	schema       string
	noWait       bool
	wait         time.Duration // 0: wait until acquired (unless noWait)
	ttl          time.Duration // 0: the lock package's default
	atLeast      time.Duration
	maxHold      time.Duration // 0: no bound
	margin       time.Duration // 0: ttl / defaultMarginDivisor
	permits      int           // 0: NAME is a lease, else a semaphore of this many permits
	conflictExit int
	quiet        bool
	every        time.Duration // 0: not once per slot
	slot         string
	name         string
	argv         []string
}

// parseRun parses `pgfence run [flags] NAME -- COMMAND [ARGS...]`.
func parseRun(args []string) (runOptions, *flags, error) {
	o := runOptions{conflictExit: ExitFailure}
	f := newFlags("run")
	f.Bool(&o.noWait, "n", "no-wait", "fail at once (exit with the conflict code) if the lease is held")
	f.Duration(&o.wait, "w", "wait", "give up (exit with the conflict code) if the lease is not acquired within DURATION")
	f.Duration(&o.ttl, "", "ttl", "lease time to live, renewed every third of it while the command runs (default 30s)")
	f.Duration(&o.atLeast, "", "at-least", "keep the lease at least DURATION after acquiring it, even if the command ends sooner")
	f.Duration(&o.maxHold, "", "max-hold", "give the lease up DURATION after acquiring it: the command is stopped as on a lost lease (exit 124)")
	f.Duration(&o.margin, "", "safety-margin", "give the lease up this long before the database would expire it; SIGKILL follows SIGTERM after half of it (default TTL/5)")
	f.fs.IntVar(&o.permits, "permits", 0, "")
	f.add("", "permits", "N", "NAME is a semaphore of N permits: run while holding any one of them", "")
	f.fs.IntVar(&o.conflictExit, "E", o.conflictExit, "")
	f.fs.IntVar(&o.conflictExit, "conflict-exit-code", o.conflictExit, "")
	f.add("E", "conflict-exit-code", "N", "exit status when the lease is held by another owner", strconv.Itoa(o.conflictExit))
	f.Bool(&o.quiet, "q", "quiet", "say nothing when the lease is held by another owner")
	f.Duration(&o.every, "", "every", "run at most once per slot of DURATION on the database clock (see Once per slot)")
	f.String(&o.slot, "", "slot", "KEY", "run at most once for slot KEY (see Once per slot)")
	f.String(&o.database, "d", "database", "URL", databaseFlagUsage)
	schemaFlag(f, &o.schema)
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
	case o.noWait && f.set("w", "wait"):
		return o, f, usageErrorf("--no-wait and --wait exclude each other")
	case o.wait < 0:
		return o, f, usageErrorf("--wait must not be negative, not %v", o.wait)
	case o.ttl < 0:
		return o, f, usageErrorf("--ttl must not be negative, not %v", o.ttl)
	case o.atLeast < 0:
		return o, f, usageErrorf("--at-least must not be negative, not %v", o.atLeast)
	case o.maxHold < 0:
		return o, f, usageErrorf("--max-hold must not be negative, not %v", o.maxHold)
	case o.margin < 0:
		return o, f, usageErrorf("--safety-margin must not be negative, not %v", o.margin)
	case o.margin != 0 && o.margin < minMargin:
		return o, f, usageErrorf("--safety-margin must be at least %v, not %v", minMargin, o.margin)
	case f.set("", "permits") && (o.permits < 1 || o.permits > leasetable.MaxPermits):
		return o, f, usageErrorf("--permits must be between 1 and %d, not %d", leasetable.MaxPermits, o.permits)
	case o.permits > 0 && len(pos[0]) > leasetable.MaxSemaphoreNameLength:
		return o, f, usageErrorf("the semaphore name is %d bytes long; at most %d are allowed", len(pos[0]), leasetable.MaxSemaphoreNameLength)
	case len(pos[0]) > leasetable.MaxNameLength:
		return o, f, usageErrorf("the lease name is %d bytes long; at most %d are allowed", len(pos[0]), leasetable.MaxNameLength)
	case checkName(pos[0]) != nil:
		return o, f, checkName(pos[0])
	case o.conflictExit < 0 || o.conflictExit > 255:
		return o, f, usageErrorf("--conflict-exit-code must be between 0 and 255, not %d", o.conflictExit)
	}
	if err := checkSlotFlags(&o, pos[0], f); err != nil {
		return o, f, err
	}
	// --wait 0 does not wait, as flock -w 0 does not.
	if f.set("w", "wait") && o.wait == 0 {
		o.noWait = true
	}
	o.name, o.argv = pos[0], argv
	return o, f, nil
}

// checkName returns a usage error if name cannot be a lease name:
// leasetable refuses names that are not UTF-8 or hold control characters
// (internal/leasename), and so does the command line, before connecting.
// Lengths and empty names are checked where the name's kind sets them.
func checkName(name string) error {
	switch p := leasename.Check(name, len(name)); {
	case p == nil || p.Kind == leasename.Empty:
		return nil
	case p.Kind == leasename.NotUTF8:
		return usageErrorf("the lease name %q is not valid UTF-8", name)
	default: // a NUL or another control character
		return usageErrorf("the lease name %q holds a control character (%U)", name, p.Char)
	}
}

// releaseTimeout bounds releasing the lease after the command ended;
// lostReleaseTimeout bounds it after the lease was lost, when the release
// only tidies up (the row is expired or someone else's) and must not hold
// pgfence's exit up behind a blocked statement.
const (
	releaseTimeout     = 10 * time.Second
	lostReleaseTimeout = time.Second
)

// runSupervisorCommand is the hidden subcommand that is run's supervisor:
// this binary re-executed between pgfence run and the command, where it
// becomes a child subreaper and kills every descendant when pgfence run
// dies (supervise.Serve).
const runSupervisorCommand = "run-supervisor"

// envNoSupervisor, set to 1, makes run start the command itself, without
// the supervisor process. Only the tests set it: it is the negative control
// showing what the supervisor prevents.
const envNoSupervisor = "PGFENCE_TEST_NO_SUPERVISOR"

// envNoLossWatch, set to 1, turns watchForLoss off, so a loss is found by
// the next scheduled renewal only. Only the tests set it (the negative
// control of the force-release timing).
const envNoLossWatch = "PGFENCE_TEST_NO_LOSS_WATCH"

// supervisorArgv returns the command line that starts run's supervisor, or
// nil to start the command directly (envNoSupervisor, or no subreapers on
// this system).
func supervisorArgv() ([]string, error) {
	if os.Getenv(envNoSupervisor) == "1" || runtime.GOOS != "linux" {
		return nil, nil
	}
	self, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("cannot find this program to start the supervisor: %w", err)
	}
	return []string{self, runSupervisorCommand}, nil
}

// superviseUnderLease runs argv while lease is held and returns the exit
// status of `pgfence run`: the command's, or ExitLeaseLost,
// ExitCannotExecute, ExitNotFound or ExitRunFailure. The command runs in its
// own process group with EnvLease and EnvToken set; signals from sigs are
// forwarded to the group; when the lease is lost the group gets SIGTERM,
// then SIGKILL after grace; so it does, as on a loss, once maxHold (when
// positive) has passed (the Locker ends the lease then too, with cause
// pgfence.ErrMaxHold; this bound backs it up). sup, if not nil, starts the supervisor process
// between pgfence and the command (supervisorArgv). stopWatch stops
// watchForLoss before the release. The lease is released when the command
// ends. A loss is reported from its Lost event (how long the lease was
// held, and why), which events delivers.
func (a *App) superviseUnderLease(lease pgfence.Lease, argv []string, sigs <-chan os.Signal, grace, maxHold time.Duration, sup []string, stopWatch func(), events *runEvents) int {
	held := lease.Context()
	if maxHold > 0 {
		var cancel context.CancelFunc
		held, cancel = context.WithTimeoutCause(held, maxHold, pgfence.ErrMaxHold)
		defer cancel()
	}
	res, err := supervise.Run(&supervise.Config{
		Path:   argv[0],
		Args:   argv[1:],
		Env:    leaseEnv(os.Environ(), lease),
		Stdin:  os.Stdin,
		Stdout: os.Stdout,
		Stderr: os.Stderr,
	}, &supervise.RunOpts{Signals: sigs, Lost: held.Done(), Grace: grace, Supervisor: sup})

	// Whether the lease was lost is read before the release, after which
	// Err reports the release itself.
	lostErr := lease.Err()
	if lostErr == nil && errors.Is(context.Cause(held), pgfence.ErrMaxHold) {
		lostErr = fmt.Errorf("held for --max-hold %v: %w", maxHold, pgfence.ErrMaxHold)
	}
	stopWatch() // our own release notifies too
	relErr := a.releaseAfterRun(lease, lostErr != nil)

	ctx := context.Background()
	leaseAttrs := []slog.Attr{slog.String("lease", lease.Name()), slog.Int64("token", lease.Token())}
	var lost string // "lost after 2.5s: CAUSE", from the Lost event
	switch {
	case errors.Is(lostErr, pgfence.ErrMaxHold):
		lost = fmt.Sprintf("reached --max-hold %v", maxHold)
		leaseAttrs = append(leaseAttrs, slog.Float64("max_hold_seconds", maxHold.Seconds()))
	case lostErr != nil:
		ev, ok := events.lost(lease)
		if ok {
			lostErr = ev.Cause
			lost = fmt.Sprintf("was lost after %v: %v", ev.HeldFor.Round(time.Millisecond), ev.Cause)
			leaseAttrs = append(leaseAttrs, slog.Float64("held_for_seconds", ev.HeldFor.Seconds()))
		} else {
			lost = fmt.Sprintf("was lost: %v", lostErr)
		}
	}
	switch {
	case errors.Is(err, supervise.ErrNotFound):
		a.say(ctx, slog.LevelError, err.Error(), slog.Int("exit_code", ExitNotFound))
		return ExitNotFound
	case errors.Is(err, supervise.ErrNotExecutable):
		a.say(ctx, slog.LevelError, err.Error(), slog.Int("exit_code", ExitCannotExecute))
		return ExitCannotExecute
	case err != nil:
		a.say(ctx, slog.LevelError, err.Error(), slog.Int("exit_code", ExitRunFailure))
		return ExitRunFailure
	case res.Lost:
		// The lease's end (its loss, or --max-hold) stopped the command.
		a.say(ctx, slog.LevelError, fmt.Sprintf("lease %q (token %d) %s; the command was terminated (%s)",
			lease.Name(), lease.Token(), lost, res.Exit),
			append(leaseAttrs, slog.String("cause", lostErr.Error()), slog.String("command_exit", res.Exit.String()), slog.Int("exit_code", ExitLeaseLost))...)
		return ExitLeaseLost
	case lostErr != nil:
		// Lost as the command ended: its last moments were not protected.
		a.say(ctx, slog.LevelError, fmt.Sprintf("lease %q (token %d) %s, as the command ended (%s)",
			lease.Name(), lease.Token(), lost, res.Exit),
			append(leaseAttrs, slog.String("cause", lostErr.Error()), slog.String("command_exit", res.Exit.String()), slog.Int("exit_code", ExitLeaseLost))...)
		return ExitLeaseLost
	case relErr != nil:
		a.say(ctx, slog.LevelError, fmt.Sprintf("the command ended (%s), but releasing lease %q failed: %v; it expires after its TTL",
			res.Exit, lease.Name(), relErr),
			append(leaseAttrs, slog.String("error", relErr.Error()), slog.String("command_exit", res.Exit.String()), slog.Int("exit_code", ExitRunFailure))...)
		return ExitRunFailure
	}
	return res.Exit.Status()
}

// releaseAfterRun releases the lease once the command has ended, bounded
// by releaseTimeout, or lostReleaseTimeout when the lease was lost: the
// command's context is over, the release must still happen, and must not
// hold pgfence up for long.
func (a *App) releaseAfterRun(lease pgfence.Lease, lost bool) error {
	timeout := releaseTimeout
	if lost {
		timeout = lostReleaseTimeout
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	// Release may wait for an in-flight renewal, bounded by the Locker's
	// QueryTimeout rather than ctx: wait for it no longer than ctx allows.
	done := make(chan error, 1)
	go func() { done <- lease.Release(ctx) }()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		select {
		case err := <-done:
			return err
		case <-time.After(100 * time.Millisecond):
			return fmt.Errorf("release of lease %q did not finish within %v", lease.Name(), timeout)
		}
	}
}

// leaseEnv returns env with EnvLease and EnvToken set for lease, replacing
// any inherited values.
func leaseEnv(env []string, lease pgfence.Lease) []string {
	out := make([]string, 0, len(env)+2)
	for _, kv := range env {
		if strings.HasPrefix(kv, EnvLease+"=") || strings.HasPrefix(kv, EnvToken+"=") ||
			strings.HasPrefix(kv, EnvSemaphore+"=") || strings.HasPrefix(kv, EnvPermit+"=") {
			continue
		}
		out = append(out, kv)
	}
	out = append(out, EnvLease+"="+lease.Name(), EnvToken+"="+strconv.FormatInt(lease.Token(), 10))
	if sem, slot, ok := leasetable.SplitPermit(lease.Name()); ok {
		out = append(out, EnvSemaphore+"="+sem, EnvPermit+"="+strconv.Itoa(slot))
	}
	return out
}

// defaultMarginDivisor sets run's default safety margin to TTL/5: larger
// than leasetable's TTL/10, so that half of it leaves the command a useful
// grace period between SIGTERM and SIGKILL.
const defaultMarginDivisor = 5

// minMargin is the smallest --safety-margin: half of it is the grace
// period between SIGTERM and SIGKILL, which must not round to nothing.
const minMargin = 10 * time.Millisecond

// runPoolMaxConns bounds run's connections: renewals, the release, and
// acquiring; the LISTEN connection of a waiting Acquire is separate.
const runPoolMaxConns = 2

// timing returns the lease's TTL and safety margin, and the grace period
// between SIGTERM and SIGKILL on loss: half the margin (see runHelp).
func (o *runOptions) timing() (ttl, margin, grace time.Duration) {
	ttl = o.ttl
	if ttl == 0 {
		ttl = leasetable.DefaultTTL
	}
	margin = o.margin
	if margin == 0 {
		margin = ttl / defaultMarginDivisor
	}
	return ttl, margin, margin / 2
}

// run is `pgfence run`.
func (a *App) run(ctx context.Context, args []string) error {
	o, f, err := parseRun(args)
	if errors.Is(err, flag.ErrHelp) {
		a.printHelpCodes(f, runHelp, "") // runHelp has run's own exit codes
	}
	if err != nil {
		return err
	}
	if err := checkSchema(o.schema); err != nil {
		return err
	}
	dsn, err := connString(o.database)
	if err != nil {
		return err
	}
	// From now on SIGINT, SIGTERM and SIGHUP are ours: while waiting they
	// end the wait; while the command runs they are forwarded to it.
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
	defer signal.Stop(sigs)

	ttl, margin, grace := o.timing()
	// leasetable's rule, checked here so that a bad combination is a usage
	// error: two renewals (every TTL/3) must fit before the local deadline.
	switch {
	case ttl < leasetable.MinTTL:
		return usageErrorf("--ttl must be at least %v, not %v", leasetable.MinTTL, ttl)
	case 2*(ttl/3)+margin > ttl:
		return usageErrorf("--safety-margin %v is too large for --ttl %v: at most TTL/3 (%v)", margin, ttl, ttl-2*(ttl/3))
	}
	pool, err := newPool(ctx, dsn, "pgfence run", runPoolMaxConns)
	if err != nil {
		var uerr *usageError
		if errors.As(err, &uerr) {
			return err
		}
		return exitWith(ExitRunFailure, err)
	}
	logger := a.logger()
	events := newRunEvents()
	locker, err := leasetable.New(ctx, pool, &leasetable.Config{
		Observer:     events,
		Schema:       o.schema,
		TTL:          ttl,
		SafetyMargin: margin,
		Owner:        runOwner(o.argv[0]),
		Logger:       logger,
	})
	if err != nil {
		pool.Close()
		return exitWith(ExitRunFailure, explainSchemaError(err, o.schema))
	}
	defer a.closeBounded(locker, pool)

	if o.every != 0 || o.slot != "" {
		return a.runSlot(ctx, pool, locker, &o, sigs, grace, events, logger, ttl)
	}
	lease, err := a.acquireForRun(ctx, locker, &o, sigs)
	if err != nil {
		return err
	}
	sup, err := supervisorArgv()
	if err != nil {
		_ = a.releaseAfterRun(lease, false)
		return exitWith(ExitRunFailure, err)
	}
	// Release notifications name a lease by a tag keyed with the
	// install's notification key; leasetable.New has just read it too.
	nkey, err := notifier.LoadKey(ctx, pool, pgx.Identifier{o.schema}.Sanitize())
	if err != nil {
		_ = a.releaseAfterRun(lease, false)
		return exitWith(ExitRunFailure, err)
	}
	stopWatch := watchForLoss(pool, lease, nkey, logger, ttl)
	status := a.superviseUnderLease(lease, o.argv, sigs, grace, o.maxHold, sup, stopWatch, events)
	if status != ExitOK {
		return exitWith(status, nil)
	}
	return nil
}

// lostEventWait bounds the wait for the Lost event of a lease whose loss
// has been seen (its Done closed): the event is queued as the lease ends
// and delivered by the Locker's own goroutine, at once unless the machine
// is starved; without it the loss is reported from Lease.Err alone.
const lostEventWait = 2 * time.Second

// runEvents is run's Observer: it keeps the Lost event of run's lease, for
// the report of the loss.
type runEvents struct {
	lostCh chan pgfence.Lost
	wait   time.Duration // how long lost waits for the event
}

func newRunEvents() *runEvents {
	return &runEvents{lostCh: make(chan pgfence.Lost, 1), wait: lostEventWait}
}

func (r *runEvents) Observe(_ context.Context, e pgfence.Event) {
	if l, ok := e.(pgfence.Lost); ok {
		select {
		case r.lostCh <- l:
		default: // run holds one lease: a second loss cannot be its own
		}
	}
}

// lost returns the Lost event of lease, waiting for it at most r.wait; a
// nil r has none.
func (r *runEvents) lost(lease pgfence.Lease) (pgfence.Lost, bool) {
	if r == nil {
		return pgfence.Lost{}, false
	}
	t := time.NewTimer(r.wait)
	defer t.Stop()
	select {
	case ev := <-r.lostCh:
		return ev, ev.Name == lease.Name() && ev.Token == lease.Token()
	case <-t.C:
		return pgfence.Lost{}, false
	}
}

// cleanupTimeout bounds closing the Locker and the pool once the command
// has ended and the release was tried: a statement blocked in the database
// (a renewal behind a table lock) must not keep pgfence from exiting. What
// is still open is then closed by the process's exit.
const cleanupTimeout = 2 * time.Second

// closeBounded closes locker, then pool, giving up after cleanupTimeout.
func (a *App) closeBounded(locker *leasetable.Locker, pool *pgxpool.Pool) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		locker.Close()
		pool.Close()
	}()
	t := time.NewTimer(cleanupTimeout)
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
		a.say(context.Background(), slog.LevelWarn, fmt.Sprintf("closing the database connections took longer than %v; exiting without waiting", cleanupTimeout))
	}
}

// lossInterestSQL takes the lease's interest key ($1, $2) shared, waiting
// for a release that holds it exclusively to commit.
const lossInterestSQL = `SELECT pg_catalog.pg_advisory_lock_shared($1::pg_catalog.int4, $2::pg_catalog.int4)`

// lossCheckTimeout bounds the renewal that checks the lease after a
// notification names it.
const lossCheckTimeout = 5 * time.Second

// watchForLoss makes a loss of lease stop the command within about a round
// trip of its notification, not at the next scheduled renewal (TTL/3
// later): it LISTENs on leasetable.NotifyChannel on a connection of its
// own, holding the lease's interest key so that releases notify it, and
// when a notification names the lease (a force release frees it and
// notifies: its payload, checked with key, carries the name's tag), or
// the connection starts listening (one may have been missed), it renews
// the lease at once. If the database no longer holds the
// lease for this token the renewal fails and the lease's Done channel
// closes, which ends the command. Renewals are one at a time; a check that
// fails for another reason leaves the lease to the watchdog. The returned
// function stops the watch and waits for it, boundedly.
func watchForLoss(pool *pgxpool.Pool, lease pgfence.Lease, key notifier.Key, logger *slog.Logger, ttl time.Duration) (stop func()) {
	if os.Getenv(envNoLossWatch) == "1" {
		return func() {}
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	var busy atomic.Bool
	tag := key.Tag(lease.Name())
	check := func() {
		if !busy.CompareAndSwap(false, true) {
			return
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer busy.Store(false)
			rctx, rcancel := context.WithTimeout(ctx, lossCheckTimeout)
			defer rcancel()
			_ = lease.Renew(rctx) // a loss closes lease.Done(); other errors: the watchdog retries
		}()
	}
	notifier.Start(ctx, notifier.Config{
		ConnConfig:    pool.Config().ConnConfig,
		Channel:       leasetable.NotifyChannel,
		CheckInterval: max(ttl/3, time.Second),
		CheckTimeout:  min(max(ttl/3, time.Second), lossCheckTimeout),
		Logger:        logger,
		LogPrefix:     "lease watch",
		Notify: func(payload string) {
			if t, _, ok := key.Verify(payload); ok && t == tag {
				check()
			}
		},
		// Releases notify only names someone waits for: the watch holds its
		// lease's interest key, before Listening's check.
		Apply: func(ctx context.Context, conn *pgx.Conn) (time.Duration, error) {
			_, err := conn.Exec(ctx, lossInterestSQL, leasetable.InterestClassID, key.InterestID(lease.Name()))
			return 0, err
		},
		Listening: check,
	}, &wg)
	return func() {
		cancel()
		done := make(chan struct{})
		go func() { wg.Wait(); close(done) }()
		t := time.NewTimer(cleanupTimeout)
		defer t.Stop()
		select {
		case <-done:
		case <-t.C:
		}
	}
}

// acquireForRun takes the lease as o asks: TryAcquire with --no-wait, else
// Acquire, bounded by --wait if given. A signal from sigs ends the wait.
// The errors carry run's exit codes.
func (a *App) acquireForRun(ctx context.Context, locker *leasetable.Locker, o *runOptions, sigs <-chan os.Signal) (pgfence.Lease, error) {
	opts := &pgfence.AcquireOpts{AtLeast: o.atLeast, WaitTimeout: o.wait, MaxHold: o.maxHold}
	return waitToRun(ctx, o, sigs, fmt.Sprintf("lease %q", o.name),
		func(actx context.Context) (pgfence.Lease, error) {
			switch {
			case o.permits > 0 && o.noWait:
				return locker.TryAcquirePermit(actx, o.name, o.permits, opts)
			case o.permits > 0:
				return locker.AcquirePermit(actx, o.name, o.permits, opts)
			case o.noWait:
				return locker.TryAcquire(actx, o.name, opts)
			default:
				return locker.Acquire(actx, o.name, opts)
			}
		},
		func(lease pgfence.Lease) {
			if lease != nil {
				_ = lease.Release(ctx)
			}
		},
		func(err error) (describe func() error) {
			if !errors.Is(err, pgfence.ErrNotAcquired) {
				return nil
			}
			return func() error { return a.conflict(ctx, locker, o) }
		})
}

// waitToRun is the wait that acquireForRun and beginSlot share: it runs
// take (which may wait) under a context that a signal from sigs cancels,
// and turns take's outcome into run's exit codes. what names what is
// waited for in the messages ("lease \"x\""). On a signal, undo gives
// back whatever take returned (it may be nil) and the error exits
// 128+signal. conflict returns nil unless take's error means another owner
// has it (or had it: a slot done); then it returns what describes the
// conflict, called only without --quiet (it may query the database), and
// the error exits o.conflictExit. ctx ending (the first SIGINT or SIGTERM
// reaching Main) and any other error exit ExitRunFailure.
func waitToRun[T any](ctx context.Context, o *runOptions, sigs <-chan os.Signal, what string,
	take func(context.Context) (T, error), undo func(T), conflict func(err error) (describe func() error)) (T, error) {
	var zero T
	actx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop, stopped := make(chan struct{}), make(chan struct{})
	var caught os.Signal
	go func() {
		defer close(stopped)
		select {
		case caught = <-sigs:
			cancel()
		case <-stop:
		}
	}()
	got, err := take(actx)
	close(stop)
	<-stopped

	if s, ok := caught.(syscall.Signal); ok {
		undo(got)
		return zero, exitWith(128+int(s), fmt.Errorf("interrupted by %s while waiting for %s; the command was not run", signalName(s), what))
	}
	if err == nil {
		return got, nil
	}
	if describe := conflict(err); describe != nil {
		if o.quiet {
			return zero, exitWith(o.conflictExit, nil)
		}
		return zero, exitWith(o.conflictExit, describe())
	}
	if ctx.Err() != nil {
		return zero, exitWith(ExitRunFailure, fmt.Errorf("interrupted while waiting for %s; the command was not run", what))
	}
	return zero, exitWith(ExitRunFailure, explainSchemaError(err, o.schema))
}

// signalName names the signals run stops waiting on: "SIGINT", not
// "interrupt".
func signalName(s syscall.Signal) string {
	switch s {
	case syscall.SIGINT:
		return "SIGINT"
	case syscall.SIGTERM:
		return "SIGTERM"
	case syscall.SIGHUP:
		return "SIGHUP"
	}
	return fmt.Sprintf("signal %d", int(s))
}

// conflict describes who holds the lease that could not be acquired.
func (a *App) conflict(ctx context.Context, locker *leasetable.Locker, o *runOptions) error {
	how := "is held by another owner"
	if !o.noWait && o.wait > 0 {
		how = fmt.Sprintf("was not acquired within %v", o.wait)
	}
	if o.permits > 0 {
		how = "are held"
		if !o.noWait && o.wait > 0 {
			how = fmt.Sprintf("stayed held for %v", o.wait)
		}
		return fmt.Errorf("all %d permits of semaphore %q %s; the command was not run", o.permits, o.name, how)
	}
	gctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	info, ok, err := locker.Get(gctx, o.name)
	if err != nil || !ok {
		return fmt.Errorf("lease %q %s; the command was not run", o.name, how)
	}
	return fmt.Errorf("lease %q %s (holder %q, token %d, expires %s); the command was not run",
		o.name, how, info.Owner, info.Token, info.ExpiresAt.Local().Format(time.RFC3339))
}

// runOwner is the owner id run writes into the lease row, for operators
// reading 'pgfence ls': "pgfence run COMMAND on HOST (pid PID)".
func runOwner(command string) string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "unknown-host"
	}
	// A command or host name that is too long, not UTF-8 or holds a
	// control character (a file named with a newline) is left out: the
	// table refuses such an owner.
	valid := func(o string) bool { return leasename.Check(o, leasetable.MaxNameLength) == nil }
	owner := fmt.Sprintf("pgfence run %s on %s (pid %d)", filepath.Base(command), host, os.Getpid())
	if !valid(owner) {
		owner = fmt.Sprintf("pgfence run on %s (pid %d)", host, os.Getpid())
	}
	if !valid(owner) {
		owner = fmt.Sprintf("pgfence run (pid %d)", os.Getpid())
	}
	return owner
}
