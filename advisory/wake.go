package advisory

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgfence/pgfence"
	"github.com/pgfence/pgfence/internal/events"
	"github.com/pgfence/pgfence/internal/notifier"
)

// Wake-ups across sessions: a waiting call registers interest in its key,
// and the Locker's LISTEN connection takes a shared lock on the key's
// interest key; an unlock that finds that lock held sends NOTIFY (see
// docs/advisory.md, Waiting). The notifications only hasten a retry.

// InterestClassID is the first argument of the two-argument advisory locks
// that waiting calls take, on their Locker's LISTEN connection, to ask for
// a NOTIFY when their key is released: the bytes "pgfw". Other clients of
// the database should not use it as the first argument of such locks.
const InterestClassID int32 = 0x70676677

// NotifyChannel is the channel on which a Release notifies the waiting
// calls of other Lockers; the payload is the key as a decimal int64.
const NotifyChannel = "pgfence_advisory_released"

// interestObjIDSQL folds the bigint key $1 to the int4 second argument of
// its interest key: the xor of its two halves, as a signed 32-bit integer.
const interestObjIDSQL = `((($1::pg_catalog.int8 OPERATOR(pg_catalog.#) ($1::pg_catalog.int8 OPERATOR(pg_catalog.>>) 32)) ` +
	`OPERATOR(pg_catalog.&) 4294967295) OPERATOR(pg_catalog.-) 2147483648)::pg_catalog.int4`

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

// interest is the wake-up state of a key that a line of waiting calls of
// this Locker registered for. Guarded by Locker.mu.
type interest struct {
	waiters int           // registered lines: 0 or 1, a line per key (Locker.lineRegs)
	held    bool          // the LISTEN connection holds the interest lock
	armed   chan struct{} // closed once held (on the current connection)
	wake    chan struct{} // closed (and replaced) when the key may be free
	// values is the ctx (values only) of the call that registered first:
	// the interest statements carry it.
	values context.Context
}

// waitReg is the registration of one line of waiting calls.
type waitReg struct {
	id int64
	in *interest
}

// registerLocked records interest in key id for a line of waiting calls
// (whose head's ctx is values) and asks the LISTEN loop, started on first
// use, to take the interest lock. It returns nil after Close or with
// Config.DisableListen, and never waits for the database. The caller holds
// k.mu.
func (k *Locker) registerLocked(values context.Context, id int64) *waitReg {
	if k.closed || k.cfg.DisableListen {
		return nil
	}
	in := k.interests[id]
	if in == nil {
		in = &interest{armed: make(chan struct{}), wake: make(chan struct{}), values: context.WithoutCancel(values)}
		k.interests[id] = in
	}
	in.waiters++
	if k.listener == nil {
		ls := &listenRun{}
		k.listener = notifier.Start(k.closeCtx, notifier.Config{
			ConnConfig:    k.listenConfig,
			Channel:       NotifyChannel,
			CheckInterval: k.cfg.ListenCheckInterval,
			CheckTimeout:  k.cfg.QueryTimeout,
			Logger:        k.log,
			LogPrefix:     "pgfence: advisory",
			Notify:        k.notified,
			Listening:     k.listenUp,
			Ended:         func(wasListening bool) { k.listenEnded(ls, wasListening) },
			Apply:         k.applyInterests,
			Idle:          func(connDown bool) bool { return k.listenIdle(ls, connDown) },
			IdleCheck:     k.cfg.SessionCheckInterval,
		}, &k.wg)
	}
	k.listener.Kick()
	return &waitReg{id: id, in: in}
}

// listenRun is the state of one run of the LISTEN loop (a Notifier).
// Guarded by Locker.mu.
type listenRun struct {
	idle bool // its Idle hook told it to stop
}

// errListenEnded is the Err of a ListenLost: the notifier logs the
// connection's own error (Warn), and tells the Locker only that it ended.
var errListenEnded = errors.New("pgfence: advisory: the LISTEN connection ended")

// listenUp is the notifier's Listening hook: a connection is listening.
// After a ListenLost it sends ListenRestored.
func (k *Locker) listenUp() {
	k.mu.Lock()
	k.listening = true
	lostAt := k.listenLostAt
	k.listenLostAt = time.Time{}
	k.mu.Unlock()
	if !lostAt.IsZero() && k.ev != nil {
		k.ev.Async(context.Background(), pgfence.ListenRestored{Kind: pgfence.StrategyAdvisory, Down: time.Since(lostAt)})
	}
}

// listenEnded is the notifier's Ended hook: a connection ended, or failed
// to start listening. It disarms the interests (waking every waiter when it
// had been listening) and sends ListenLost once per outage, unless nobody
// needs the connection any more or the Locker closed.
func (k *Locker) listenEnded(ls *listenRun, wasListening bool) {
	k.disarmAll(wasListening)
	k.mu.Lock()
	k.listening = false
	wanted := false // by a waiting call; if not, the notifier stops (listenIdle)
	for _, in := range k.interests {
		wanted = wanted || in.waiters > 0
	}
	lost := wanted && !ls.idle && k.closeCtx.Err() == nil && k.listenLostAt.IsZero()
	if lost {
		k.listenLostAt = time.Now()
	}
	k.mu.Unlock()
	if lost && k.ev != nil {
		k.ev.Async(context.Background(), pgfence.ListenLost{Kind: pgfence.StrategyAdvisory, Err: errListenEnded})
	}
}

// unregister drops a registration; the LISTEN loop releases the interest
// lock once no waiter of this Locker needs it.
func (k *Locker) unregister(r *waitReg) {
	k.mu.Lock()
	defer k.mu.Unlock()
	r.in.waiters--
	if r.in.waiters == 0 && k.listener != nil {
		k.listener.Kick()
	}
}

// wakeLocked wakes the waiters of in. The caller holds k.mu.
func (in *interest) wakeLocked() {
	close(in.wake)
	in.wake = make(chan struct{})
}

// disarmAll records that no interest lock is held any more (the LISTEN
// connection ended). When the connection had been listening, it wakes every
// waiter, so each retries at once: a release may have gone unnoticed.
func (k *Locker) disarmAll(wake bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
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

// notified wakes the waiters of the key named by payload.
func (k *Locker) notified(payload string) {
	id, err := strconv.ParseInt(payload, 10, 64)
	if err != nil {
		return
	}
	k.mu.Lock()
	in := k.interests[id]
	if in != nil {
		in.wakeLocked()
	}
	k.mu.Unlock()
	if in != nil {
		k.hooks.notified()
	}
}

// applyInterests takes the interest locks that waiters need and releases
// those nobody needs any more, on the LISTEN connection (the notifier's
// Apply hook, bounded by ctx). It asks to run again after retryIn when an
// interest lock was refused, or at once when interests changed meanwhile.
func (k *Locker) applyInterests(ctx context.Context, conn *pgx.Conn) (retryIn time.Duration, err error) {
	k.mu.Lock()
	var take, drop []int64
	var values context.Context // of a waiter served; the statements carry it
	for id, in := range k.interests {
		switch {
		case in.waiters > 0 && !in.held:
			take = append(take, id)
			if values == nil {
				values = in.values
			}
		case in.waiters == 0 && in.held:
			drop = append(drop, id)
		case in.waiters == 0:
			delete(k.interests, id)
		}
	}
	k.mu.Unlock()
	ctx, stop := events.Values(values, ctx)
	defer stop()

	if len(drop) > 0 {
		var n int64
		if err := conn.QueryRow(ctx, dropInterestSQL, drop).Scan(&n); err != nil {
			return 0, fmt.Errorf("pgfence: advisory: release interest locks: %w", err)
		}
		if n != int64(len(drop)) {
			return 0, fmt.Errorf("pgfence: advisory: released %d of %d interest locks", n, len(drop))
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
				retryIn = again
			}
		}
		k.mu.Unlock()
	}
	if len(take) > 0 {
		rows, err := conn.Query(ctx, takeInterestSQL, take)
		if err != nil {
			return 0, fmt.Errorf("pgfence: advisory: take interest locks: %w", err)
		}
		granted, err := pgx.CollectRows(rows, pgx.RowTo[int64])
		if err != nil {
			return 0, fmt.Errorf("pgfence: advisory: take interest locks: %w", err)
		}
		k.mu.Lock()
		for _, id := range granted {
			in := k.interests[id]
			in.held = true
			close(in.armed)
			if in.waiters == 0 {
				retryIn = again // dropped meanwhile: release it
			}
		}
		if len(granted) < len(take) {
			// Held exclusively: by a release for an instant, or by a
			// stranger using InterestClassID. Retry; waiters poll.
			retryIn = listenRetryInterval
		}
		k.mu.Unlock()
	}
	return retryIn, nil
}

// again is the retryIn of an Apply that must run again at once.
const again = time.Nanosecond

// listenRetryInterval is how soon the LISTEN loop retries interest locks
// that were not granted.
const listenRetryInterval = 20 * time.Millisecond

// listenIdle is the notifier's Idle hook: the LISTEN connection is no
// longer needed once nothing has registered for SessionIdleTimeout, or at
// once when it is down and nothing is registered. It then records that the
// notifier stopped; the next registration starts one.
func (k *Locker) listenIdle(ls *listenRun, connDown bool) bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	if connDown {
		for id, in := range k.interests {
			if in.waiters == 0 {
				delete(k.interests, id) // not held: disarmAll ran
			}
		}
	}
	if len(k.interests) > 0 {
		k.listenIdleSince = time.Time{}
		return false
	}
	if k.listenIdleSince.IsZero() {
		k.listenIdleSince = time.Now()
	}
	if !connDown && time.Since(k.listenIdleSince) < k.cfg.SessionIdleTimeout {
		return false
	}
	k.listenIdleSince = time.Time{}
	k.listener = nil
	ls.idle = true
	k.listenLostAt = time.Time{}
	return true
}
