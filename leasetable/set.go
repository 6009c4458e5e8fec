package leasetable

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence"
	"github.com/pgfence/pgfence/internal/hold"
)

// MaxSetSize is the largest number of leases one set may take.
const MaxSetSize = 1024

// setSQL takes a set of leases, all or none (%[1]s is the schema), through
// the SECURITY DEFINER pgfence_acquire_set. $1 names (distinct), $2 owner,
// $3 TTLs in microseconds.
const setSQL = `SELECT acquired, name, owner, fence, acquired_at, expires_at, db_now, secret FROM %[1]s.pgfence_acquire_set($1, $2, $3)`

// TryAcquireSet takes every lease of names (distinct, at most
// [MaxSetSize]) or none, in one statement and one round trip, each with its
// own fencing token; opts apply to each. The statement never waits for
// another transaction, so two sets cannot deadlock, whatever their order.
// It returns the leases in the order of names, each a *[Lease]. Transient
// errors are retried for at most [Config].QueryTimeout.
//
// It returns an error matching [pgfence.ErrNotAcquired], naming the leases
// held by others, when any of them is held or claimed (none is then taken);
// [pgfence.ErrAlreadyHeld] when ctx descends from one of them; the other
// errors of [Locker.TryAcquire].
func (k *Locker) TryAcquireSet(ctx context.Context, names []string, opts *AcquireOpts) ([]pgfence.Lease, error) {
	return k.observeSet(ctx, names, opts, false)
}

// AcquireSet takes every lease of names or none like
// [Locker.TryAcquireSet], waiting until all are free at once or ctx (or
// opts.WaitTimeout) ends: a release of any of them, from any Locker, wakes
// it; otherwise it retries at the latest holder's expiry. A set is not
// served in turn with single acquires of its names: under steady
// contention on one of them it may wait until that name is left free.
//
// It returns the errors of [Locker.Acquire].
func (k *Locker) AcquireSet(ctx context.Context, names []string, opts *AcquireOpts) ([]pgfence.Lease, error) {
	return k.observeSet(ctx, names, opts, true)
}

// observeSet validates a set acquire and runs it as one operation for the
// Observer, counting each lease's outcome in Stats.
func (k *Locker) observeSet(ctx context.Context, names []string, opts *AcquireOpts, wait bool) ([]pgfence.Lease, error) {
	op := pgfence.Op{Kind: pgfence.OpAcquire, Strategy: pgfence.StrategyLeaseTable, Batch: len(names)}
	ls, err := k.observed(ctx, op, names, func() (leaseTiming, error) { return k.prepareSet(ctx, names, opts) },
		func(ctx context.Context, t leaseTiming, attempts *int) ([]*Lease, error) {
			if !wait {
				return k.trySet(ctx, names, t, attempts)
			}
			return k.waitSet(ctx, names, t, opts, attempts)
		})
	if err != nil {
		return nil, err
	}
	out := make([]pgfence.Lease, len(ls))
	for i, l := range ls {
		out[i] = l
	}
	return out, nil
}

// prepareSet validates a set acquire and returns the leases' timing.
func (k *Locker) prepareSet(ctx context.Context, names []string, opts *AcquireOpts) (leaseTiming, error) {
	if err := ctx.Err(); err != nil {
		if cause := context.Cause(ctx); cause != err {
			err = fmt.Errorf("%w: %w", cause, err)
		}
		return leaseTiming{}, fmt.Errorf("pgfence: leasetable: acquire set: %w", err)
	}
	if len(names) == 0 || len(names) > MaxSetSize {
		return leaseTiming{}, fmt.Errorf("pgfence: leasetable: a set has 1 to %d names, not %d", MaxSetSize, len(names))
	}
	seen := make(map[string]bool, len(names))
	for _, n := range names {
		if err := checkText("lease name", n); err != nil {
			return leaseTiming{}, err
		}
		if seen[n] {
			return leaseTiming{}, fmt.Errorf("pgfence: leasetable: a set names each lease once; %q is named twice", n)
		}
		seen[n] = true
	}
	t, err := k.cfg.timing(opts)
	if err != nil {
		return leaseTiming{}, err
	}
	for _, n := range names {
		if hold.Held(ctx, k, n) {
			return leaseTiming{}, fmt.Errorf("pgfence: leasetable: lease %q: %w", n, pgfence.ErrAlreadyHeld)
		}
	}
	return t, k.checkOpen()
}

// trySet is TryAcquireSet's attempt, retried while QueryTimeout lasts.
func (k *Locker) trySet(ctx context.Context, names []string, t leaseTiming, attempts *int) ([]*Lease, error) {
	var (
		ls   []*Lease
		held []string
	)
	err := k.retrying(ctx, "acquire set", strings.Join(names, ","), func() (err error) {
		ls, _, held, err = k.setAttempt(ctx, names, t, attempts)
		return err
	}, setError)
	switch {
	case err != nil:
		return nil, err
	case ls == nil:
		return nil, setRefused(held)
	}
	return ls, nil
}

// setRefused is the error of a refused set; held names the leases found
// held or claimed.
func setRefused(held []string) error {
	const shown = 5
	list := strings.Join(quoteAll(held[:min(len(held), shown)]), ", ")
	if len(held) > shown {
		list += fmt.Sprintf(" and %d more", len(held)-shown)
	}
	return fmt.Errorf("pgfence: leasetable: set not acquired, none taken: held or claimed: %s: %w", list, pgfence.ErrNotAcquired)
}

func quoteAll(s []string) []string {
	q := make([]string, len(s))
	for i, v := range s {
		q[i] = fmt.Sprintf("%q", v)
	}
	return q
}

func setError(err error) error {
	if errors.Is(err, pgfence.ErrClosed) || errors.Is(err, errLateGrant) {
		return err
	}
	return fmt.Errorf("pgfence: leasetable: acquire set: %w", err)
}

// waitSet is AcquireSet's loop: an attempt, then a wait for a release of
// any of the names or the retry time.
func (k *Locker) waitSet(ctx context.Context, names []string, t leaseTiming, opts *AcquireOpts, attempts *int) ([]*Lease, error) {
	loop := k.newWaitLoop(ctx, opts, "acquire set", strings.Join(names, ","))
	defer loop.stop()
	ctx = loop.ctx
	wake := make(chan struct{}, 1)
	stop := make(chan struct{})
	var fwd sync.WaitGroup
	ws := make([]*waiter, 0, len(names))
	defer func() {
		close(stop)
		fwd.Wait()
		for i, w := range ws {
			k.removeWaiter(names[i], w)
		}
	}()
	for _, n := range names {
		w, err := k.addWaiter(n)
		if err != nil {
			return nil, err
		}
		ws = append(ws, w)
		fwd.Add(1)
		go func() {
			defer fwd.Done()
			for {
				select {
				case <-w.ch:
					select {
					case wake <- struct{}{}:
					default:
					}
				case <-stop:
					return
				}
			}
		}()
	}
	for {
		ls, retryIn, _, err := k.setAttempt(ctx, names, t, attempts)
		if retryIn, err = loop.next(err, retryIn, setError); err != nil {
			return nil, err
		}
		if ls != nil {
			return ls, nil
		}
		for _, w := range ws {
			k.listenFor(w)
		}
		if err := loop.sleep(wake, retryIn); err != nil {
			return nil, err
		}
	}
}

// setAttempt sends one pgfence_acquire_set. It returns the leases when all
// were taken, else when to try again and the names found held.
func (k *Locker) setAttempt(ctx context.Context, names []string, t leaseTiming, attempts *int) ([]*Lease, time.Duration, []string, error) {
	*attempts++
	back, err := k.startGrant()
	if err != nil {
		return nil, 0, nil, err
	}
	defer back()
	ttls := make([]int64, len(names))
	for i := range ttls {
		ttls[i] = t.ttl.Microseconds()
	}
	got := make(map[string]acquireReply, len(names))
	var sent time.Time
	err = k.grantStatement(ctx, t, func(qctx context.Context, c *pgxpool.Conn) error {
		sent = time.Now()
		rows, err := c.Query(qctx, k.sql.set, names, k.cfg.Owner, ttls)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var (
				rep                   acquireReply
				name                  string
				owner, secret         *string
				token                 *int64
				acquiredAt, expiresAt *time.Time
			)
			if err := rows.Scan(&rep.acquired, &name, &owner, &token, &acquiredAt, &expiresAt, &rep.dbNow, &secret); err != nil {
				return err
			}
			rep.found, rep.sent = true, sent
			if owner == nil || token == nil || acquiredAt == nil || expiresAt == nil {
				rep.busy = true
				if owner == nil && expiresAt != nil && !expiresAt.After(rep.dbNow) {
					rep.busy = false // free: taken, then rolled back with the set
				}
			} else {
				rep.owner, rep.token, rep.acquiredAt, rep.expiresAt = *owner, *token, *acquiredAt, *expiresAt
			}
			if rep.acquired {
				if secret == nil || rep.busy {
					return fmt.Errorf("pgfence_acquire_set granted %q without a token or secret", name)
				}
				rep.secret = *secret
			}
			got[name] = rep
		}
		return rows.Err()
	})
	if err != nil {
		return nil, 0, nil, err
	}
	all := len(got) == len(names)
	for _, n := range names {
		all = all && got[n].acquired
	}
	if !all {
		var held []string
		var latest time.Duration
		busy := false
		for _, n := range names {
			rep, ok := got[n]
			switch {
			case rep.acquired:
				return nil, 0, nil, fmt.Errorf("pgfence_acquire_set granted %q of a refused set", n)
			case !ok || rep.busy:
				busy = true
				held = append(held, n)
			case rep.expiresAt.After(rep.dbNow):
				held = append(held, n)
				latest = max(latest, min(rep.expiresAt.Sub(rep.dbNow), MaxTTL))
			}
		}
		if busy || len(held) == 0 {
			return nil, jitter(10*time.Millisecond, 50*time.Millisecond), held, nil
		}
		return nil, latest + jitter(time.Millisecond, expiryJitter), held, nil
	}
	// All taken: adopted together, or all given back.
	var back2 []giveBackReq
	for _, n := range names {
		back2 = append(back2, giveBackReq{ctx, n, got[n].token, got[n].secret})
	}
	if err := ctx.Err(); err != nil {
		k.giveBack(back2)
		return nil, 0, nil, err
	}
	ls := make([]*Lease, len(names))
	for i, n := range names {
		ls[i] = k.newLease(ctx, n, got[n], t)
	}
	if !time.Now().Before(ls[0].deadline) {
		k.giveBack(back2)
		return nil, 0, nil, fmt.Errorf("pgfence: leasetable: set was granted %v after the acquire was sent, past its local deadline (TTL %v less margin %v); given back: %w: %w",
			time.Since(sent).Round(time.Millisecond), t.ttl, t.margin, errLateGrant, pgfence.ErrNotAcquired)
	}
	for i, l := range ls {
		if !k.adopt(l) {
			// Closed: those adopted before are Close's to release.
			for _, r := range ls[i:] {
				r.cancel(errLostClosed)
			}
			k.giveBack(back2[i:])
			return nil, 0, nil, fmt.Errorf("pgfence: leasetable: acquire set: %w", pgfence.ErrClosed)
		}
	}
	return ls, 0, nil, nil
}
