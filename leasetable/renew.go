package leasetable

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence"
	"github.com/pgfence/pgfence/internal/events"
	"github.com/pgfence/pgfence/internal/permerr"
	"github.com/pgfence/pgfence/internal/retry"
)

// renewSQL extends a batch of leases in one statement (%[1]s is the
// schema) through pgfence_renew, a SECURITY DEFINER function. A lease is
// renewed only while it is still held with the same token and secret and
// expires_at is still in the future on clock_timestamp(), so an expired
// lease is never resurrected; expires_at never moves backwards. A row that
// another transaction has locked is not waited for: it comes back with
// renewed false, and is retried soon like a failed statement.
//
// $1 names, $2 tokens, $3 secrets, $4 TTLs in microseconds (parallel
// arrays).
const renewSQL = `SELECT fence, renewed FROM %[1]s.pgfence_renew($1, $2, $3, $4)`

// errRenewBusy is the error of a renewal that skipped a lease's row because
// another transaction had it locked.
var errRenewBusy = errors.New("the lease's row is locked by another transaction")

// Renew renews the lease now, in one statement bounded by ctx and
// [Config].QueryTimeout, instead of waiting for the watchdog (which goes on
// renewing it as before): for a long job about to start a step that must
// not be interrupted, or to confirm the lease after a pause. On success the
// database's expiry and [Lease.Expiry] move forward by the TTL from now.
//
// When the database no longer holds the lease (it expired or was taken
// over), the lease is lost (Done closes) and Renew returns an error
// matching [pgfence.ErrLeaseLost]. After a release or loss it returns
// [Lease.Err] (matching [pgfence.ErrNotHeld] or ErrLeaseLost) without a
// round trip. When the statement fails (the database is unreachable, or ctx
// ended), the error is returned wrapped and the lease stays held: the
// watchdog retries until the local deadline, as for any failed renewal.
// Renew itself does not retry: a transient error (the database is failing
// over; see [Locker.TryAcquire]) is returned as an error matching
// [pgfence.ErrUnavailable] that wraps it.
func (l *Lease) Renew(ctx context.Context) error {
	if err := l.Err(); err != nil {
		return err
	}
	k := l.k
	k.mu.Lock()
	inflight := l.inflight
	k.mu.Unlock()
	if inflight != nil {
		// One renewal at a time per lease: wait for the watchdog's.
		select {
		case <-inflight:
		case <-ctx.Done():
			return fmt.Errorf("pgfence: leasetable: renew %q: %w", l.name, context.Cause(ctx))
		}
	}
	lost, err := k.renew(ctx, []*Lease{l}, false)
	switch {
	case lost[l]:
		return l.Err()
	case err != nil && ctx.Err() == nil && k.retryable(err):
		return fmt.Errorf("pgfence: leasetable: renew %q (token %d): %w", l.name, l.token, retry.Unavailable("", err))
	case err != nil:
		return fmt.Errorf("pgfence: leasetable: renew %q (token %d): %w", l.name, l.token, err)
	}
	return l.Err()
}

// watchdog renews the Locker's leases until none are left or the Locker is
// closed. When a lease is due, it and all leases due within half their
// renewal interval are renewed together in one statement.
func (k *Locker) watchdog() {
	defer k.background.Done()
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		k.mu.Lock()
		if k.closed || len(k.leases) == 0 {
			k.watchdogRunning = false
			k.mu.Unlock()
			return
		}
		// When a lease is due, renew it together with every lease that would
		// be due within half its own interval.
		now := time.Now()
		var batch []*Lease
		var next time.Time
		due := false
		for l := range k.leases {
			if !l.nextRenew.After(now) {
				due = true
			}
			if next.IsZero() || l.nextRenew.Before(next) {
				next = l.nextRenew
			}
			if !l.nextRenew.After(now.Add(l.timing.renewEvery / 2)) {
				batch = append(batch, l)
			}
		}
		if !due {
			batch = nil
		}
		k.mu.Unlock()
		if len(batch) > 0 {
			_, _ = k.renew(k.closeCtx, batch, true)
			continue
		}
		timer.Reset(time.Until(next))
		select {
		case <-timer.C:
		case <-k.watchdogWake:
			timer.Stop() // Go 1.23+ timers: no stale tick is delivered after Stop
		case <-k.closeCtx.Done():
			return
		}
	}
}

// renew renews batch in one statement, bounded by QueryTimeout and the
// last local deadline in the batch, with ctx's cancellation; the
// statement carries ctx's values, or with own (the watchdog's renewal,
// ctx the Locker's lifetime) those of the first lease's acquiring ctx. It
// is one renew operation for the OpObserver, linked to the other leases'
// acquiring ctxs. A lease the database no longer holds is lost; after a
// statement error the leases stay held and are retried soon. It returns
// the statement's error and the leases that were lost.
func (k *Locker) renew(ctx context.Context, batch []*Lease, own bool) (lost map[*Lease]bool, err error) {
	slices.SortFunc(batch, func(a, b *Lease) int { return strings.Compare(a.name, b.name) })
	names := make([]string, 0, len(batch))
	tokens := make([]int64, 0, len(batch))
	secrets := make([]string, 0, len(batch))
	ttls := make([]int64, 0, len(batch))
	var (
		lastDeadline time.Time
		first        *Lease
		links        []context.Context
	)
	done := make(chan struct{})
	k.mu.Lock()
	for _, l := range batch {
		if l.state != stateHeld {
			continue
		}
		if first == nil {
			first = l
		} else if k.ev.Enabled() {
			links = append(links, l.values)
		}
		l.inflight = done
		names = append(names, l.name)
		tokens = append(tokens, l.token)
		secrets = append(secrets, l.secret)
		ttls = append(ttls, l.timing.ttl.Microseconds())
		if l.deadline.After(lastDeadline) {
			lastDeadline = l.deadline
		}
	}
	k.mu.Unlock()
	defer close(done)
	if len(names) == 0 {
		return nil, nil
	}

	if own {
		var stop func()
		ctx, stop = events.Values(first.values, ctx)
		defer stop()
	}
	op := pgfence.Op{Kind: pgfence.OpRenew, Strategy: pgfence.StrategyLeaseTable, Batch: len(names), Links: links}
	if len(names) == 1 {
		op.Name = names[0]
	}
	ctx = k.ev.StartOp(ctx, op)
	defer func() { k.ev.EndOp(ctx, op, err) }()

	// Past the last local deadline every lease in the batch is lost anyway.
	sent := time.Now()
	stmtDeadline := sent.Add(k.cfg.QueryTimeout)
	if lastDeadline.Before(stmtDeadline) {
		stmtDeadline = lastDeadline
	}
	parent := ctx
	sctx, cancel := context.WithDeadline(ctx, stmtDeadline)
	defer cancel()
	renewed := make(map[int64]bool, len(names))
	var busy map[int64]bool // skipped as locked by another transaction; rare
	// The wait for a connection ends when too little time is left for the
	// statement to be answered before the deadline (less than the Locker's
	// fastest renewal round trip): a statement sent later could not be of
	// use, and cutting it at the deadline would have pgx close the
	// connection, which the pool would then have to dial again.
	wait := time.Until(stmtDeadline)
	if k.hooks == nil || !k.hooks.lateRenewals {
		wait -= k.fastestRenewal()
	}
	var conn *pgxpool.Conn
	if wait > 0 {
		conn, err = k.conn(parent, "renewal", wait, false)
	} else {
		err = fmt.Errorf("renewal not sent: %v left before its deadline, less than this Locker's fastest renewal round trip (%v)",
			time.Until(stmtDeadline).Round(time.Microsecond), k.fastestRenewal().Round(time.Microsecond))
	}
	var rows pgx.Rows
	var began time.Time
	if err == nil {
		defer conn.Release()
		began = time.Now()
		rows, err = conn.Query(sctx, k.sql.renew, names, tokens, secrets, ttls)
	}
	if err == nil {
		var (
			token int64
			ok    bool
		)
		for rows.Next() {
			if err = rows.Scan(&token, &ok); err != nil {
				break
			}
			if ok {
				renewed[token] = true
			} else {
				if busy == nil {
					busy = make(map[int64]bool)
				}
				busy[token] = true
			}
		}
		rows.Close()
		if err == nil {
			err = rows.Err()
		}
		if err == nil {
			k.noteRenewal(time.Since(began))
		}
	}
	if err != nil && conn != nil {
		k.discardStale(conn, err)
		err = permerr.Wrap(err, "", k.cfg.Schema)
	}
	if err != nil && k.retryable(err) {
		k.suspectListen()
	}

	// A renewal ended by its caller (Renew's ctx) or by Close is no failure
	// of the database: the watchdog carries on, and nothing is logged.
	// Nor is a renewal that was not sent because too little time was left
	// before the batch's last deadline: those leases are lost at it.
	live := parent.Err() == nil && k.closeCtx.Err() == nil && wait > 0
	failed := err != nil && live
	if failed {
		k.cfg.Logger.WarnContext(ctx, "pgfence: leasetable: renewal failed; retrying until each lease's local deadline",
			"leases", len(names), "error", err)
	} else if err == nil && len(busy) > 0 && live {
		k.cfg.Logger.WarnContext(ctx, "pgfence: leasetable: renewal failed; retrying until each lease's local deadline",
			"leases", len(busy), "error", errRenewBusy)
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	for _, l := range batch {
		if l.inflight == done {
			l.inflight = nil
		}
		if l.state != stateHeld {
			continue
		}
		lerr, lfailed := err, failed
		if err == nil && busy[l.token] {
			// Its row is locked by another transaction (the holder's own
			// lease-checked write, say): not renewed, still held.
			lerr, lfailed = errRenewBusy, live
		}
		switch {
		case lerr != nil:
			// Each attempt is bounded on its own (QueryTimeout), so a dead
			// connection costs one attempt; the next comes after a backoff
			// (from 25ms), capped at a quarter of the renewal interval, so
			// several fit before the local deadline.
			n := l.renewFails + 1
			if lfailed {
				l.renewFails = n
				k.nRenewFailures.Add(1)
				if k.ev.Enabled() {
					k.ev.Async(l.values, pgfence.RenewalFailed{Lock: l.lock(), Attempt: n, Err: lerr})
				}
			}
			wait := min(k.backoff.Wait(n), max(10*time.Millisecond, min(l.timing.renewEvery/4, time.Second)))
			l.nextRenew = time.Now().Add(wait)
		case renewed[l.token]:
			l.renewFails = 0
			l.deadline = sent.Add(l.timing.ttl - l.timing.margin)
			l.nextRenew = sent.Add(l.timing.renewEvery)
			lctx := ctx // Renew's caller
			if own {
				lctx = l.values
			}
			k.cfg.Logger.DebugContext(lctx, "pgfence: leasetable: lease renewed", logAttrs(l)...)
			if k.ev.Enabled() {
				k.ev.Async(l.values, pgfence.Renewed{Lock: l.lock(), Expiry: l.deadline})
			}
		default:
			if lost == nil {
				lost = make(map[*Lease]bool)
			}
			lost[l] = true
			k.endLocked(l, stateLost, fmt.Errorf(
				"pgfence: leasetable: lease %q (token %d) is no longer held in the database (expired or taken over): %w",
				l.name, l.token, pgfence.ErrLeaseTakenOver))
		}
	}
	return lost, err
}

// fastestRenewal returns the shortest round trip of a renewal statement of
// k that was answered (zero before the first): a renewal stops waiting for
// a connection, and is not sent, once less time than that is left before
// its deadline.
func (k *Locker) fastestRenewal() time.Duration { return time.Duration(k.renewRTT.Load()) }

// noteRenewal records the round trip d of an answered renewal statement.
func (k *Locker) noteRenewal(d time.Duration) {
	for {
		cur := k.renewRTT.Load()
		if cur != 0 && cur <= int64(d) {
			return
		}
		if k.renewRTT.CompareAndSwap(cur, int64(d)) {
			return
		}
	}
}
