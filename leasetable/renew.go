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
	"github.com/pgfence/pgfence/internal/install"
	"github.com/pgfence/pgfence/internal/retry"
)

// renewSQL extends a batch of leases (%[1]s is the schema) through the
// SECURITY DEFINER pgfence_renew: only rows still held with the same token
// and secret and not yet expired on clock_timestamp(). A row another
// transaction has locked comes back not renewed, without a wait. $1 names,
// $2 tokens, $3 secrets, $4 TTLs in microseconds.
const renewSQL = `SELECT fence, renewed FROM %[1]s.pgfence_renew($1, $2, $3, $4)`

// errRenewBusy is the error of a renewal that skipped a row another
// transaction had locked.
var errRenewBusy = errors.New("the lease's row is locked by another transaction")

// Renew renews the lease now, in one statement bounded by ctx and
// [Config].QueryTimeout, beside the watchdog's renewals: before a step that
// must not be interrupted, or after a pause. On success [Lease.Expiry] moves
// forward. A failed statement leaves the lease held; Renew does not retry.
//
// It returns an error matching [pgfence.ErrLeaseLost] when the database no
// longer holds the lease (it is then lost), [Lease.Err] after a release or
// loss (no round trip), one matching [pgfence.ErrUnavailable] for a
// transient error, and other errors wrapped.
func (l *Lease) Renew(ctx context.Context) error {
	if err := l.Err(); err != nil {
		return err
	}
	k := l.k
	k.mu.Lock()
	inflight := l.inflight
	k.mu.Unlock()
	if inflight != nil {
		// One renewal at a time per lease.
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
// closed. A due lease is renewed together with every lease due within half
// its own interval.
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
// batch's last local deadline, as one operation for the Observer. The
// statement carries ctx's values, or with own (the watchdog's) those of the
// first lease's acquiring ctx. A lease the database no longer holds is
// lost; after an error the leases are retried soon. It returns the
// statement's error and the leases lost.
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
	// Not sent when it could not be answered before the deadline.
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
		err = install.WrapPermission(err, "", k.cfg.Schema)
	}
	if err != nil && k.retryable(err) {
		k.suspectListen()
	}

	// Ended by its caller or Close, or not sent: no failure of the database.
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
			// Locked by another transaction: not renewed, still held.
			lerr, lfailed = errRenewBusy, live
		}
		switch {
		case lerr != nil:
			// Backoff capped so that several attempts fit before the deadline.
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

// fastestRenewal returns the shortest answered renewal round trip (zero
// before the first): a renewal with less time left before its deadline is
// not sent.
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
