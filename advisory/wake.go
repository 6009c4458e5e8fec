package advisory

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgfence/pgfence/internal/listenconn"
)

// Wake-ups across sessions.
//
// A Lock that has waited a while for a key held by another session
// registers interest in it: the Locker's LISTEN connection (one per Locker,
// opened on first use) takes a shared session lock on the key's interest
// key, and the waiter retries whenever a notification for the key arrives.
// Unlock of a lock held at least notifyAfterHeld (unlockNotifySQL) releases
// the key and, in the same statement, tries the interest key exclusively:
// only when that fails, because some LISTEN connection holds it shared,
// does it send NOTIFY. Unlocks nobody waits for therefore never notify, and
// pay one lock-table operation inside the server instead of NOTIFY's
// database-wide lock at commit; unlocks of shorter holds pay nothing.
//
// Interest keys use the two-argument key space, pg_advisory_lock(int4,
// int4), with InterestClassID as the first argument and a 32-bit fold of
// the key as the second (interestObjIDSQL). That space never meets a Key
// (the bigint form is a different space) nor golang-migrate's lock (also
// bigint). Distinct keys may share an interest key: that costs a needless
// NOTIFY, never a missed one, as the payload names the key itself.
//
// Nothing depends on the notifications for correctness: a waiter keeps
// polling at its (capped) pace, and only retries sooner when woken.

// InterestClassID is the first argument of the two-argument advisory locks
// (pg_advisory_lock(int4, int4)) that waiting Lock calls take on their
// Locker's LISTEN connection to ask for a NOTIFY when the key they wait for
// is unlocked. Other clients of the database should not use this value as
// the first argument of two-argument advisory locks: holding such a key
// exclusively makes every pgfence Unlock of the keys that fold to it send
// a needless NOTIFY, and keeps waiters from registering (they then wait by
// polling alone). It is the big-endian reading of the bytes "pgfw".
const InterestClassID int32 = 0x70676677

// NotifyChannel is the channel on which Unlock notifies waiting Lock calls
// of other Lockers; the payload is the key as a decimal int64.
const NotifyChannel = "pgfence_advisory_released"

// interestObjIDSQL folds the bigint key $1 to the int4 second argument of
// its interest key: the xor of its two halves, as a signed 32-bit integer.
// Operators resolve through search_path like functions do, so they are
// named in pg_catalog too (as in takeInterestSQL and dropInterestSQL).
const interestObjIDSQL = `((($1::pg_catalog.int8 OPERATOR(pg_catalog.#) ($1::pg_catalog.int8 OPERATOR(pg_catalog.>>) 32)) ` +
	`OPERATOR(pg_catalog.&) 4294967295) OPERATOR(pg_catalog.-) 2147483648)::pg_catalog.int4`

// interestAfter is the poll pause from which a waiting Lock registers
// interest: with pauses of 5, 10, 20, 40, 80ms..., after four failed
// retries (about 40-75ms of waiting). Shorter waits end by polling alone,
// so that busy short-held keys do not turn every Unlock into a NOTIFY.
// With 16 Lockers contending for 4 keys held 2ms each
// (BenchmarkContendedLockAcrossLockers), when every Unlock still looked for
// waiters (before notifyAfterHeld), registering from a pause of 40ms cost
// about 7% of the cycles per second, from 80ms about 2.5%, from 160ms
// nothing measurable; long holds are woken alike from any of them.
const interestAfter = 80 * time.Millisecond

// notifyAfterHeld is how long a lock must have been held for its Unlock to
// look for waiters to notify. A Lock of another session registers only
// after waiting 40-75ms (interestAfter), and the holders it waited for held
// the key all that while, the last one usually for most of it; an Unlock
// of a lock held less long sends no NOTIFY, and a registered waiter that
// lost races to such short holders polls. So the unlocks of short holds,
// the ones that bound throughput, pay nothing for wake-ups: checking on
// every Unlock cost about 3-4% of uncontended throughput.
const notifyAfterHeld = 20 * time.Millisecond

// takeInterestSQL takes a shared session lock on the interest key of each
// key in $1, without waiting; it returns the keys whose lock was granted.
const takeInterestSQL = `SELECT k FROM pg_catalog.unnest($1::pg_catalog.int8[]) AS k ` +
	`WHERE pg_catalog.pg_try_advisory_lock_shared(` + interestClassIDText + `, (((k OPERATOR(pg_catalog.#) (k OPERATOR(pg_catalog.>>) 32)) ` +
	`OPERATOR(pg_catalog.&) 4294967295) OPERATOR(pg_catalog.-) 2147483648)::pg_catalog.int4)`

// dropInterestSQL releases one shared session lock on the interest key of
// each key in $1.
const dropInterestSQL = `SELECT pg_catalog.count(*) FILTER (WHERE pg_catalog.pg_advisory_unlock_shared(` + interestClassIDText +
	`, (((k OPERATOR(pg_catalog.#) (k OPERATOR(pg_catalog.>>) 32)) OPERATOR(pg_catalog.&) 4294967295) OPERATOR(pg_catalog.-) 2147483648)::pg_catalog.int4)) ` +
	`FROM pg_catalog.unnest($1::pg_catalog.int8[]) AS k`

const interestClassIDText = "1885824631"

// interest is the wake-up state of one key that waiting Lock calls of this
// Locker registered for. Guarded by Locker.mu.
type interest struct {
	waiters int           // registered Lock calls
	held    bool          // the LISTEN connection holds the interest lock
	armed   chan struct{} // closed once held (on the current connection)
	wake    chan struct{} // closed (and replaced) when the key may be free
}

// waitReg is one Lock call's registration.
type waitReg struct {
	id int64
	in *interest
}

// register records interest in key id for a waiting Lock and asks the
// LISTEN loop, starting it on first use, to take the interest lock. It
// returns nil after Close or when Config.DisableListen is set. It never
// waits for the database.
func (k *Locker) register(id int64) *waitReg {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.closed || k.cfg.DisableListen {
		return nil
	}
	in := k.interests[id]
	if in == nil {
		in = &interest{armed: make(chan struct{}), wake: make(chan struct{})}
		k.interests[id] = in
	}
	in.waiters++
	if !k.listenStarted {
		k.listenStarted = true
		k.wg.Add(1)
		go k.listen()
	}
	k.kickLocked()
	return &waitReg{id: id, in: in}
}

// unregister drops a registration; the LISTEN loop releases the interest
// lock once no waiter of this Locker needs it.
func (k *Locker) unregister(r *waitReg) {
	k.mu.Lock()
	defer k.mu.Unlock()
	r.in.waiters--
	if r.in.waiters == 0 {
		k.kickLocked()
	}
}

// channels returns the channels a registered waiter selects on: armed until
// its interest lock is held, and the current wake channel.
func (k *Locker) channels(r *waitReg) (armed, wake chan struct{}) {
	k.mu.Lock()
	defer k.mu.Unlock()
	return r.in.armed, r.in.wake
}

// kickLocked interrupts the LISTEN loop's wait so that it applies changed
// interests. The caller holds l.mu.
func (k *Locker) kickLocked() {
	k.listenDirty = true
	if k.listenInterrupt != nil {
		k.listenInterrupt()
		k.listenInterrupt = nil
	}
}

// wakeLocked wakes the waiters of in. The caller holds l.mu.
func (in *interest) wakeLocked() {
	close(in.wake)
	in.wake = make(chan struct{})
}

// errListenIdle ends listenOnce when no Lock has waited for
// SessionIdleTimeout.
var errListenIdle = errors.New("pgfence: advisory: LISTEN connection idle")

// listen keeps the LISTEN connection open until the Locker is closed, or
// until no Lock has been registered for Config.SessionIdleTimeout (the next
// registration starts it again), reconnecting with capped exponential
// backoff when it fails.
func (k *Locker) listen() {
	defer k.wg.Done()
	const minBackoff, maxBackoff = 50 * time.Millisecond, 5 * time.Second
	backoff := minBackoff
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		connected, err := k.listenOnce()
		if errors.Is(err, errListenIdle) {
			k.log.Debug("pgfence: advisory: idle LISTEN connection closed")
			return
		}
		k.disarmAll(connected)
		if k.closeCtx.Err() != nil || k.stopListenIfUnused() {
			return
		}
		if connected {
			backoff = minBackoff
		}
		k.log.Warn("pgfence: advisory: LISTEN connection failed; waiting Lock calls fall back to polling until it is back",
			"error", err, "retry_in", backoff)
		timer.Reset(backoff/2 + rand.N(backoff/2+1))
		select {
		case <-timer.C:
		case <-k.closeCtx.Done():
			return
		}
		backoff = min(2*backoff, maxBackoff)
	}
}

// disarmAll records that no interest lock is held any more (the LISTEN
// connection ended). When the connection had been listening, it wakes every
// waiter, so each retries at once: a release may have gone unnoticed.
func (k *Locker) disarmAll(wake bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.listenInterrupt = nil
	k.listenDirty = true
	for _, in := range k.interests {
		if in.held {
			in.held = false
			in.armed = make(chan struct{})
		}
		if wake {
			in.wakeLocked()
		}
	}
}

// listenOnce connects, listens and applies interests and notifications
// until the connection fails or the Locker is closed. connected reports
// whether LISTEN succeeded.
func (k *Locker) listenOnce() (connected bool, err error) {
	// The connection is the Locker's own, its notifications buffered for
	// WaitForNotification; a wait ended by its context (to apply changed
	// interests, or for a health check) leaves it usable (see
	// listenconn.Config).
	conn, err := listenconn.Open(k.closeCtx, k.listenConfig, NotifyChannel)
	if err != nil {
		return false, err
	}
	defer listenconn.Close(conn)
	k.log.Debug("pgfence: advisory: LISTEN connection ready", "channel", NotifyChannel)
	for {
		if err := k.applyInterests(conn); err != nil {
			return true, err
		}
		n, err := k.nextNotification(conn)
		if err != nil {
			return true, err
		}
		if n != nil {
			k.notified(n.Payload)
		}
	}
}

// notified wakes the waiters of the key named by payload.
func (k *Locker) notified(payload string) {
	id, err := strconv.ParseInt(payload, 10, 64)
	if err != nil {
		return
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	if in := k.interests[id]; in != nil {
		in.wakeLocked()
	}
}

// applyInterests takes the interest locks that waiters need and releases
// those nobody needs any more, on the LISTEN connection.
func (k *Locker) applyInterests(conn *pgx.Conn) error {
	k.mu.Lock()
	if !k.listenDirty {
		k.mu.Unlock()
		return nil
	}
	k.listenDirty = false
	var take, drop []int64
	for id, in := range k.interests {
		switch {
		case in.waiters > 0 && !in.held:
			take = append(take, id)
		case in.waiters == 0 && in.held:
			drop = append(drop, id)
		case in.waiters == 0:
			delete(k.interests, id)
		}
	}
	k.mu.Unlock()

	ctx, cancel := context.WithTimeout(k.closeCtx, k.cfg.QueryTimeout)
	defer cancel()
	if len(drop) > 0 {
		var n int64
		if err := conn.QueryRow(ctx, dropInterestSQL, drop).Scan(&n); err != nil {
			return fmt.Errorf("pgfence: advisory: release interest locks: %w", err)
		}
		if n != int64(len(drop)) {
			return fmt.Errorf("pgfence: advisory: released %d of %d interest locks", n, len(drop))
		}
		k.mu.Lock()
		for _, id := range drop {
			in := k.interests[id]
			in.held = false
			in.armed = make(chan struct{})
			if in.waiters == 0 {
				delete(k.interests, id)
			} else {
				// Registered again meanwhile: take it again.
				k.listenDirty = true
			}
		}
		k.mu.Unlock()
	}
	if len(take) > 0 {
		rows, err := conn.Query(ctx, takeInterestSQL, take)
		if err != nil {
			return fmt.Errorf("pgfence: advisory: take interest locks: %w", err)
		}
		granted, err := pgx.CollectRows(rows, pgx.RowTo[int64])
		if err != nil {
			return fmt.Errorf("pgfence: advisory: take interest locks: %w", err)
		}
		k.mu.Lock()
		for _, id := range granted {
			in := k.interests[id]
			in.held = true
			close(in.armed)
			if in.waiters == 0 {
				k.listenDirty = true // dropped meanwhile: release it
			}
		}
		if len(granted) < len(take) {
			// An interest key is held exclusively: by an Unlock's
			// statement for an instant, or by someone else using
			// InterestClassID. Retry at the next check; the waiters
			// poll meanwhile.
			k.listenRetry = true
		}
		k.mu.Unlock()
	}
	return nil
}

// listenRetryInterval is how soon the LISTEN loop retries interest locks
// that were not granted.
const listenRetryInterval = 20 * time.Millisecond

// nextNotification waits for the next notification on conn. It returns
// (nil, nil) when interests changed. It wakes every
// Config.SessionCheckInterval to close the connection once no Lock waits,
// and whenever nothing has arrived for Config.ListenCheckInterval it checks
// the connection with a round trip bounded by Config.QueryTimeout, and
// returns an error if the check fails.
func (k *Locker) nextNotification(conn *pgx.Conn) (*pgconn.Notification, error) {
	lastHeard := time.Now()
	for {
		k.mu.Lock()
		if k.listenDirty {
			k.mu.Unlock()
			return nil, nil
		}
		interval := k.cfg.SessionCheckInterval
		if k.listenRetry {
			k.listenRetry = false
			k.listenDirty = true
			interval = listenRetryInterval
		}
		ctx, cancel := context.WithTimeout(k.closeCtx, interval)
		k.listenInterrupt = cancel
		k.mu.Unlock()
		n, err := conn.WaitForNotification(ctx)
		interrupted := ctx.Err() != nil
		cancel()
		k.mu.Lock()
		k.listenInterrupt = nil
		dirty := k.listenDirty
		k.mu.Unlock()
		// A wait ended by its own context (the interval, or a change of
		// interests) fails with a timeout or context error, and leaves
		// the connection usable (see listenconn.Config).
		ended := interrupted && (pgconn.Timeout(err) ||
			errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded))
		if err == nil || k.closeCtx.Err() != nil || !ended || conn.IsClosed() {
			return n, err
		}
		if dirty {
			return nil, nil
		}
		if k.retireListenIfIdle() {
			return nil, errListenIdle
		}
		if k.cfg.ListenCheckInterval < 0 || time.Since(lastHeard) < k.cfg.ListenCheckInterval {
			continue
		}
		lastHeard = time.Now()
		// Nothing arrived for an interval and the connection is still
		// usable: check it. If the check times out, pgconn closes the
		// connection, and listenconn.Close waits for that.
		ctx, cancel = context.WithTimeout(k.closeCtx, k.cfg.QueryTimeout)
		err = listenconn.Check(ctx, conn, NotifyChannel)
		cancel()
		if err != nil {
			if k.closeCtx.Err() != nil {
				return nil, err
			}
			return nil, fmt.Errorf("pgfence: advisory: health check of the LISTEN connection failed: %w", err)
		}
	}
}

// stopListenIfUnused forgets the interests no Lock waits for any more and,
// when none is left, marks the LISTEN loop stopped (the next registration
// starts a new one) and reports that it must end rather than reconnect.
func (k *Locker) stopListenIfUnused() bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	for id, in := range k.interests {
		if in.waiters == 0 {
			delete(k.interests, id) // not held: disarmAll ran
		}
	}
	if len(k.interests) > 0 {
		return false
	}
	k.listenStarted = false
	return true
}

// retireListenIfIdle reports whether the LISTEN connection has had no
// interest for Config.SessionIdleTimeout; if so, the LISTEN loop is marked
// stopped (the next registration starts a new one) and must end.
func (k *Locker) retireListenIfIdle() bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	if len(k.interests) > 0 {
		k.listenIdleSince = time.Time{}
		return false
	}
	if k.listenIdleSince.IsZero() {
		k.listenIdleSince = time.Now()
	}
	if time.Since(k.listenIdleSince) < k.cfg.SessionIdleTimeout {
		return false
	}
	k.listenIdleSince = time.Time{}
	k.listenStarted = false
	return true
}
