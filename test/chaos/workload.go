package chaos

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence"
)

// Locker grants locks by name, for the workload. [PgfenceLocker] adapts
// any pgfence.Locker (leasetable, advisory session locks) to it;
// [AdvisoryTxLocker] (advisory transaction locks) and the test-only
// [SimLocker] implement it too.
type Locker interface {
	// Acquire waits until the caller holds name or ctx ends.
	Acquire(ctx context.Context, name string) (Holder, error)
}

// Holder is a granted lock: the part of pgfence.Lease the workload uses,
// so every pgfence.Lease is a Holder. Holders of locks that do not live as
// a pgfence.Lease (a transaction lock, a simulated grant) implement just
// this.
type Holder interface {
	// Token returns the fencing token of the grant.
	Token() int64
	// Release releases the lock; it is idempotent. An error matching
	// pgfence.ErrNotHeld says the lock had been lost: the workload records
	// the Release as Ok with [Op.Lost] set.
	Release(ctx context.Context) error
}

// HolderRegister is a [Register] whose operations depend on the holder,
// beyond its token: ForHolder returns the register to use for h's
// operations (a lease-checked register presents h's secret).
type HolderRegister interface {
	Register
	ForHolder(h Holder) Register
}

// Register is the resource a workload protects: one row holding a value and
// a fencing token.
type Register interface {
	// Read returns the value and the row's fencing token. A claiming
	// register first sets the row's token to token, and fails with an error
	// matching pgfence.ErrFenced when the row's token is newer.
	Read(ctx context.Context, token int64) (value, rowToken int64, err error)
	// Write stores value with token. A guarded register fails with an error
	// matching pgfence.ErrFenced when the row's token is newer.
	Write(ctx context.Context, token, value int64) error
	// Claims reports whether Read claims the row (see [CheckOpts.Claim]).
	Claims() bool
}

// Classify maps an operation's error to its outcome: nil is Ok; a fenced
// write, a server error that rolled the statement back, or an error raised
// before anything was sent (including no connection from a pool) is Fail; anything else (a broken connection, a
// timeout while waiting for the reply, a server shutting the session down)
// is Unknown.
func Classify(err error) Outcome {
	if err == nil {
		return Ok
	}
	var ue *unknownError
	if errors.As(err, &ue) {
		return Unknown
	}
	if errors.Is(err, pgfence.ErrFenced) || errors.Is(err, pgfence.ErrNotAcquired) {
		return Fail
	}
	var ns *notSentError
	if errors.As(err, &ns) {
		return Fail
	}
	if pgconn.SafeToRetry(err) {
		return Fail
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		// Class 08 (connection exception) and 57 (operator intervention:
		// terminated, shutting down) may arrive after the commit.
		if strings.HasPrefix(pgErr.Code, "08") || strings.HasPrefix(pgErr.Code, "57") {
			return Unknown
		}
		return Fail
	}
	return Unknown
}

// WorkloadConfig configures [Run].
type WorkloadConfig struct {
	// Locker grants the lock. Required unless Lockers is set.
	Locker Locker
	// Lockers, when set, gives each worker its own locker (worker i uses
	// Lockers[i % len(Lockers)]), as separate processes would have.
	Lockers []Locker
	// Register is the protected row. Required.
	Register Register
	// Recorder records the history; nil means a new one.
	Recorder *Recorder
	// Name is the lock name; empty means DefaultLockName.
	Name string
	// Workers is the number of concurrent workers; zero means 4.
	Workers int
	// Ops bounds the number of critical sections in all; zero means no
	// bound (Duration must then be set).
	Ops int
	// Duration bounds the run's wall time; zero means no bound (Ops must
	// then be set).
	Duration time.Duration
	// MaxSleep is the longest random sleep inside a critical section.
	MaxSleep time.Duration
	// OpTimeout bounds each operation; zero means DefaultOpTimeout.
	OpTimeout time.Duration
	// Seed seeds the random sleeps.
	Seed uint64
	// ProcessBase is added to the workers' process ids, so that several
	// runs can share one Recorder.
	ProcessBase int
}

// DefaultLockName is the lock name a workload uses when none is configured.
const DefaultLockName = "chaos-register"

// DefaultOpTimeout bounds each workload operation when none is configured.
const DefaultOpTimeout = 10 * time.Second

// Run runs the fenced-register workload: each worker loops acquire, random
// sleep, Read, Write(value+1), Release, until Ops critical sections were
// started in all, Duration passed, or ctx ended. Errors of the operations
// are recorded in the history, not returned; Run returns an error only for a
// bad configuration. A worker whose Read fails skips its Write.
func Run(ctx context.Context, cfg WorkloadConfig) (History, error) {
	if cfg.Locker == nil && len(cfg.Lockers) > 0 {
		cfg.Locker = cfg.Lockers[0]
	}
	if cfg.Locker == nil || cfg.Register == nil {
		return nil, errors.New("chaos: WorkloadConfig needs a Locker and a Register")
	}
	if cfg.Ops < 0 || cfg.Workers < 0 || cfg.Duration < 0 || cfg.MaxSleep < 0 || cfg.OpTimeout < 0 {
		return nil, errors.New("chaos: WorkloadConfig fields must not be negative")
	}
	if cfg.Ops == 0 && cfg.Duration == 0 {
		return nil, errors.New("chaos: WorkloadConfig needs Ops or Duration to bound the run")
	}
	if cfg.Recorder == nil {
		cfg.Recorder = NewRecorder()
	}
	if cfg.Name == "" {
		cfg.Name = DefaultLockName
	}
	if cfg.Workers == 0 {
		cfg.Workers = 4
	}
	if cfg.OpTimeout == 0 {
		cfg.OpTimeout = DefaultOpTimeout
	}
	if cfg.Duration > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, cfg.Duration)
		defer cancel()
	}
	var started atomic.Int64
	var wg sync.WaitGroup
	for w := 0; w < cfg.Workers; w++ {
		wg.Add(1)
		go func(p int) {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(cfg.Seed, uint64(p)))
			for ctx.Err() == nil {
				if cfg.Ops > 0 && started.Add(1) > int64(cfg.Ops) {
					return
				}
				lk := cfg.Locker
				if len(cfg.Lockers) > 0 {
					lk = cfg.Lockers[p%len(cfg.Lockers)]
				}
				criticalSection(ctx, cfg, lk, cfg.ProcessBase+p, rng)
			}
		}(w)
	}
	wg.Wait()
	return cfg.Recorder.History(), nil
}

func criticalSection(ctx context.Context, cfg WorkloadConfig, lk Locker, p int, rng *rand.Rand) {
	rec := cfg.Recorder
	opCtx := func() (context.Context, context.CancelFunc) { return context.WithTimeout(ctx, cfg.OpTimeout) }

	acq := rec.Invoke(Op{Process: p, Kind: Acquire, Name: cfg.Name})
	cctx, cancel := opCtx()
	h, err := lk.Acquire(cctx, cfg.Name)
	cancel()
	if err != nil {
		// A grant the client never saw cannot be used: record it as failed.
		acq.Complete(Fail, func(o *Op) { o.Err = err.Error() })
		return
	}
	token := h.Token()
	acq.Complete(Ok, func(o *Op) { o.Token = token })

	reg := cfg.Register
	if hr, ok := reg.(HolderRegister); ok {
		reg = hr.ForHolder(h)
	}
	// A transaction-scoped holder: the register runs in its transaction,
	// and the operations' outcomes are decided by the commit (Release).
	var provisional []provisionalOp
	scoped, isScoped := h.(Scoped)
	if isScoped {
		sr, ok := reg.(ScopedRegister)
		if !ok {
			rec.Invoke(Op{Process: p, Kind: Release, Name: cfg.Name, Token: token}).
				Complete(Fail, func(o *Op) { o.Err = "chaos: a Scoped holder needs a ScopedRegister" })
			_ = h.Release(context.WithoutCancel(ctx))
			return
		}
		reg = sr.On(scoped.DB())
	}
	lost := func() bool {
		if w, ok := h.(Watched); ok {
			select {
			case <-w.Done():
				return true
			default:
			}
		}
		return false
	}
	complete := func(pd *Pend, err error, edit func(*Op)) {
		full := func(o *Op) {
			if edit != nil {
				edit(o)
			}
			o.Err = errString(err)
			o.Fenced = IsFenced(err)
		}
		if isScoped {
			if err != nil {
				// Nothing done in a transaction that failed or will be
				// rolled back takes effect.
				pd.Complete(Fail, full)
				return
			}
			provisional = append(provisional, provisionalOp{pd, full})
			return
		}
		pd.Complete(Classify(err), full)
	}
	defer func() {
		rel := rec.Invoke(Op{Process: p, Kind: Release, Name: cfg.Name, Token: token, Lost: lost()})
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cfg.OpTimeout)
		defer cancel()
		err := h.Release(rctx)
		lostAtRelease := errors.Is(err, pgfence.ErrNotHeld)
		if lostAtRelease {
			// The lock had been lost: nothing was left to release.
			err = nil
		}
		outcome := Classify(err)
		for _, po := range provisional {
			po.p.Complete(outcome, po.edit)
		}
		rel.Complete(outcome, func(o *Op) {
			o.Err = errString(err)
			o.Lost = o.Lost || lostAtRelease
		})
	}()

	if cfg.MaxSleep > 0 {
		sleep(ctx, time.Duration(rng.Int64N(int64(cfg.MaxSleep)+1)))
	}

	rd := rec.Invoke(Op{Process: p, Kind: Read, Token: token, Lost: lost()})
	cctx, cancel = opCtx()
	val, rowTok, err := reg.Read(cctx, token)
	cancel()
	complete(rd, err, func(o *Op) { o.Value, o.RowToken = val, rowTok })
	if err != nil {
		return
	}

	wr := rec.Invoke(Op{Process: p, Kind: Write, Token: token, Value: val + 1, Lost: lost()})
	cctx, cancel = opCtx()
	err = reg.Write(cctx, token, val+1)
	cancel()
	complete(wr, err, nil)
}

type provisionalOp struct {
	p    *Pend
	edit func(*Op)
}

// IsFenced reports whether err is a rejection by a newer fencing token on
// the row: it matches pgfence.ErrFenced and not pgfence.ErrLeaseLost (a
// lease-checked write rejected because the lease lapsed says nothing about
// the row's token).
func IsFenced(err error) bool {
	return errors.Is(err, pgfence.ErrFenced) && !errors.Is(err, pgfence.ErrLeaseLost)
}

func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// SQL of the register. %[1]s is the sanitized table name.
const (
	// registerCreate creates the register table and its one row.
	registerCreate = `CREATE TABLE IF NOT EXISTS %[1]s (
    id          int    PRIMARY KEY,
    val         bigint NOT NULL,
    fence_token bigint NOT NULL
);
INSERT INTO %[1]s (id, val, fence_token) VALUES (1, 0, 0) ON CONFLICT (id) DO NOTHING`
	// registerClaim moves the row's token to $1 unless it is newer, and
	// returns the value: the guarded read. It row-locks the row.
	registerClaim = `UPDATE %[1]s SET fence_token = $1 WHERE id = 1 AND fence_token <= $1 RETURNING val, fence_token`
	// registerGuardedWrite stores $1 with token $2 unless the row's token
	// is newer: the raw fenced write.
	registerGuardedWrite = `UPDATE %[1]s SET val = $1, fence_token = $2 WHERE id = 1 AND fence_token <= $2`
	// registerRead reads the row without locking it.
	registerRead = `SELECT val, fence_token FROM %[1]s WHERE id = 1`
	// registerUnguardedWrite stores $1 with token $2 whatever the row's
	// token: the negative control.
	registerUnguardedWrite = `UPDATE %[1]s SET val = $1, fence_token = $2 WHERE id = 1`
)

// SQLRegister is a [Register] in a PostgreSQL table, written with raw SQL:
// guarded (a claiming read and a fenced write, the pattern the fence package
// generates) or unguarded (plain read and write, the negative control).
type SQLRegister struct {
	db      pgfence.DB
	table   string
	guarded bool
}

// NewSQLRegister creates table (if missing) with its one row, value 0 and
// token 0, and returns a register on it.
func NewSQLRegister(ctx context.Context, db pgfence.DB, table string, guarded bool) (*SQLRegister, error) {
	if db == nil || table == "" {
		return nil, errors.New("chaos: NewSQLRegister needs a db and a table name")
	}
	r := &SQLRegister{db: db, table: pgx.Identifier{table}.Sanitize(), guarded: guarded}
	if _, err := db.Exec(ctx, r.sql(registerCreate)); err != nil {
		return nil, fmt.Errorf("chaos: create register: %w", err)
	}
	return r, nil
}

// On implements [ScopedRegister]: the same register, run on db. It also
// lets a test create the table through a connection no fault touches and
// run the workload through the faulty one.
func (r *SQLRegister) On(db pgfence.DB) Register {
	c := *r
	c.db = db
	return &c
}

func (r *SQLRegister) sql(q string) string { return fmt.Sprintf(q, r.table) }

// Claims reports whether reads claim the row: true when guarded.
func (r *SQLRegister) Claims() bool { return r.guarded }

// notSentError is a failure before any statement was sent, such as no
// connection to be had from a pool: the operation certainly did not happen.
type notSentError struct{ err error }

func (e *notSentError) Error() string { return "chaos: nothing sent: " + e.err.Error() }
func (e *notSentError) Unwrap() error { return e.err }

// conn returns a connection of the register's pool (so that failing to get
// one is known to have sent nothing), or its DB when it is not a pool.
func (r *SQLRegister) conn(ctx context.Context) (pgfence.DB, func(), error) {
	p, ok := r.db.(*pgxpool.Pool)
	if !ok {
		return r.db, func() {}, nil
	}
	c, err := p.Acquire(ctx)
	if err != nil {
		return nil, nil, &notSentError{err}
	}
	return c, c.Release, nil
}

// Read implements [Register].
func (r *SQLRegister) Read(ctx context.Context, token int64) (int64, int64, error) {
	db, release, err := r.conn(ctx)
	if err != nil {
		return 0, 0, err
	}
	defer release()
	var val, tok int64
	if !r.guarded {
		err := db.QueryRow(ctx, r.sql(registerRead)).Scan(&val, &tok)
		return val, tok, err
	}
	err = db.QueryRow(ctx, r.sql(registerClaim), token).Scan(&val, &tok)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, 0, fmt.Errorf("chaos: claim with token %d: %w", token, pgfence.ErrFenced)
	}
	return val, tok, err
}

// Write implements [Register].
func (r *SQLRegister) Write(ctx context.Context, token, value int64) error {
	db, release, err := r.conn(ctx)
	if err != nil {
		return err
	}
	defer release()
	q := registerUnguardedWrite
	if r.guarded {
		q = registerGuardedWrite
	}
	tag, err := db.Exec(ctx, r.sql(q), value, token)
	if err != nil {
		return err
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("chaos: write with token %d: %w", token, pgfence.ErrFenced)
	}
	return nil
}

// Final reads the register's value and token, after a workload.
func (r *SQLRegister) Final(ctx context.Context) (RegisterState, error) {
	var s RegisterState
	err := r.db.QueryRow(ctx, r.sql(registerRead)).Scan(&s.Value, &s.Token)
	return s, err
}
