package leasetable

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence"
)

// listSQL reads the current holders; it takes no locks.
const listSQL = `
SELECT name, owner, fence, acquired_at, expires_at FROM pgfence_leases
WHERE expires_at > now()
ORDER BY name`

// getSQL reads one lease's current holder; it takes no locks.
const getSQL = `
SELECT name, owner, fence, acquired_at, expires_at FROM pgfence_leases
WHERE name = $1 AND expires_at > now()`

// Locker acquires, renews and releases leases in the pgfence_leases table
// through a pool. It is safe for concurrent use. Create it with [New] and
// stop it with [Locker.Close].
type Locker struct {
	pool       *pgxpool.Pool
	cfg        Config          // resolved: defaults filled in
	closeCtx   context.Context // cancelled by Close
	closeFunc  context.CancelFunc
	background sync.WaitGroup // watchdog and listener goroutines

	mu              sync.Mutex
	closed          bool
	leases          map[*Lease]struct{} // held leases, renewed by the watchdog
	watchdogRunning bool
	watchdogWake    chan struct{} // buffered(1): a lease was added
	listenerStarted bool
	waiters         map[string]map[*waiter]struct{}

	acquires batcher[*acquireReq] // combines concurrent acquires
	releases batcher[*releaseReq] // combines concurrent releases
}

type waiter struct{ ch chan struct{} } // buffered(1)

func (w *waiter) wake() {
	select {
	case w.ch <- struct{}{}:
	default:
	}
}

// LeaseInfo describes a lease row, as shown to operators by [Locker.List]
// and [Locker.Get]. Times are the database's.
type LeaseInfo struct {
	Name       string    // the lease name
	Owner      string    // the holder's owner id ([Config].Owner)
	Token      int64     // the holder's fencing token
	AcquiredAt time.Time // when the holder acquired it
	ExpiresAt  time.Time // when it expires unless renewed
}

// New returns a Locker that uses pool for every statement. cfg may be nil for
// the defaults; New returns an error when it is invalid or pool is nil, and
// then nothing is written. New does not connect: the first error from the
// database comes from the first call that uses it. The pgfence migrations
// must have been applied ([pgfence.Migrate]).
//
// The pool stays the caller's: [Locker.Close] does not close it, and it must
// stay open until Close returns.
func New(pool *pgxpool.Pool, cfg *Config) (*Locker, error) {
	if pool == nil {
		return nil, errNilPool
	}
	resolved, err := cfg.resolve()
	if err != nil {
		return nil, err
	}
	if resolved.ListenConnConfig == nil && !resolved.DisableListen {
		resolved.ListenConnConfig = pool.Config().ConnConfig.Copy()
	}
	ctx, cancel := context.WithCancel(context.Background())
	k := &Locker{
		pool:         pool,
		cfg:          resolved,
		closeCtx:     ctx,
		closeFunc:    cancel,
		leases:       make(map[*Lease]struct{}),
		watchdogWake: make(chan struct{}, 1),
		waiters:      make(map[string]map[*waiter]struct{}),
	}
	k.acquires.exec, k.acquires.fail = k.execAcquires, k.failAcquire
	k.releases.exec, k.releases.fail = k.execReleases, failRelease
	return k, nil
}

// Owner returns the owner id this Locker writes into the leases it takes.
func (k *Locker) Owner() string { return k.cfg.Owner }

// Close releases every lease the Locker still holds (each such lease is
// lost: its context is cancelled with a cause matching both
// [pgfence.ErrLeaseLost] and [pgfence.ErrClosed]), wakes waiting Acquire
// calls, which return [pgfence.ErrClosed], and stops the renewal watchdog and
// the LISTEN connection. It returns when all background goroutines have
// stopped and pgx has finished closing the LISTEN connection; it waits at
// most a second for the latter when the server does not answer. It does
// not close the pool. Close is idempotent; later calls of the Locker's
// methods return [pgfence.ErrClosed].
func (k *Locker) Close() {
	k.mu.Lock()
	if k.closed {
		k.mu.Unlock()
		return
	}
	k.closed = true
	held := make([]*Lease, 0, len(k.leases))
	for l := range k.leases {
		held = append(held, l)
	}
	k.mu.Unlock()
	k.closeFunc() // stops the watchdog's in-flight renewal, the listener and waiters
	for _, l := range held {
		err := l.release(context.Background(), errLostClosed)
		if err != nil && !errors.Is(err, pgfence.ErrNotHeld) {
			k.cfg.Logger.Warn("pgfence: leasetable: release on close failed", "lease", l.name, "token", l.token, "error", err)
		}
	}
	k.acquires.close()
	k.releases.close()
	k.background.Wait()
}

var errLostClosed = fmt.Errorf("%w: %w", pgfence.ErrLeaseLost, pgfence.ErrClosed)

// TryAcquire takes the lease name if it is free or expired, in one round
// trip, and returns at once. When another owner holds it, TryAcquire returns
// an error matching [pgfence.ErrNotAcquired]. A Locker does not re-enter its
// own leases: a name it already holds is not acquired again.
//
// ctx covers only the acquiring statement; the lease's lifetime is
// independent of it (see [Lease.Context]). If ctx ends while the statement
// is in flight, the lease may have been taken in the database without the
// caller learning it; it then expires after its TTL, as nobody renews it.
//
// Other errors: [pgfence.ErrClosed] after Close, an invalid name or opts
// (nothing written), and database errors (wrapped).
func (k *Locker) TryAcquire(ctx context.Context, name string, opts *AcquireOpts) (*Lease, error) {
	t, err := k.prepare(name, opts)
	if err != nil {
		return nil, err
	}
	l, _, err := k.try(ctx, name, t)
	if err != nil {
		return nil, err
	}
	if l == nil {
		return nil, fmt.Errorf("leasetable: lease %q: %w", name, pgfence.ErrNotAcquired)
	}
	return l, nil
}

// Acquire takes the lease name, waiting while another owner holds it, until
// it is held or ctx ends. While waiting it wakes when the holder releases
// the lease (through LISTEN/NOTIFY, within milliseconds) and otherwise when
// the holder's lease is due to expire (plus a little jitter). Each attempt is
// the same single statement as [Locker.TryAcquire]. The first call opens the
// Locker's LISTEN connection, which stays open until [Locker.Close].
//
// When ctx ends first, Acquire returns an error wrapping ctx's cause; when
// opts.WaitTimeout elapses first, an error matching [pgfence.ErrNotAcquired]
// and [context.DeadlineExceeded]. After Close it returns
// [pgfence.ErrClosed]. Database errors are returned at once (wrapped); they
// are not retried. ctx does not bound the lease's lifetime.
func (k *Locker) Acquire(ctx context.Context, name string, opts *AcquireOpts) (*Lease, error) {
	t, err := k.prepare(name, opts)
	if err != nil {
		return nil, err
	}
	if opts != nil && opts.WaitTimeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeoutCause(ctx, opts.WaitTimeout,
			fmt.Errorf("%w: wait timeout of %v elapsed: %w", pgfence.ErrNotAcquired, opts.WaitTimeout, context.DeadlineExceeded))
		defer cancel()
	}
	w, err := k.addWaiter(name)
	if err != nil {
		return nil, err
	}
	defer k.removeWaiter(name, w)
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		l, retryIn, err := k.try(ctx, name, t)
		if err != nil {
			if ctx.Err() != nil {
				return nil, fmt.Errorf("leasetable: acquire %q: %w", name, context.Cause(ctx))
			}
			return nil, err
		}
		if l != nil {
			return l, nil
		}
		k.cfg.Logger.Debug("pgfence: leasetable: waiting for lease", "lease", name, "retry_in", retryIn)
		timer.Reset(retryIn)
		select {
		case <-w.ch:
		case <-timer.C:
		case <-ctx.Done():
			return nil, fmt.Errorf("leasetable: acquire %q: %w", name, context.Cause(ctx))
		case <-k.closeCtx.Done():
			return nil, fmt.Errorf("leasetable: acquire %q: %w", name, pgfence.ErrClosed)
		}
	}
}

// Do acquires the lease name like [Locker.Acquire], calls fn with it, and
// releases it when fn returns. fn's context is derived from ctx and is also
// cancelled, with cause [pgfence.ErrLeaseLost], when the lease is lost while
// fn runs; fn must then stop its protected work promptly.
//
// fn may release the lease itself; Do then does not release it again.
//
// Do returns the error from acquiring (and does not call fn), else fn's
// error; when fn returned nil but the lease was lost before fn returned, an
// error matching [pgfence.ErrLeaseLost], because fn's work may not have been
// protected throughout. A failure to release after a successful fn is
// returned too (the lease then expires after its TTL).
func (k *Locker) Do(ctx context.Context, name string, opts *AcquireOpts, fn func(ctx context.Context, l *Lease) error) error {
	if fn == nil {
		return errors.New("leasetable: Do: fn is nil")
	}
	l, err := k.Acquire(ctx, name, opts)
	if err != nil {
		return err
	}
	fnCtx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	stop := context.AfterFunc(l.ctx, func() { cancel(context.Cause(l.ctx)) })
	defer stop()
	fnErr := fn(fnCtx, l)
	lostErr := l.Err()
	relErr := l.Release(ctx)
	switch {
	case fnErr != nil:
		return fnErr
	case errors.Is(lostErr, pgfence.ErrLeaseLost):
		return fmt.Errorf("leasetable: lease %q (token %d) was lost while fn ran: %w", name, l.token, lostErr)
	case relErr != nil:
		return relErr
	}
	return nil
}

// List returns the leases currently held (expires_at after the database's
// now()), ordered by name, for operators. It reads all lease rows, not only
// this Locker's.
func (k *Locker) List(ctx context.Context) ([]LeaseInfo, error) {
	if err := k.checkOpen(); err != nil {
		return nil, err
	}
	rows, err := k.pool.Query(ctx, listSQL)
	if err != nil {
		return nil, fmt.Errorf("leasetable: list leases: %w", err)
	}
	infos, err := pgx.CollectRows(rows, scanInfo)
	if err != nil {
		return nil, fmt.Errorf("leasetable: list leases: %w", err)
	}
	return infos, nil
}

// Get returns the current holder of the lease name. ok is false when nobody
// holds it (no row, or the row's lease has expired or was released).
func (k *Locker) Get(ctx context.Context, name string) (info LeaseInfo, ok bool, err error) {
	if err := k.checkOpen(); err != nil {
		return LeaseInfo{}, false, err
	}
	if err := checkText("lease name", name); err != nil {
		return LeaseInfo{}, false, err
	}
	rows, err := k.pool.Query(ctx, getSQL, name)
	if err != nil {
		return LeaseInfo{}, false, fmt.Errorf("leasetable: get lease %q: %w", name, err)
	}
	info, err = pgx.CollectExactlyOneRow(rows, scanInfo)
	if errors.Is(err, pgx.ErrNoRows) {
		return LeaseInfo{}, false, nil
	}
	if err != nil {
		return LeaseInfo{}, false, fmt.Errorf("leasetable: get lease %q: %w", name, err)
	}
	return info, true, nil
}

func scanInfo(row pgx.CollectableRow) (LeaseInfo, error) {
	var i LeaseInfo
	err := row.Scan(&i.Name, &i.Owner, &i.Token, &i.AcquiredAt, &i.ExpiresAt)
	return i, err
}

func (k *Locker) checkOpen() error {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.closed {
		return pgfence.ErrClosed
	}
	return nil
}

func (k *Locker) prepare(name string, opts *AcquireOpts) (leaseTiming, error) {
	if err := checkText("lease name", name); err != nil {
		return leaseTiming{}, err
	}
	t, err := k.cfg.timing(opts)
	if err != nil {
		return leaseTiming{}, err
	}
	return t, k.checkOpen()
}

// try runs one acquire attempt (batched with concurrent attempts of this
// Locker). It returns the lease when taken; otherwise how long to wait
// before the next attempt, judged from the holder's expiry.
func (k *Locker) try(ctx context.Context, name string, t leaseTiming) (*Lease, time.Duration, error) {
	rep, err := k.acquire(ctx, name, t)
	if err == nil {
		err = rep.err
	}
	if err != nil && ctx.Err() == nil && k.closeCtx.Err() != nil {
		// Close cancelled the statement.
		return nil, 0, fmt.Errorf("leasetable: acquire %q: %w", name, pgfence.ErrClosed)
	}
	if err != nil {
		return nil, 0, fmt.Errorf("leasetable: acquire %q: %w", name, err)
	}
	if !rep.found {
		// The holder committed after our snapshot: retry soon.
		return nil, jitter(10*time.Millisecond, 50*time.Millisecond), nil
	}
	if !rep.acquired {
		wait := max(rep.expiresAt.Sub(rep.dbNow), 0)
		return nil, wait + jitter(time.Millisecond, min(50*time.Millisecond, t.ttl/10)), nil
	}
	l := k.newLease(name, rep.token, rep.acquiredAt, rep.sent, t)
	if !k.adopt(l) {
		// Closed while acquiring: give it straight back.
		_ = l.release(ctx, errLostClosed)
		return nil, 0, fmt.Errorf("leasetable: acquire %q: %w", name, pgfence.ErrClosed)
	}
	k.cfg.Logger.Debug("pgfence: leasetable: acquired", "lease", name, "token", rep.token, "ttl", t.ttl)
	return l, 0, nil
}

// adopt starts renewing l. It reports false when the Locker was closed.
func (k *Locker) adopt(l *Lease) bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.closed {
		return false
	}
	k.leases[l] = struct{}{}
	l.timer = time.AfterFunc(time.Until(l.deadline), func() { k.checkDeadline(l) })
	if !k.watchdogRunning {
		k.watchdogRunning = true
		k.background.Add(1)
		go k.watchdog()
	} else {
		select {
		case k.watchdogWake <- struct{}{}:
		default:
		}
	}
	return true
}

func jitter(lo, hi time.Duration) time.Duration {
	if hi <= lo {
		return lo
	}
	return lo + rand.N(hi-lo)
}

// logAttrs are the log attributes describing a lease.
func logAttrs(l *Lease) []any {
	return []any{slog.String("lease", l.name), slog.Int64("token", l.token)}
}
