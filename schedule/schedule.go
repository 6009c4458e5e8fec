package schedule

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence"
	"github.com/pgfence/pgfence/fence"
	"github.com/pgfence/pgfence/internal/hold"
	"github.com/pgfence/pgfence/internal/leasename"
	"github.com/pgfence/pgfence/leasetable"
)

// LeasePrefix is prepended to a job's name to name the lease its slots run
// under.
const LeasePrefix = "pgfence:schedule:"

// MaxNameLength is the longest job name, and slot key, in bytes.
const MaxNameLength = 256

// DefaultMaxHold is the default of [Config].MaxHold.
const DefaultMaxHold = time.Hour

// DefaultCatchUp is the default of [Config].CatchUp.
const DefaultCatchUp = 10

// finishTimeout bounds recording a slot's outcome and releasing its lease
// after fn returned, whatever fn's ctx says.
const finishTimeout = 10 * time.Second

// ErrSlotDone is matched by the error of a run that was skipped because
// the slot is done: a [*DoneError].
var ErrSlotDone = errors.New("pgfence: schedule: slot is done")

// DoneError is a run skipped because the slot was done by Owner with Token.
// It matches [ErrSlotDone].
type DoneError struct {
	Job, Slot  string
	Owner      string
	Token      int64
	FinishedAt time.Time
}

// Error names the slot and who did it.
func (e *DoneError) Error() string {
	return fmt.Sprintf("pgfence: schedule: slot %q of job %q is done (by %q, token %d)", e.Slot, e.Job, e.Owner, e.Token)
}

// Is reports whether target is ErrSlotDone.
func (e *DoneError) Is(target error) bool { return target == ErrSlotDone }

// Config configures a [Runner]. A nil *Config is invalid: Locker is
// required.
type Config struct {
	// Locker takes the jobs' leases; its Schema, Owner and TTL are the
	// Runner's. Required.
	Locker *leasetable.Locker
	// MaxHold bounds a slot's run: its lease is released then and fn's ctx
	// ends with cause [pgfence.ErrMaxHold]. Zero means [DefaultMaxHold].
	MaxHold time.Duration
	// CatchUp is how many slots [Runner.Every] runs, oldest first, when it
	// finds slots passed since the last one it ran. Zero means
	// [DefaultCatchUp].
	CatchUp int
	// Logger receives retries, failures and slots not run. Nil means
	// silent.
	Logger *slog.Logger
	// Observer receives [pgfence.SlotDone], [pgfence.SlotFailed],
	// [pgfence.SlotSkipped] and [pgfence.SlotRetried], on the caller's
	// goroutine.
	Observer pgfence.Observer
}

// Runner runs jobs at most once per slot across every process that shares
// the database. Its methods are safe for concurrent use.
type Runner struct {
	pool   *pgxpool.Pool
	locker *leasetable.Locker
	cfg    Config
	sql    statements

	nDone, nFailed, nSkipped, nRetried atomic.Uint64
}

// Stats counts a Runner's slots since it was made: recorded done, failed
// (fn's error, or an outcome that could not be recorded), skipped as done,
// and run again after a holder died, lost its lease or failed.
type Stats struct {
	Done, Failed, Skipped, Retried uint64
}

// Stats returns the Runner's counters.
func (r *Runner) Stats() Stats {
	return Stats{Done: r.nDone.Load(), Failed: r.nFailed.Load(), Skipped: r.nSkipped.Load(), Retried: r.nRetried.Load()}
}

type statements struct {
	begin, finish, done, prune string
}

// New returns a Runner using pool for its statements and cfg.Locker for its
// leases. It checks cfg only; the Locker checked the schema.
func New(pool *pgxpool.Pool, cfg *Config) (*Runner, error) {
	if pool == nil {
		return nil, errors.New("pgfence: schedule: pool is nil")
	}
	if cfg == nil || cfg.Locker == nil {
		return nil, errors.New("pgfence: schedule: Config.Locker is required")
	}
	c := *cfg
	switch {
	case c.MaxHold < 0:
		return nil, fmt.Errorf("pgfence: schedule: Config.MaxHold is %v; it must not be negative", c.MaxHold)
	case c.CatchUp < 0:
		return nil, fmt.Errorf("pgfence: schedule: Config.CatchUp is %d; it must not be negative", c.CatchUp)
	}
	if c.MaxHold == 0 {
		c.MaxHold = DefaultMaxHold
	}
	if c.CatchUp == 0 {
		c.CatchUp = DefaultCatchUp
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	s := pgx.Identifier{c.Locker.Schema()}.Sanitize()
	return &Runner{pool: pool, locker: c.Locker, cfg: c, sql: statements{
		begin:  `SELECT outcome, attempts, prev_state, prev_owner, prev_token, prev_finished_at FROM ` + s + `.pgfence_slot_begin($1, $2, $3, $4)`,
		finish: `SELECT ` + s + `.pgfence_slot_finish($1, $2, $3, $4, $5, $6)`,
		done: `SELECT d.owner, d.token, d.finished_at FROM ` + s + `.pgfence_slots d
			WHERE d.job OPERATOR(pg_catalog.=) $1 AND d.slot OPERATOR(pg_catalog.=) $2 AND d.state OPERATOR(pg_catalog.=) 'done'`,
		prune: `SELECT ` + s + `.pgfence_slots_prune($1 * interval '1 microsecond')`,
	}}, nil
}

// RunOpts are a run's options; nil means the defaults.
type RunOpts struct {
	// NoWait returns [pgfence.ErrNotAcquired] at once when another holder
	// runs a slot of the job; otherwise the run waits for it.
	NoWait bool
	// WaitTimeout bounds the wait; zero: only ctx does.
	WaitTimeout time.Duration
}

// Slot is a slot being run: its job, key and attempt, and the lease it
// runs under.
type Slot struct {
	r       *Runner
	job     string
	key     string
	attempt int
	lease   *leasetable.Lease
	started time.Time
	ended   bool
}

// Job returns the job's name.
func (s *Slot) Job() string { return s.job }

// Key returns the slot's key.
func (s *Slot) Key() string { return s.key }

// Attempt counts the slot's runs from 1, this one included.
func (s *Slot) Attempt() int { return s.attempt }

// Lease returns the lease the slot runs under: its Token and Secret fence
// the job's writes (package fence).
func (s *Slot) Lease() *leasetable.Lease { return s.lease }

func (s *Slot) ev() pgfence.Slot { return pgfence.Slot{Job: s.job, Key: s.key, Token: s.lease.Token()} }

// Run runs fn for (job, slot) unless the slot is done: it takes the job's
// lease (waiting as opts say), starts the slot, calls fn, and records the
// slot done if fn returns nil, failed otherwise, then releases the lease.
// fn's ctx ends with cause [pgfence.ErrLeaseLost] when the lease is lost.
// A slot left running by a holder that died is run again; a done slot never.
//
// Run returns a [*DoneError] (matching [ErrSlotDone]) when the slot is done;
// the lease's errors ([pgfence.ErrNotAcquired], ctx's cause); otherwise fn's
// error, joined with one matching [pgfence.ErrLeaseLost] and
// [pgfence.ErrFenced] when the outcome could not be recorded because the
// lease was lost.
func (r *Runner) Run(ctx context.Context, job, slot string, opts *RunOpts, fn func(ctx context.Context, s *Slot) error) error {
	_, err := r.run(ctx, job, slot, opts, fn, nil)
	return err
}

// RunTx is [Runner.Run] with fn's writes and the slot's done record in one
// transaction: the slot is done exactly when fn's writes commit, and a
// holder that lost its lease cannot commit them. The transaction has the
// lease's token presented (fence.Present) for strict-guarded tables. fn
// must not commit or roll back tx. The errors are Run's, and the commit's.
func (r *Runner) RunTx(ctx context.Context, job, slot string, opts *RunOpts, fn func(ctx context.Context, tx pgx.Tx, s *Slot) error) error {
	_, err := r.run(ctx, job, slot, opts, nil, fn)
	return err
}

// outcome is how a run ended, for Every.
type outcome int

const (
	notRun  outcome = iota // the slot's fate is unknown to this call
	skipped                // done already
	ran                    // recorded done or failed
)

func (r *Runner) run(ctx context.Context, job, key string, opts *RunOpts, fn func(context.Context, *Slot) error,
	txFn func(context.Context, pgx.Tx, *Slot) error) (outcome, error) {
	s, err := r.Begin(ctx, job, key, opts)
	if errors.Is(err, ErrSlotDone) {
		return skipped, err
	}
	if err != nil {
		return notRun, err
	}
	fctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	stop := context.AfterFunc(s.lease.Context(), func() { cancel(context.Cause(s.lease.Context())) })
	defer stop()

	defer func() {
		if p := recover(); p != nil {
			if !s.ended {
				_, _ = s.finish(ctx, fmt.Errorf("panic: %v", p), nil)
			}
			panic(p)
		}
	}()
	if fn != nil {
		return s.finish(ctx, fn(fctx, s), nil)
	}
	tx, err := r.pool.Begin(fctx)
	if err != nil {
		return s.finish(ctx, err, nil)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	if err = fence.Present(fctx, tx, s.lease.Token()); err == nil {
		err = txFn(fctx, tx, s)
	}
	if err != nil {
		_ = tx.Rollback(context.WithoutCancel(ctx))
		return s.finish(ctx, err, nil)
	}
	return s.finish(ctx, nil, tx)
}

// Begin takes the job's lease, waiting as opts say, and starts the slot
// under it; [Slot.Finish] records its outcome and releases the lease. It is
// the step-by-step form of [Runner.Run], for a job run by another process
// (pgfence run --every). It returns Run's errors.
func (r *Runner) Begin(ctx context.Context, job, key string, opts *RunOpts) (*Slot, error) {
	if err := checkName("job name", job); err != nil {
		return nil, err
	}
	if err := checkName("slot key", key); err != nil {
		return nil, err
	}
	if opts == nil {
		opts = &RunOpts{}
	}
	// A done slot stays done: no lease is needed to see it.
	var done DoneError
	err := r.pool.QueryRow(ctx, r.sql.done, job, key).Scan(&done.Owner, &done.Token, &done.FinishedAt)
	if err == nil {
		done.Job, done.Slot = job, key
		r.nSkipped.Add(1)
		r.observe(ctx, pgfence.SlotSkipped{Slot: pgfence.Slot{Job: job, Key: key}, DoneBy: done.Owner, DoneToken: done.Token})
		return nil, &done
	}
	if !errors.Is(err, pgx.ErrNoRows) {
		return nil, fmt.Errorf("pgfence: schedule: read slot %q of job %q: %w", key, job, err)
	}
	aopts := &pgfence.AcquireOpts{MaxHold: r.cfg.MaxHold, WaitTimeout: opts.WaitTimeout}
	var l pgfence.Lease
	if opts.NoWait {
		l, err = r.locker.TryAcquire(ctx, LeasePrefix+job, aopts)
	} else {
		l, err = r.locker.Acquire(ctx, LeasePrefix+job, aopts)
	}
	if err != nil {
		return nil, fmt.Errorf("pgfence: schedule: job %q: %w", job, err)
	}
	lease := l.(*leasetable.Lease)
	s := &Slot{r: r, job: job, key: key, lease: lease, started: time.Now()}
	var (
		res                  string
		attempts             *int32
		prevState, prevOwner *string
		prevToken            *int64
		prevFinished         *time.Time
	)
	err = r.pool.QueryRow(ctx, r.sql.begin, job, key, lease.Token(), lease.Secret()).
		Scan(&res, &attempts, &prevState, &prevOwner, &prevToken, &prevFinished)
	if err == nil && res != "lost" && attempts == nil {
		err = fmt.Errorf("pgfence_slot_begin returned %q without attempts", res)
	}
	if err != nil {
		s.release(ctx)
		return nil, fmt.Errorf("pgfence: schedule: start slot %q of job %q: %w", key, job, err)
	}
	switch res {
	case "run", "retry":
		s.attempt = int(*attempts)
		if res == "retry" {
			r.nRetried.Add(1)
			ev := pgfence.SlotRetried{Slot: s.ev(), Attempt: s.attempt, PrevState: deref(prevState), PrevOwner: deref(prevOwner), PrevToken: deref(prevToken)}
			r.cfg.Logger.WarnContext(ctx, "pgfence: schedule: slot run again", "job", job, "slot", key, "token", lease.Token(),
				"attempt", s.attempt, "prev_state", ev.PrevState, "prev_owner", ev.PrevOwner, "prev_token", ev.PrevToken)
			r.observe(ctx, ev)
		}
		return s, nil
	case "done":
		r.nSkipped.Add(1)
		s.release(ctx)
		e := &DoneError{Job: job, Slot: key, Owner: deref(prevOwner), Token: deref(prevToken), FinishedAt: deref(prevFinished)}
		r.observe(ctx, pgfence.SlotSkipped{Slot: s.ev(), DoneBy: e.Owner, DoneToken: e.Token})
		return nil, e
	case "fenced":
		s.release(ctx)
		return nil, fmt.Errorf("pgfence: schedule: slot %q of job %q was started by newer token %d (this lease's is %d): %w",
			key, job, deref(prevToken), lease.Token(), pgfence.ErrFenced)
	default: // lost
		s.release(ctx)
		return nil, fmt.Errorf("pgfence: schedule: slot %q of job %q not started: %w", key, job,
			&fence.LeaseLostError{Lease: lease.Name(), Presented: lease.Token()})
	}
}

// Finish records the slot done when runErr is nil, failed otherwise, and
// releases its lease. It returns runErr joined with an error matching
// [pgfence.ErrLeaseLost] and [pgfence.ErrFenced] when the outcome could not
// be recorded because the lease was lost (the slot stays running and is run
// again), or with the statement's error. A second call returns an error.
func (s *Slot) Finish(ctx context.Context, runErr error) error {
	_, err := s.finish(ctx, runErr, nil)
	return err
}

// finish records the outcome (in tx when not nil, and commits it), releases
// the lease, and reports the run.
func (s *Slot) finish(ctx context.Context, runErr error, tx pgx.Tx) (outcome, error) {
	if s.ended {
		return notRun, fmt.Errorf("pgfence: schedule: slot %q of job %q already finished", s.key, s.job)
	}
	s.ended = true
	fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), finishTimeout)
	defer cancel()
	state, msg := "done", ""
	if runErr != nil {
		state, msg = "failed", runErr.Error()
	}
	var recorded bool
	var err error
	if tx != nil {
		err = tx.QueryRow(fctx, s.r.sql.finish, s.job, s.key, s.lease.Token(), s.lease.Secret(), state, nil).Scan(&recorded)
		if err == nil && recorded {
			err = tx.Commit(fctx)
		}
	} else {
		err = s.r.pool.QueryRow(fctx, s.r.sql.finish, s.job, s.key, s.lease.Token(), s.lease.Secret(), state, msg).Scan(&recorded)
	}
	if err == nil && !recorded {
		err = &fence.LeaseLostError{Lease: s.lease.Name(), Presented: s.lease.Token()}
	}
	if err != nil {
		err = fmt.Errorf("pgfence: schedule: record slot %q of job %q %s: %w", s.key, s.job, state, err)
	}
	s.release(ctx)

	took := time.Since(s.started)
	out := ran
	if err != nil {
		out = notRun
	}
	switch {
	case runErr == nil && err == nil:
		s.r.nDone.Add(1)
		s.r.observe(ctx, pgfence.SlotDone{Slot: s.ev(), Attempt: s.attempt, Duration: took})
		return out, nil
	default:
		all := hold.Join(runErr, err) // one line in logs
		s.r.nFailed.Add(1)
		s.r.cfg.Logger.WarnContext(ctx, "pgfence: schedule: slot failed", "job", s.job, "slot", s.key,
			"token", s.lease.Token(), "attempt", s.attempt, "recorded", err == nil, "error", all)
		s.r.observe(ctx, pgfence.SlotFailed{Slot: s.ev(), Attempt: s.attempt, Duration: took, Err: all})
		return out, all
	}
}

// release gives the lease back, bounded, whatever ctx says.
func (s *Slot) release(ctx context.Context) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), finishTimeout)
	defer cancel()
	_ = s.lease.Release(rctx)
}

func (r *Runner) observe(ctx context.Context, e pgfence.Event) {
	if r.cfg.Observer != nil {
		r.cfg.Observer.Observe(ctx, e)
	}
}

func deref[T any](p *T) T {
	var zero T
	if p == nil {
		return zero
	}
	return *p
}

// checkName rejects, before anything is sent, what the table would.
func checkName(what, v string) error {
	p := leasename.Check(v, MaxNameLength)
	if p == nil {
		return nil
	}
	switch p.Kind {
	case leasename.Empty:
		return fmt.Errorf("pgfence: schedule: the %s is empty", what)
	case leasename.TooLong:
		return fmt.Errorf("pgfence: schedule: the %s is %d bytes long; at most %d are allowed", what, p.Len, p.Max)
	case leasename.NotUTF8:
		return fmt.Errorf("pgfence: schedule: the %s is not valid UTF-8", what)
	default: // NUL or another control character
		return fmt.Errorf("pgfence: schedule: the %s %q holds a control character", what, v)
	}
}
