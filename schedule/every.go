package schedule

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgfence/pgfence"
)

// nowSQL reads the database clock.
const nowSQL = `SELECT pg_catalog.now()`

// Now returns the database's clock.
func (r *Runner) Now(ctx context.Context) (time.Time, error) {
	var now time.Time
	if err := r.pool.QueryRow(ctx, nowSQL).Scan(&now); err != nil {
		return time.Time{}, fmt.Errorf("pgfence: schedule: read the database clock: %w", err)
	}
	return now, nil
}

// SlotStart returns the start of the slot of length every that t falls in:
// slots are aligned on the Unix epoch, so a minute's slots begin at :00.
func SlotStart(t time.Time, every time.Duration) time.Time {
	us, e := t.UnixMicro(), every.Microseconds()
	b := us / e * e
	if us < 0 && us%e != 0 {
		b -= e
	}
	return time.UnixMicro(b).UTC()
}

// SlotKey returns the key of the slot of length every that starts at
// start: its UTC time in RFC 3339 form, as in "2026-01-02T15:04:00Z", with
// milliseconds when every is not a whole number of seconds. Keys of one
// length sort as their times do.
func SlotKey(start time.Time, every time.Duration) string {
	if every%time.Second == 0 {
		return start.UTC().Format("2006-01-02T15:04:05Z07:00")
	}
	return start.UTC().Format("2006-01-02T15:04:05.000Z07:00")
}

// Current returns the key of the slot of length every that the database's
// clock is in now; the clocks of the callers play no part.
func (r *Runner) Current(ctx context.Context, every time.Duration) (string, error) {
	if err := checkEvery(every); err != nil {
		return "", err
	}
	now, err := r.Now(ctx)
	if err != nil {
		return "", err
	}
	return SlotKey(SlotStart(now, every), every), nil
}

func checkEvery(every time.Duration) error {
	if every < time.Millisecond || every%time.Millisecond != 0 {
		return fmt.Errorf("pgfence: schedule: the interval is %v; it must be a whole number of milliseconds, at least 1ms", every)
	}
	return nil
}

// Every runs fn once per slot of length every, on the database clock, until
// ctx ends: at each slot's start (timed from the database's now, measured
// on the local monotonic clock) it runs the slot as [Runner.Run] does, and
// first, oldest first, up to Config.CatchUp slots passed since the last one
// seen through (one whose run could not be recorded, missed while the
// database was unreachable, or, when Every starts, since the job's newest
// recorded slot). Every replica may call Every for
// the same job: each slot runs once. Errors are logged and observed, not
// returned; Every returns ctx's cause.
func (r *Runner) Every(ctx context.Context, job string, every time.Duration, opts *RunOpts, fn func(ctx context.Context, s *Slot) error) error {
	return r.every(ctx, job, every, opts, fn, nil)
}

// EveryTx is [Runner.Every] running each slot as [Runner.RunTx] does.
func (r *Runner) EveryTx(ctx context.Context, job string, every time.Duration, opts *RunOpts, fn func(ctx context.Context, tx pgx.Tx, s *Slot) error) error {
	return r.every(ctx, job, every, opts, nil, fn)
}

func (r *Runner) every(ctx context.Context, job string, every time.Duration, opts *RunOpts, fn func(context.Context, *Slot) error,
	txFn func(context.Context, pgx.Tx, *Slot) error) error {
	if err := checkEvery(every); err != nil {
		return err
	}
	if err := checkName("job name", job); err != nil {
		return err
	}
	retry := min(every, time.Second)
	var last time.Time // the newest slot seen through, by this call or (at first) by the job's record
	resumed := false
	for {
		if !resumed {
			l, err := r.resumeFrom(ctx, job, every)
			if err == nil {
				last, resumed = l, true
			} else if ctx.Err() != nil {
				return context.Cause(ctx)
			}
		}
		now, err := r.Now(ctx)
		read := time.Now()
		if err != nil {
			if ctx.Err() != nil {
				return context.Cause(ctx)
			}
			r.cfg.Logger.WarnContext(ctx, "pgfence: schedule: database clock unreadable", "job", job, "error", err)
			if err := sleep(ctx, retry); err != nil {
				return err
			}
			continue
		}
		cur := SlotStart(now, every)
		from := cur
		if !last.IsZero() {
			from = last.Add(every)
			if n := int(cur.Sub(from)/every) + 1; n > r.cfg.CatchUp {
				from = cur.Add(-every * time.Duration(r.cfg.CatchUp-1))
				r.cfg.Logger.WarnContext(ctx, "pgfence: schedule: slots passed beyond CatchUp are not run", "job", job,
					"from", SlotKey(last.Add(every), every), "count", n-r.cfg.CatchUp)
			}
		}
		wait := cur.Add(every).Sub(now)
		for s := from; !s.After(cur); s = s.Add(every) {
			key := SlotKey(s, every)
			out, err := r.run(ctx, job, key, opts, fn, txFn)
			if ctx.Err() != nil {
				return context.Cause(ctx)
			}
			if out == notRun {
				if !errors.Is(err, pgfence.ErrNotAcquired) {
					r.cfg.Logger.WarnContext(ctx, "pgfence: schedule: slot not run; trying again", "job", job, "slot", key, "error", err)
				}
				wait = retry
				break
			}
			last = s
		}
		if err := sleep(ctx, max(wait-time.Since(read), time.Millisecond)); err != nil {
			return err
		}
	}
}

// resumeFrom returns the slot to resume after: job's newest slot record of
// this interval when it is done, the one before when it is running or
// failed (so that it is run again); zero when the job has no such record.
func (r *Runner) resumeFrom(ctx context.Context, job string, every time.Duration) (time.Time, error) {
	recs, err := r.History(ctx, job, 1)
	if err != nil || len(recs) == 0 {
		return time.Time{}, err
	}
	at, err := time.Parse(time.RFC3339Nano, recs[0].Slot)
	if err != nil || SlotKey(at, every) != recs[0].Slot {
		return time.Time{}, nil
	}
	if recs[0].State != "done" {
		at = at.Add(-every)
	}
	return at, nil
}

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}
