package leasetable

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/pgfence/pgfence"
)

// renewSQL extends a batch of leases in one statement. A lease is renewed
// only while it is still held by the same token: fence matches and
// expires_at is still in the future, so an expired lease is never
// resurrected. clock_timestamp() rather than now() is used in that check
// because the statement may wait for a row lock (for example behind a
// release or a takeover) and must judge expiry when it gets the row, not
// when it started. expires_at never moves backwards. It locks the batch's
// rows, in name order.
//
// $1 names, $2 tokens, $3 TTLs in microseconds (parallel arrays).
const renewSQL = `
UPDATE pgfence_leases AS l
SET expires_at = greatest(l.expires_at, now() + r.ttl_us * interval '1 microsecond')
FROM unnest($1::text[], $2::bigint[], $3::bigint[]) AS r(name, fence, ttl_us)
WHERE l.name = r.name AND l.fence = r.fence AND l.expires_at > clock_timestamp()
RETURNING l.fence`

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
			k.renew(batch)
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

func (k *Locker) renew(batch []*Lease) {
	slices.SortFunc(batch, func(a, b *Lease) int { return strings.Compare(a.name, b.name) })
	names := make([]string, 0, len(batch))
	tokens := make([]int64, 0, len(batch))
	ttls := make([]int64, 0, len(batch))
	var lastDeadline time.Time
	done := make(chan struct{})
	k.mu.Lock()
	for _, l := range batch {
		if l.state != stateHeld {
			continue
		}
		l.inflight = done
		names = append(names, l.name)
		tokens = append(tokens, l.token)
		ttls = append(ttls, l.timing.ttl.Microseconds())
		if l.deadline.After(lastDeadline) {
			lastDeadline = l.deadline
		}
	}
	k.mu.Unlock()
	defer close(done)
	if len(names) == 0 {
		return
	}

	// Past the last local deadline every lease in the batch is lost anyway.
	ctx, cancel := context.WithDeadline(k.closeCtx, lastDeadline)
	defer cancel()
	sent := time.Now()
	renewed := make(map[int64]bool, len(names))
	rows, err := k.pool.Query(ctx, renewSQL, names, tokens, ttls)
	if err == nil {
		var token int64
		for rows.Next() {
			if err = rows.Scan(&token); err != nil {
				break
			}
			renewed[token] = true
		}
		rows.Close()
		if err == nil {
			err = rows.Err()
		}
	}

	if err != nil && k.closeCtx.Err() == nil {
		k.cfg.Logger.Warn("pgfence: leasetable: renewal failed; retrying until each lease's local deadline",
			"leases", len(names), "error", err)
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
		switch {
		case err != nil:
			retry := max(10*time.Millisecond, min(l.timing.renewEvery/4, time.Second))
			l.nextRenew = time.Now().Add(retry)
		case renewed[l.token]:
			l.deadline = sent.Add(l.timing.ttl - l.timing.margin)
			l.nextRenew = sent.Add(l.timing.renewEvery)
			k.cfg.Logger.Debug("pgfence: leasetable: lease renewed", logAttrs(l)...)
		default:
			k.endLocked(l, stateLost, fmt.Errorf(
				"leasetable: lease %q (token %d) is no longer held in the database (expired or taken over): %w",
				l.name, l.token, pgfence.ErrLeaseLost))
		}
	}
}
