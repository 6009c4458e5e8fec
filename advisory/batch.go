package advisory

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgfence/pgfence"
	"github.com/pgfence/pgfence/internal/hold"
)

// Combining statements
//
// Acquires and Releases routed to one session queue their requests on it
// (request). The caller that takes the session's turn (s.sem) first lets
// the callers about to queue do so (gather), then runs every request
// queued at that moment, in two phases: the unlocks in one statement
// (unlockBatchSQL), answered as soon as it returns, so that a Release
// never waits for the WAL flush of other callers' grants; then the lock
// requests in another (tryLockTokensSQL), together with those queued while
// the unlocks ran (a caller just released often asks again at once): one
// round trip, one call drawing all their tokens (migration 000009), and
// at most one transaction id and one WAL flush for them (a draw writes WAL
// only when the WAL covering its tokens is not flushed yet: migration
// 000008).
// The others find their answer ready (done closed) when the turn comes
// back, or while they wait for it. A request alone of its kind runs the
// single-key statement (tryLockSQL, unlockSQL and friends), exactly as
// before combining. Unlocks and lock requests never share a statement or
// a transaction, so that a lock statement the server fails can be undone
// and retried alone without touching the unlocks, whose notifications
// are committed by then.
//
// The Locker's key states (keyState) already decide, before a request is
// queued, which requests may reach the server: one exclusive request per
// key, or shared ones only. So a batch holds at most one request per
// exclusive key, and a shared key only with other shared requests for it,
// which the server grants each as it would one after another (session
// locks are re-entrant), each with its own token.

// tryLockBatchSQL takes, for each key of $1 in order, the session-level
// advisory lock (shared where $2 is true, else exclusive) if no other
// session holds it in a conflicting mode and, only when granted, draws a
// fencing token from the schema %[1]s (NULL when not granted). Every token
// is drawn in the statement's one transaction: one transaction id, one
// durable commit. It returns the key's position in $1 (from 1), the token
// and the backend's pid. It serves schemas before migration 000009, or a
// role not granted pgfence_next_tokens; tryLockTokensSQL replaces it.
const tryLockBatchSQL = `SELECT r.i, CASE WHEN CASE WHEN r.sh THEN pg_catalog.pg_try_advisory_lock_shared(r.k) ` +
	`ELSE pg_catalog.pg_try_advisory_lock(r.k) END THEN %[1]s.pgfence_next_token() END, pg_catalog.pg_backend_pid() ` +
	`FROM ROWS FROM (pg_catalog.unnest($1::pg_catalog.int8[]), pg_catalog.unnest($2::pg_catalog.bool[])) WITH ORDINALITY AS r(k, sh, i)`

// tryLockTokensSQL is tryLockBatchSQL with one call drawing every token
// (pgfence_next_tokens, migration 000009): it tries every lock first,
// collecting whether each was granted in the order of $1, then draws a
// token for each granted one, in that order, after all the attempts (so
// each token is drawn after its lock was granted, as in tryLockBatchSQL).
// The sequence's checks, the WAL test and the SECURITY DEFINER entry are
// paid once per statement instead of once per token. Same parameters and
// rows as tryLockBatchSQL.
const tryLockTokensSQL = `WITH g AS MATERIALIZED (SELECT pg_catalog.array_agg(CASE WHEN r.sh ` +
	`THEN pg_catalog.pg_try_advisory_lock_shared(r.k) ELSE pg_catalog.pg_try_advisory_lock(r.k) END ORDER BY r.i) AS granted ` +
	`FROM ROWS FROM (pg_catalog.unnest($1::pg_catalog.int8[]), pg_catalog.unnest($2::pg_catalog.bool[])) WITH ORDINALITY AS r(k, sh, i)) ` +
	`SELECT t.i, t.token, pg_catalog.pg_backend_pid() ` +
	`FROM g, pg_catalog.unnest(%[1]s.pgfence_next_tokens(g.granted)) WITH ORDINALITY AS t(token, i)`

// request is one acquire's lock request, or one Release's unlock, queued
// on a session.
type request struct {
	ctx, values context.Context // as lockOnSession takes them
	key         Key
	shared      bool
	unlock      *Lease        // the lock to release; nil for a lock request
	done        chan struct{} // closed once the answer below is set
	l           *Lease        // a lock request's grant
	released    bool          // an unlock's: this call ended the lock
	err         error
}

// grant runs the lock statement for key on s, combined with the statements
// of other callers queued on s meanwhile, and returns lockOnSession's
// result. ran is false when ctx ended before the request was taken into a
// statement: then it was withdrawn and err is ctx.Err(). Once taken, the
// request is answered whatever ctx does (the statement is bounded by
// Config.QueryTimeout).
func (k *Locker) grant(ctx, values context.Context, s *session, key Key, shared bool) (l *Lease, ran bool, err error) {
	r := &request{ctx: ctx, values: values, key: key, shared: shared, done: make(chan struct{})}
	if !k.submit(ctx.Done(), s, r) {
		return nil, false, ctx.Err()
	}
	return r.l, true, r.err
}

// submit queues r on s and returns once r is answered: by this caller, when
// it gets s's turn (s.sem) and runs every request queued then, or by
// another caller that had the turn. When cancel closes before r was taken
// into a statement, submit withdraws r and returns false; once taken, r is
// answered (a turn may also put it back in the queue, runBatch, and then
// its caller may take the next turn for it).
func (k *Locker) submit(cancel <-chan struct{}, s *session, r *request) bool {
	s.qmu.Lock()
	s.pending = append(s.pending, r)
	s.qmu.Unlock()
	for {
		select {
		case s.sem <- struct{}{}:
			// A caller with the turn closes the done of every request it
			// took, or puts it back in the queue, before it gives the turn
			// back, so r is either answered or still queued.
			select {
			case <-r.done:
			default:
				s.gather()
				s.qmu.Lock()
				batch := s.pending
				s.pending = nil
				s.qmu.Unlock()
				k.runBatch(r.ctx, s, r, batch) // answers r
			}
			<-s.sem
			return true
		case <-r.done:
			return true
		case <-cancel:
			s.qmu.Lock()
			if i := slices.Index(s.pending, r); i >= 0 {
				s.pending = slices.Delete(s.pending, i, i+1)
				s.qmu.Unlock()
				return false
			}
			s.qmu.Unlock()
			// In a statement now (bounded by QueryTimeout), or to be put
			// back in the queue: wait for the answer or the turn.
			cancel = nil
		}
	}
}

// runBatch answers the requests of batch on s, own (the request of the
// caller with the turn) among them, and closes their done, in two phases:
// the unlocks first, in one statement, answered as soon as it returns, so
// that a Release never waits for the WAL flush of the grants after it;
// then the lock requests, in another, together with those queued while
// the unlocks ran (a caller just released often asks again at once), so
// that their tokens share one flush. When own is an unlock, its caller
// leaves after the first phase: the lock requests go back to the head of
// the queue, and one of their callers, who wait for the turn, runs them in
// the next. ctx (the ctx of the caller with the turn) lends its values to
// the statements. The caller holds s.sem.
func (k *Locker) runBatch(ctx context.Context, s *session, own *request, batch []*request) {
	var grants, unlocks []*request
	for _, r := range batch {
		if r.unlock != nil {
			unlocks = append(unlocks, r)
		} else {
			grants = append(grants, r)
		}
	}
	if len(unlocks) > 0 {
		if live := k.liveUnlocks(unlocks); len(live) > 0 {
			k.unlockBatch(ctx, s, live)
		}
		for _, r := range unlocks {
			close(r.done)
		}
		if k.afterUnlocks != nil {
			k.afterUnlocks()
		}
		if own.unlock != nil {
			s.requeue(grants)
			grants = nil
		} else {
			// Let the callers just answered queue their next requests.
			s.gather()
			if !k.noRecollect {
				grants = append(grants, s.takeGrants()...)
			}
		}
	}
	if k.onBatch != nil {
		k.onBatch(len(grants), len(unlocks))
	}
	for part := range slices.Chunk(grants, k.maxLockBatch) {
		k.lockBatch(ctx, s, part)
	}
	for _, r := range grants {
		close(r.done)
	}
}

// maxLockBatch is the most lock requests one statement carries: a turn
// with more (as many callers as that queued on one session at once) runs
// them in several statements, in order, since pgfence_next_tokens refuses
// to draw for more positions.
const maxLockBatch = 65536

// requeue puts the lock requests grants back at the head of s's queue,
// for the next turn.
func (s *session) requeue(grants []*request) {
	if len(grants) == 0 {
		return
	}
	s.qmu.Lock()
	s.pending = append(grants, s.pending...)
	s.qmu.Unlock()
}

// takeGrants removes the lock requests queued on s and returns them; the
// unlocks stay queued.
func (s *session) takeGrants() []*request {
	s.qmu.Lock()
	defer s.qmu.Unlock()
	var grants []*request
	kept := s.pending[:0]
	for _, r := range s.pending {
		if r.unlock == nil {
			grants = append(grants, r)
		} else {
			kept = append(kept, r)
		}
	}
	s.pending = kept
	return grants
}

// liveUnlocks answers the unlocks of batch whose lock was lost (without a
// statement) and returns the others, marked as ended by their call.
func (k *Locker) liveUnlocks(batch []*request) []*request {
	live := batch[:0:0]
	for _, r := range batch {
		k.mu.Lock()
		if r.unlock.state == stateLost {
			r.err = r.unlock.unlockLossLocked()
			continue
		}
		k.mu.Unlock()
		r.released = true
		live = append(live, r)
	}
	return live
}

// failUnlocks drops s after a failed unlock statement (failed nil: every
// unlock of batch failed) and answers the failed unlocks. The caller holds
// s.sem.
func (k *Locker) failUnlocks(ctx context.Context, s *session, batch []*request, cause error, failed []*Lease) {
	if failed == nil {
		for _, r := range batch {
			failed = append(failed, r.unlock)
		}
	}
	// The session's state is unknown or wrong: drop it, with every lock
	// on it; the server releases them when the connection ends.
	k.failSession(ctx, s, cause, failed...)
	for _, r := range batch {
		if slices.Contains(failed, r.unlock) {
			r.err = r.unlock.failedUnlock()
		}
	}
}

// failGrants answers the lock requests of a batch whose session failed.
func (k *Locker) failGrants(batch []*request, cause error) {
	for _, r := range batch {
		r.err = fmt.Errorf("pgfence: advisory: lock %v: session failed, its locks are lost: %w", r.key, cause)
	}
}

// answerGrants answers the lock requests of batch from their tokens.
func (k *Locker) answerGrants(s *session, batch []*request, tokens []*int64) {
	for i, r := range batch {
		if tokens[i] == nil {
			r.err = fmt.Errorf("pgfence: advisory: lock %v: %w", r.key, pgfence.ErrNotAcquired)
			continue
		}
		r.l = k.granted(s, r.values, r.key, r.shared, *tokens[i])
	}
}

// lockBatch answers the lock requests of batch with one statement on s.
// The caller holds s.sem.
func (k *Locker) lockBatch(ctx context.Context, s *session, batch []*request) {
	if k.onLockStatement != nil {
		k.onLockStatement(len(batch))
	}
	if len(batch) == 1 {
		r := batch[0]
		r.l, r.err = k.lockOnSession(r.ctx, r.values, s, r.key, r.shared)
		return
	}
	k.mu.Lock()
	dead, closed := s.dead, k.closed
	k.mu.Unlock()
	if closed || dead {
		for _, r := range batch {
			r.err = pgfence.ErrClosed
			if !closed {
				r.err = fmt.Errorf("pgfence: advisory: lock %v: %w", r.key, errSessionFailed)
			}
		}
		return
	}
	tokens, err := s.queryBatch(ctx, k, batch)
	if err != nil {
		// Session locks survive the rollback of the statement that took
		// them: as for one key (lockOnSession), an error the server
		// reported on a live connection is undone, and then every request
		// runs alone, to get the answer it would have had alone. A
		// session that failed, or whose state cannot be told, is dropped
		// with its locks, and every request of the batch fails with it
		// (transiently, and so retried, when the cause is).
		var pgErr *pgconn.PgError
		readOnly := errors.As(err, &pgErr) && pgErr.Code == readOnlySQLState
		if pgErr != nil && !readOnly && !s.conn.IsClosed() && k.undoFailedBatch(ctx, s, batch) == nil {
			for _, r := range batch {
				r.l, r.err = k.lockOnSession(r.ctx, r.values, s, r.key, r.shared)
			}
			return
		}
		k.failSession(ctx, s, err, nil)
		k.failGrants(batch, err)
		return
	}
	k.answerGrants(s, batch, tokens)
}

// unlockBatch answers the unlocks of live (none of them lost) with one
// statement on s. As for one unlock, a failed
// statement, or a lock the server says the session did not hold, drops
// the session with every lock on it. The caller holds s.sem.
func (k *Locker) unlockBatch(ctx context.Context, s *session, live []*request) {
	if len(live) == 1 {
		live[0].err = live[0].unlock.unlockOnSession(live[0].ctx)
		return
	}
	ok, err := s.queryUnlocks(ctx, k, live)
	if err != nil {
		k.failUnlocks(ctx, s, live, err, nil)
		return
	}
	var failed []*Lease
	for i, r := range live {
		if ok[i] {
			r.unlock.unlocked()
		} else {
			failed = append(failed, r.unlock)
		}
	}
	if len(failed) > 0 {
		k.failUnlocks(ctx, s, live, errNotHeldByServer, failed)
	}
}

// queryBatch runs the combined lock statement (k.sql.tryLockBatch) for
// batch on s, bounded by QueryTimeout and not cancelled with ctx (as
// queryKey), and returns each request's token (nil when not granted), in
// batch's order. The caller holds s.sem.
func (s *session) queryBatch(ctx context.Context, k *Locker, batch []*request) ([]*int64, error) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), k.cfg.QueryTimeout)
	defer cancel()
	keys, shared := lockArgs(batch)
	rows, err := s.conn.Query(ctx, k.sql.tryLockBatch, keys, shared)
	if err != nil {
		return nil, err
	}
	tokens := make([]*int64, len(batch))
	return tokens, scanPositions(s, rows, tokens)
}

// scanPositions reads the rows of a batch statement for len(out) keys,
// each (the key's position from 1, a value, the backend's pid), checks the
// pid and that each position comes exactly once, and stores each value at
// its position's index in out. It closes rows.
func scanPositions[T any](s *session, rows pgx.Rows, out []T) error {
	defer rows.Close()
	seen := make([]bool, len(out))
	got := 0
	// The scan targets are declared once, not per row: Scan takes their
	// addresses as interfaces, so each would be allocated for every row.
	var (
		pos int64
		v   T
		pid int32
	)
	for rows.Next() {
		var zero T
		v = zero // a pointer T gets a new target, never the last row's
		if err := rows.Scan(&pos, &v, &pid); err != nil {
			return err
		}
		if err := s.checkPID(pid); err != nil {
			return err
		}
		if pos < 1 || pos > int64(len(out)) || seen[pos-1] {
			return fmt.Errorf("pgfence: advisory: the batch statement returned position %d for %d keys", pos, len(out))
		}
		seen[pos-1] = true
		out[pos-1] = v
		got++
	}
	if err := rows.Err(); err != nil {
		return err
	}
	if got != len(out) {
		return fmt.Errorf("pgfence: advisory: the batch statement returned %d rows for %d keys", got, len(out))
	}
	return nil
}

// undoFailedBatch releases on s what a failed batch statement may have
// left granted, as undoFailedLock does for one key. A key requested twice
// in the batch (shared) cannot be told apart, like a key s already holds:
// then it returns an error and the caller must drop the session. The
// caller holds s.sem.
func (k *Locker) undoFailedBatch(ctx context.Context, s *session, batch []*request) error {
	count := make(map[int64]int, len(batch))
	for _, r := range batch {
		count[r.key.id]++
	}
	for _, r := range batch {
		if count[r.key.id] > 1 {
			return errAmbiguousUndo
		}
	}
	for _, r := range batch {
		if err := k.undoFailedLock(ctx, s, r.key, r.shared); err != nil {
			return err
		}
	}
	return nil
}

// granted records a lock granted on s with token, turning the
// acquisition's reservation into the Lease's, and returns the Lease.
func (k *Locker) granted(s *session, values context.Context, key Key, shared bool, token int64) *Lease {
	l := &Lease{k: k, s: s, key: key, shared: shared, token: token, acquired: time.Now(), values: values}
	l.ctx, l.cancel = context.WithCancelCause(hold.Mark(context.Background(), k, key.markName(), l))
	k.mu.Lock()
	s.inflight--
	s.locks[l] = struct{}{}
	k.mu.Unlock()
	return l
}

// unlockBatchSQL releases, for each key of $1 in order, one hold of the
// session-level advisory lock (shared where $2 is true, else exclusive).
// Where $3 is true and the unlock succeeded it then looks for waiters to
// wake and notifies them, as unlockNotifySQL does (the interest key's
// transaction lock and the notifications last until the statement ends;
// a statement that notifies commits without waiting for the WAL flush).
// It returns the key's position in $1 (from 1), whether the session held
// the lock, and the backend's pid.
const unlockBatchSQL = `SELECT r.i, CASE WHEN NOT CASE WHEN r.sh THEN pg_catalog.pg_advisory_unlock_shared(r.k) ` +
	`ELSE pg_catalog.pg_advisory_unlock(r.k) END THEN false WHEN NOT r.n THEN true ` +
	`WHEN pg_catalog.pg_try_advisory_xact_lock(` + interestClassIDText + `, ` + interestObjIDOfRow + `) THEN true ` +
	`ELSE ` + asyncCommitSQL + ` AND pg_catalog.pg_notify('` + NotifyChannel + `', r.k::pg_catalog.text) IS NOT NULL END, pg_catalog.pg_backend_pid() ` +
	`FROM ROWS FROM (pg_catalog.unnest($1::pg_catalog.int8[]), pg_catalog.unnest($2::pg_catalog.bool[]), ` +
	`pg_catalog.unnest($3::pg_catalog.bool[])) WITH ORDINALITY AS r(k, sh, n, i)`

// interestObjIDOfRow is interestObjIDSQL for the key r.k of unlockBatchSQL.
const interestObjIDOfRow = `(((r.k OPERATOR(pg_catalog.#) (r.k OPERATOR(pg_catalog.>>) 32)) ` +
	`OPERATOR(pg_catalog.&) 4294967295) OPERATOR(pg_catalog.-) 2147483648)::pg_catalog.int4`

// queryUnlocks runs unlockBatchSQL for batch on s, bounded by QueryTimeout
// and not cancelled with ctx (as queryKey), and returns whether the server
// held each lock, in batch's order. The caller holds s.sem.
func (s *session) queryUnlocks(ctx context.Context, k *Locker, batch []*request) ([]bool, error) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), k.cfg.QueryTimeout)
	defer cancel()
	keys, shared, notify := unlockArgs(batch)
	rows, err := s.conn.Query(ctx, unlockBatchSQL, keys, shared, notify)
	if err != nil {
		return nil, err
	}
	ok := make([]bool, len(batch))
	return ok, scanPositions(s, rows, ok)
}

// lockArgs returns the parameters of the combined lock statement for batch.
func lockArgs(batch []*request) (keys []int64, shared []bool) {
	keys, shared = make([]int64, len(batch)), make([]bool, len(batch))
	for i, r := range batch {
		keys[i], shared[i] = r.key.id, r.shared
	}
	return keys, shared
}

// unlockArgs returns the parameters of unlockBatchSQL for batch.
func unlockArgs(batch []*request) (keys []int64, shared, notify []bool) {
	keys, shared, notify = make([]int64, len(batch)), make([]bool, len(batch)), make([]bool, len(batch))
	for i, r := range batch {
		keys[i], shared[i] = r.key.id, r.shared
		_, notify[i] = r.unlock.unlockStatement()
	}
	return keys, shared, notify
}

// gatherRounds bounds how often a caller that took a session's turn lets
// the other goroutines run before it takes the queued requests (gather).
const gatherRounds = 4

// gather lets the goroutines that are ready run, so that the callers about
// to queue a request on s (one just answered by the previous turn and
// asking again, say) do so before the caller with the turn takes the
// queue: their requests then share this turn's statement and WAL flush
// instead of waiting for the next turn. It yields until the queue stops
// growing, at most gatherRounds times; it never sleeps. The caller holds
// s.sem.
func (s *session) gather() {
	n := -1
	for range gatherRounds {
		s.qmu.Lock()
		m := len(s.pending)
		s.qmu.Unlock()
		if m == n {
			return
		}
		n = m
		runtime.Gosched()
	}
}
