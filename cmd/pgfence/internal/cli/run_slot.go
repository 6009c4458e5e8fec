package cli

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence"
	"github.com/pgfence/pgfence/internal/notifier"
	"github.com/pgfence/pgfence/leasetable"
	"github.com/pgfence/pgfence/schedule"
)

// EnvSlot names, for a command run with --every or --slot, the slot's key.
const EnvSlot = "PGFENCE_SLOT"

// checkSlotFlags checks --every and --slot, and the job name they need.
func checkSlotFlags(o *runOptions, name string, f *flags) error {
	switch {
	case o.every == 0 && !f.set("", "slot") && !f.set("", "every"):
		return nil
	case f.set("", "every") && f.set("", "slot"):
		return usageErrorf("--every and --slot exclude each other")
	case f.set("", "every") && (o.every < time.Millisecond || o.every%time.Millisecond != 0):
		return usageErrorf("--every must be a whole number of milliseconds, at least 1ms, not %v", o.every)
	case f.set("", "slot") && o.slot == "":
		return usageErrorf("the slot key is empty")
	case len(o.slot) > schedule.MaxNameLength:
		return usageErrorf("the slot key is %d bytes long; at most %d are allowed", len(o.slot), schedule.MaxNameLength)
	case len(name) > schedule.MaxNameLength:
		return usageErrorf("the job name is %d bytes long; at most %d are allowed with --every or --slot", len(name), schedule.MaxNameLength)
	case o.slot != "" && checkName(o.slot) != nil:
		return usageErrorf("the slot key %q is not valid UTF-8 or holds a control character", o.slot)
	}
	return nil
}

// slotLease is the slot's lease as superviseUnderLease sees it: Release
// does nothing, since the slot's Finish records the outcome and then
// releases it.
type slotLease struct{ pgfence.Lease }

func (slotLease) Release(context.Context) error { return nil }

// runSlot is run with --every or --slot: it starts the slot under the
// job's lease (or exits with the conflict code when it is done), runs the
// command as run does, and records the slot done when it exits 0, failed
// otherwise.
func (a *App) runSlot(ctx context.Context, pool *pgxpool.Pool, locker *leasetable.Locker, o *runOptions, sigs <-chan os.Signal,
	grace time.Duration, events *runEvents, logger *slog.Logger, ttl time.Duration) error {
	runner, err := schedule.New(pool, &schedule.Config{Locker: locker, MaxHold: o.maxHold, Logger: logger})
	if err != nil {
		return exitWith(ExitRunFailure, err)
	}
	key := o.slot
	if o.every != 0 {
		if key, err = runner.Current(ctx, o.every); err != nil {
			return exitWith(ExitRunFailure, err)
		}
	}
	s, err := a.beginSlot(ctx, runner, o, key, sigs)
	if err != nil {
		return err
	}
	sup, err := supervisorArgv()
	if err == nil {
		var nkey notifier.Key
		if nkey, err = notifier.LoadKey(ctx, pool, pgx.Identifier{o.schema}.Sanitize()); err == nil {
			if err = os.Setenv(EnvSlot, key); err == nil {
				stopWatch := watchForLoss(pool, s.Lease(), nkey, logger, ttl)
				maxHold := o.maxHold
				if maxHold == 0 {
					maxHold = schedule.DefaultMaxHold
				}
				status := a.superviseUnderLease(slotLease{s.Lease()}, o.argv, sigs, grace, maxHold, sup, stopWatch, events)
				return a.finishSlot(ctx, s, status)
			}
		}
	}
	_ = s.Finish(ctx, err)
	return exitWith(ExitRunFailure, err)
}

// finishSlot records the slot's outcome from the command's exit status and
// returns run's error for it.
func (a *App) finishSlot(ctx context.Context, s *schedule.Slot, status int) error {
	var runErr error
	if status != ExitOK {
		runErr = fmt.Errorf("the command's exit status was %d", status)
	}
	ferr := s.Finish(ctx, runErr)
	if status != ExitOK {
		return exitWith(status, nil)
	}
	if ferr != nil {
		a.say(ctx, slog.LevelError, fmt.Sprintf("the command ended (exit status 0), but slot %q of job %q could not be recorded done: %v",
			s.Key(), s.Job(), ferr), slog.Int("exit_code", ExitLeaseLost))
		if errors.Is(ferr, pgfence.ErrLeaseLost) {
			return exitWith(ExitLeaseLost, nil)
		}
		return exitWith(ExitRunFailure, nil)
	}
	return nil
}

// beginSlot starts the slot as o asks (--no-wait, --wait), ending the wait
// on a signal from sigs. The errors carry run's exit codes.
func (a *App) beginSlot(ctx context.Context, runner *schedule.Runner, o *runOptions, key string, sigs <-chan os.Signal) (*schedule.Slot, error) {
	return waitToRun(ctx, o, sigs, fmt.Sprintf("slot %q of job %q", key, o.name),
		func(actx context.Context) (*schedule.Slot, error) {
			return runner.Begin(actx, o.name, key, &schedule.RunOpts{NoWait: o.noWait, WaitTimeout: o.wait})
		},
		func(s *schedule.Slot) {
			if s != nil {
				_ = s.Finish(ctx, errors.New("interrupted"))
			}
		},
		func(err error) (describe func() error) {
			var done *schedule.DoneError
			switch {
			case errors.As(err, &done):
				return func() error {
					return fmt.Errorf("slot %q of job %q is done (by %q, token %d, at %s); the command was not run",
						key, o.name, done.Owner, done.Token, done.FinishedAt.Local().Format(time.RFC3339))
				}
			case errors.Is(err, pgfence.ErrNotAcquired):
				return func() error {
					return fmt.Errorf("slot %q of job %q is being run by another owner; the command was not run: %w", key, o.name, err)
				}
			}
			return nil
		})
}
