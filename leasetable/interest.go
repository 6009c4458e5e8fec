package leasetable

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgfence/pgfence/internal/retry"
)

// Registering interest: a waiter's Locker holds the name's interest key
// (InterestClassID, its tag's first 4 bytes) shared on its LISTEN
// connection, and a release notifies only when it cannot take that key
// exclusively (pgfence_notify_waiters; docs/leasetable.md, Notify only
// when someone waits).
// The order that no release can slip through is: LISTEN, take the key,
// then try again. Taking the key therefore wakes the name's waiters whose
// last attempt may have come before it.

// interest is the state of one name's interest key. Guarded by Locker.mu.
type interest struct {
	id      int32     // the second argument of the key
	waiters int       // waiters of the name that wait for notifications
	held    bool      // the LISTEN connection holds the key
	idle    time.Time // when waiters last fell to 0
}

// takeInterestSQL takes the interest keys $1 shared, without waiting, and
// returns the positions (from 1) of those granted.
const takeInterestSQL = `SELECT i FROM pg_catalog.unnest($1::pg_catalog.int4[]) WITH ORDINALITY AS k(id, i) ` +
	`WHERE pg_catalog.pg_try_advisory_lock_shared(1885824620, k.id)`

// dropInterestSQL releases one shared lock on each interest key in $1.
const dropInterestSQL = `SELECT pg_catalog.count(*) FILTER (WHERE pg_catalog.pg_advisory_unlock_shared(1885824620, k.id)) ` +
	`FROM pg_catalog.unnest($1::pg_catalog.int4[]) AS k(id)`

// interestRetryMin and interestRetryMax bound how soon the LISTEN
// connection tries again an interest key it was refused: a release holds
// it until it commits, an instant, so the first retry comes after 1 ms, and
// the pause doubles up to 20 ms while refusals go on (a stranger holding
// InterestClassID keys).
const interestRetryMin, interestRetryMax = time.Millisecond, 20 * time.Millisecond

// interestLocked counts w, about to wait for notifications, as interested
// in its name. It reports whether the LISTEN connection must take the key;
// when the key was taken after w registered, it wakes w, whose attempt may
// have come before. k.mu is held.
func (k *Locker) interestLocked(w *waiter) (arm bool) {
	if k.hooks != nil && k.hooks.noInterest {
		return false
	}
	in := k.interests[w.name]
	if in == nil {
		in = &interest{id: k.notifyKey.InterestID(w.name)}
		k.interests[w.name] = in
	}
	in.waiters++
	if in.held && !w.armed && (k.hooks == nil || !k.hooks.noArmWake) {
		w.wake()
	}
	return !in.held
}

// dropInterestLocked uncounts a waiter of name that waited for
// notifications; after the last one, the LISTEN connection releases the
// key once interestLinger has passed. k.mu is held.
func (k *Locker) dropInterestLocked(name string) {
	in := k.interests[name]
	if in == nil {
		return
	}
	in.waiters--
	if in.waiters == 0 {
		in.idle = time.Now()
		if k.listener != nil && !k.closed {
			k.listener.Kick() // plans the key's release after the linger
		}
	}
}

// interestLinger is how long a key stays held after the name's last waiter
// left: a Locker that waits for a name again and again (a hand-over back
// and forth) keeps it, so that a release soon after notifies it at once
// rather than after it took the key again. It matches listenLinger, for
// which the connection stays subscribed.
const interestLinger = listenLinger

// applyInterests takes the interest keys that waiters need and releases
// those nobody needed for interestLinger, on the LISTEN connection (the notifier's
// Apply hook, bounded by ctx), then wakes the waiters of each name whose
// key it took, when the connection is subscribed. It asks to run again after interestRetry when a key was
// refused.
func (k *Locker) applyInterests(ctx context.Context, conn *pgx.Conn) (retryIn time.Duration, err error) {
	k.mu.Lock()
	var take, drop []string
	var takeIDs, dropIDs []int32
	for name, in := range k.interests {
		switch {
		case in.waiters > 0 && !in.held:
			take, takeIDs = append(take, name), append(takeIDs, in.id)
		case in.waiters == 0 && in.held && time.Since(in.idle) < interestLinger:
			retryIn = soonest(retryIn, interestLinger-time.Since(in.idle))
		case in.waiters == 0 && in.held:
			drop, dropIDs = append(drop, name), append(dropIDs, in.id)
		case in.waiters == 0:
			delete(k.interests, name)
		}
	}
	k.mu.Unlock()
	if len(drop) > 0 {
		var n int64
		if err := conn.QueryRow(ctx, dropInterestSQL, dropIDs).Scan(&n); err != nil {
			return 0, fmt.Errorf("pgfence: leasetable: release interest keys: %w", err)
		}
		if n != int64(len(drop)) {
			return 0, fmt.Errorf("pgfence: leasetable: released %d of %d interest keys", n, len(drop))
		}
		k.mu.Lock()
		for _, name := range drop {
			in := k.interests[name]
			in.held = false
			if in.waiters == 0 {
				delete(k.interests, name)
			} else {
				retryIn = soonest(retryIn, time.Nanosecond) // registered again meanwhile
			}
		}
		k.mu.Unlock()
	}
	if len(take) == 0 {
		return retryIn, nil
	}
	if k.hooks != nil && k.hooks.onArm != nil {
		k.hooks.onArm(take)
	}
	rows, err := conn.Query(ctx, takeInterestSQL, takeIDs)
	if err != nil {
		return 0, fmt.Errorf("pgfence: leasetable: take interest keys: %w", err)
	}
	granted, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		return 0, fmt.Errorf("pgfence: leasetable: take interest keys: %w", err)
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	for _, i := range granted {
		name := take[i-1]
		in := k.interests[name]
		in.held = true
		if in.waiters == 0 {
			retryIn = soonest(retryIn, interestLinger) // no longer needed: release it after the linger
		}
		// Not yet subscribed: subscribing, later in this turn, wakes every
		// waiter (see listening).
		if k.listener.Listening() && (k.hooks == nil || !k.hooks.noArmWake) {
			for w := range k.waiters[name] {
				w.wake()
			}
		}
	}
	if len(granted) < len(take) {
		// Held exclusively: by a release until it commits, or by a stranger
		// using InterestClassID (then every release notifies anyway).
		k.interestRefusals++
		retryIn = soonest(retryIn, retry.Backoff{Min: interestRetryMin, Max: interestRetryMax}.Wait(k.interestRefusals))
	} else {
		k.interestRefusals = 0
	}
	return retryIn, nil
}

// soonest returns the shorter of two retry delays, zero meaning none.
func soonest(a, b time.Duration) time.Duration {
	if a == 0 || (b > 0 && b < a) {
		return b
	}
	return a
}

// listenEnded is the notifier's Ended hook: the connection, and with it
// every interest key, is gone.
func (k *Locker) listenEnded(bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	for name, in := range k.interests {
		in.held = false
		if in.waiters == 0 {
			delete(k.interests, name)
		}
	}
}
