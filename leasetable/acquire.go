package leasetable

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/pgfence/pgfence"
	"github.com/pgfence/pgfence/internal/permerr"
)

// acquireSQL takes a batch of leases in one statement (%[1]s is the
// schema), through pgfence_acquire, a SECURITY DEFINER function (the
// application role cannot write the table itself). For each name it
// inserts the missing row or takes over the row whose lease has expired
// (expires_at <= now(), database clock), drawing a fresh token under the
// row lock, in name order, so two batches over the same names cannot
// deadlock with each other. It returns one row per name: the new lease
// (true), or the current holder (false); no row when the holder committed
// after the statement's snapshot. A failed attempt on a held lease draws no
// token and locks nothing. Names must be distinct.
//
// $1 names, $2 owner, $3 TTLs in microseconds (parallel arrays).
const acquireSQL = `SELECT acquired, name, owner, fence, acquired_at, expires_at, db_now, secret FROM %[1]s.pgfence_acquire($1, $2, $3)`

// expiryJitter bounds the random delay a waiter adds to the holder's
// expiry before it retries, so that the waiters of several Lockers do not
// all retry in the same instant. Each such retry is one cheap statement
// (the waiters of one Locker share one), so a few milliseconds suffice; a
// waiter is late by at most that much plus a round trip.
const expiryJitter = 5 * time.Millisecond

// attempt is an acquire statement in flight for one name, which waiting
// Acquire calls of the same Locker may wait for instead of sending their
// own (see try).
type attempt struct {
	seq  uint64        // Locker.waiterSeq when it started
	done chan struct{} // closed when answered; then the fields below are set
	// refused is set when the lease was held by someone else (or the
	// holder committed after the statement's snapshot); local and retryIn
	// are then try's answer.
	refused bool
	local   bool
	retryIn time.Duration
}

// try runs one acquire attempt (batched with concurrent attempts of this
// Locker). It returns the lease when taken. Otherwise local reports that
// another caller of this Locker holds it (its release wakes the waiters at
// once), and retryIn how long to wait before the next attempt, judged from
// the holder's expiry.
//
// A waiting Acquire (w not nil) that finds another attempt of this Locker
// in flight for name waits for its answer instead of sending its own, and
// takes a refusal as its own: after a release wakes a Locker's waiters,
// one statement asks, not one per waiter. It does so only when w was
// registered before that attempt started, so that a release after the
// attempt's snapshot has woken w (which then tries again at once) rather
// than being hidden by the shared refusal.
func (k *Locker) try(ctx context.Context, name string, t leaseTiming, attempts *int, w *waiter) (l *Lease, local bool, retryIn time.Duration, err error) {
	k.mu.Lock()
	for {
		if h, ok := k.held[name]; ok {
			// The holder's release or loss wakes this Locker's waiters;
			// until then nothing changes, so retry at its local deadline
			// at the latest (not at once, which would spin).
			retryIn = max(time.Until(h.deadline), time.Millisecond)
			k.mu.Unlock()
			return nil, true, retryIn, nil
		}
		a := k.attempts[name]
		if a == nil || w == nil || w.seq > a.seq || k.noShare {
			break
		}
		k.mu.Unlock()
		select {
		case <-a.done:
		case <-ctx.Done():
			return nil, false, 0, ctx.Err()
		}
		if a.refused {
			return nil, a.local, a.retryIn, nil
		}
		// It failed, or took the lease for its caller: look again.
		k.mu.Lock()
	}
	a := &attempt{seq: k.waiterSeq, done: make(chan struct{})}
	if k.attempts[name] == nil {
		k.attempts[name] = a
	}
	k.mu.Unlock()
	defer func() {
		k.mu.Lock()
		if k.attempts[name] == a {
			delete(k.attempts, name)
		}
		k.mu.Unlock()
		close(a.done)
	}()
	l, local, retryIn, err = k.attempt(ctx, name, t, attempts)
	if l == nil && err == nil {
		a.refused, a.local, a.retryIn = true, local, retryIn
	}
	return l, local, retryIn, err
}

// attempt sends one acquire attempt for try.
func (k *Locker) attempt(ctx context.Context, name string, t leaseTiming, attempts *int) (l *Lease, local bool, retryIn time.Duration, err error) {
	*attempts++
	rep, err := k.submitAcquire(ctx, name, t)
	if err == nil && rep.acquired {
		defer k.granting.Done() // adopted or given back: Close may return
	}
	if err == nil {
		err = rep.err
	}
	if err != nil && ctx.Err() == nil && k.closeCtx.Err() != nil {
		// Close cancelled the statement.
		return nil, false, 0, fmt.Errorf("pgfence: leasetable: acquire %q: %w", name, pgfence.ErrClosed)
	}
	if err != nil {
		return nil, false, 0, err // the caller says which lease
	}
	if !rep.found || rep.busy {
		// The holder committed after our snapshot, or another transaction
		// is claiming the name or holds its expired row: retry soon.
		return nil, false, jitter(10*time.Millisecond, 50*time.Millisecond), nil
	}
	if !rep.acquired {
		k.noteHolder(name, rep.token)
		// Clamped: an expiry further ahead than any pgfence function writes
		// (set by hand) must not overflow the wait into a busy loop.
		wait := min(max(rep.expiresAt.Sub(rep.dbNow), 0), MaxTTL)
		return nil, rep.owner == k.cfg.Owner, wait + jitter(time.Millisecond, expiryJitter), nil
	}
	l = k.newLease(ctx, name, rep, t)
	if !time.Now().Before(l.deadline) {
		// The answer came after the lease's local deadline (its commit
		// waited longer than the TTL, say for a synchronous standby): it
		// may be granted to another owner any moment, so it is given back,
		// never handed out with Done already closed.
		k.giveBack([]giveBackReq{{ctx, name, rep.token, rep.secret}})
		return nil, false, 0, fmt.Errorf("pgfence: leasetable: lease %q (token %d) was granted %v after the acquire was sent, past its local deadline (TTL %v less margin %v); given back: %w: %w",
			name, rep.token, time.Since(rep.sent).Round(time.Millisecond), t.ttl, t.margin, errLateGrant, pgfence.ErrNotAcquired)
	}
	if !k.adopt(l) {
		// Closed while acquiring: give it straight back.
		l.cancel(errLostClosed)
		k.giveBack([]giveBackReq{{ctx, name, rep.token, rep.secret}})
		return nil, false, 0, fmt.Errorf("pgfence: leasetable: acquire %q: %w", name, pgfence.ErrClosed)
	}
	k.cfg.Logger.DebugContext(ctx, "pgfence: leasetable: acquired", "lease", name, "token", rep.token, "ttl", t.ttl)
	return l, false, 0, nil
}

// errLateGrant marks a grant that arrived after its local deadline.
var errLateGrant = errors.New("granted too late")

// adopt starts renewing l. It reports false when the Locker was closed.
func (k *Locker) adopt(l *Lease) bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.closed {
		return false
	}
	k.leases[l] = struct{}{}
	k.held[l.name] = l
	l.adopted = true
	l.timer = time.AfterFunc(time.Until(l.deadline), func() { k.checkDeadline(l) })
	if l.timing.maxHold > 0 {
		l.maxTimer = time.AfterFunc(time.Until(l.grantedAt.Add(l.timing.maxHold)), func() { k.maxHoldReached(l) })
	}
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

// acquireReq is one caller's request to acquire a lease.
type acquireReq struct {
	ctx   context.Context
	name  string
	ttlUs int64

	mu        sync.Mutex
	abandoned bool              // the caller stopped waiting
	res       chan acquireReply // buffered(1)
}

// acquireReply is the outcome of one acquire request.
type acquireReply struct {
	found                 bool // a row came back
	busy                  bool // another transaction claims the name or locks its row
	acquired              bool
	owner                 string
	token                 int64
	secret                string // the acquisition's secret, when acquired
	acquiredAt, expiresAt time.Time
	dbNow                 time.Time
	sent                  time.Time // when the statement was sent
	err                   error
}

// submitAcquire runs one acquire through the Locker's batcher and waits for
// the reply or the end of ctx.
func (k *Locker) submitAcquire(ctx context.Context, name string, t leaseTiming) (acquireReply, error) {
	r := &acquireReq{ctx: ctx, name: name, ttlUs: t.ttl.Microseconds(), res: make(chan acquireReply, 1)}
	k.acquires.submit(r)
	select {
	case rep := <-r.res:
		return rep, nil
	case <-ctx.Done():
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	select {
	case rep := <-r.res:
		return rep, nil
	default:
		r.abandoned = true
		return acquireReply{}, ctx.Err()
	}
}

// failAcquire answers one acquire request with err.
func (k *Locker) failAcquire(r *acquireReq, err error) {
	k.replyAcquires([]*acquireReq{r}, nil, time.Time{}, err)
}

// execAcquires runs acquireSQL for batch and answers each request; on a
// statement error it answers none and returns the error. The statement's
// context carries the values of the first request's context (for tracers).
// The wait for a connection ends once every caller in the batch stopped
// waiting; the statement, once sent, runs to its answer (for at most
// QueryTimeout after the last caller left or Close began), so that a lease
// taken for a caller who stopped waiting, or after Close, is known and
// given back.
func (k *Locker) execAcquires(batch []*acquireReq) (err error) {
	defer func() { err = permerr.Wrap(err, "", k.cfg.Schema) }() // names the missing grant
	// One request per name; the others learn the first one's outcome as
	// "held" (by this Locker when the first one acquired it), exactly as
	// if they had run just after it.
	names := make([]string, 0, len(batch))
	ttls := make([]int64, 0, len(batch))
	seen := make(map[string]bool, len(batch))
	ctxs := make([]context.Context, 0, len(batch))
	for _, r := range batch {
		ctxs = append(ctxs, r.ctx)
		if !seen[r.name] {
			seen[r.name] = true
			names = append(names, r.name)
			ttls = append(ttls, r.ttlUs)
		}
	}
	// Until the statement is sent, it is abandoned with its callers (or
	// Close): the wait for a connection ends when all of them stopped
	// waiting. Once sent, it is not cancelled with them at once: a
	// statement cancelled in flight may still commit, and only its answer
	// tells which leases to give back. It gets QueryTimeout more after the
	// last caller left or Close began; Close waits for it, and for the
	// give-back.
	values := batch[0].ctx
	if k.ev.Enabled() && len(batch) > 1 {
		// One statement for several callers: an operation of its own,
		// under the opener's, linked to the others'.
		op := pgfence.Op{Kind: pgfence.OpAcquire, Strategy: pgfence.StrategyLeaseTable, Batch: len(batch), Links: ctxs[1:]}
		if len(names) == 1 {
			op.Name = names[0]
		}
		values = k.ev.StartOp(values, op)
		defer func() { k.ev.EndOp(values, op, err) }()
	}
	ctx, cancel := batchContext(k.closeCtx, values, ctxs)
	defer cancel()
	conn, err := k.conn(ctx, "acquire", k.cfg.QueryTimeout, false)
	if err != nil {
		return err
	}
	defer conn.Release()
	// No answer after the longest TTL of the batch would come too late
	// anyway (past every lease's local deadline, and so given back): the
	// statement is cancelled then, so that an attempt stuck on a dead
	// connection ends and is retried on another.
	qctx, qcancel := context.WithTimeout(context.WithoutCancel(ctx), time.Duration(slices.Max(ttls))*time.Microsecond)
	defer qcancel()
	if k.noGrantWait {
		// The negative control: Close cuts the statement, as it once did.
		defer context.AfterFunc(k.closeCtx, qcancel)()
	}
	var graceMu sync.Mutex
	var grace *time.Timer
	stopAbandon := context.AfterFunc(ctx, func() {
		graceMu.Lock()
		defer graceMu.Unlock()
		grace = time.AfterFunc(k.cfg.QueryTimeout, qcancel)
	})
	defer func() {
		stopAbandon()
		graceMu.Lock()
		defer graceMu.Unlock()
		if grace != nil {
			grace.Stop()
		}
	}()
	sent := time.Now()
	rows, err := conn.Query(qctx, k.sql.acquire, names, k.cfg.Owner, ttls)
	if err != nil {
		k.discardStale(conn, err)
		return err
	}
	got := make(map[string]acquireReply, len(names))
	for rows.Next() {
		var (
			rep                   acquireReply
			name                  string
			owner, secret         *string
			token                 *int64
			acquiredAt, expiresAt *time.Time
		)
		if err := rows.Scan(&rep.acquired, &name, &owner, &token, &acquiredAt, &expiresAt, &rep.dbNow, &secret); err != nil {
			rows.Close()
			return err
		}
		rep.found = true
		if owner == nil || token == nil || acquiredAt == nil || expiresAt == nil {
			rep.busy = true
		} else {
			rep.owner, rep.token, rep.acquiredAt, rep.expiresAt = *owner, *token, *acquiredAt, *expiresAt
		}
		if rep.acquired {
			if secret == nil || rep.busy {
				rows.Close()
				return fmt.Errorf("pgfence_acquire granted %q without a token or secret", name)
			}
			rep.secret = *secret
		}
		got[name] = rep
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		k.discardStale(conn, err)
		return err
	}
	k.replyAcquires(batch, got, sent, nil)
	return nil
}

// replyAcquires answers every request in batch: with err when it is not
// nil, else from got. A lease taken for a caller that stopped waiting, or
// after Close began, is given back at once (Close waits for this). Only the
// first request for a name gets got's answer; got is updated so that later
// ones find the lease held.
func (k *Locker) replyAcquires(batch []*acquireReq, got map[string]acquireReply, sent time.Time, err error) {
	var back []giveBackReq
	defer func() { k.giveBack(back) }()
	closed := k.closeCtx.Err() != nil
	for _, r := range batch {
		rep := acquireReply{err: err}
		if err == nil {
			rep = got[r.name]
			rep.sent = sent
			held := rep
			held.acquired = false
			got[r.name] = held
		}
		if closed && rep.acquired {
			back = append(back, giveBackReq{r.ctx, r.name, rep.token, rep.secret})
			rep = acquireReply{err: pgfence.ErrClosed}
		}
		r.mu.Lock()
		if !r.abandoned {
			if rep.acquired {
				k.granting.Add(1)
			}
			r.res <- rep
			r.mu.Unlock()
			continue
		}
		r.mu.Unlock()
		if rep.acquired {
			back = append(back, giveBackReq{r.ctx, r.name, rep.token, rep.secret})
		}
	}
}

// giveBackReq is a lease taken for a caller that stopped waiting.
type giveBackReq struct {
	ctx    context.Context // the caller's: lends its values
	name   string
	token  int64
	secret string
}

// giveBack releases the leases in back, taken for callers that stopped
// waiting before they learnt of them, each bounded by QueryTimeout. The
// releases go to the release batcher together, so they cost one round
// trip, not one each.
func (k *Locker) giveBack(back []giveBackReq) {
	if len(back) == 0 {
		return
	}
	var wg sync.WaitGroup
	for _, b := range back {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.WithoutCancel(b.ctx), k.cfg.QueryTimeout)
			defer cancel()
			if _, err := k.releaseRow(ctx, b.name, b.token, b.secret, 0); err != nil {
				k.cfg.Logger.WarnContext(ctx, "pgfence: leasetable: giving back a lease whose acquirer stopped waiting failed; it expires after its TTL",
					"lease", b.name, "token", b.token, "error", err)
			}
		}()
	}
	wg.Wait()
}
