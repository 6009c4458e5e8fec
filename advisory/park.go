package advisory

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgfence/pgfence"
)

// Parked waits.
//
// A waiting Acquire whose key another session holds waits in the server,
// when it can, rather than by polling and NOTIFY: the call at the head of
// the key's line (acquire.go) parks on a session of the Locker that holds
// no lock and has nothing in flight, opening one when none is idle and
// MaxSessions allows, and runs pg_advisory_lock on it. The server queues
// the parked sessions of every Locker on the key in the order their
// statements began (a statement sent again, below, joins the back) and,
// when the holder unlocks, grants the lock to the first of them, whose
// statement then draws the token: a hand-over costs the holder's unlock
// and the waiter's commit, with no notification, no wake-up of a process
// and no second round trip in between.
//
// A parked session takes no other work: new keys are routed to the other
// sessions (pickSessionLocked), and at most MaxSessions-1 sessions are
// parked at once, so one is always left for them (MaxSessions 1 never
// parks). Parking is not used for shared locks, nor by TryAcquire. A key
// parked for has a keyState like any acquisition in flight, so other calls
// of the Locker for it wait in-process as they would for a holder.
//
// Each wait statement sets lock_timeout to SessionCheckInterval, or half of
// the server's deadlock_timeout if that is shorter (see parkLockSQL): a
// wait that times out (and holds nothing) is run again, so a parked
// session answers at least that often and a dead connection is noticed
// like an idle session's, and no parked wait runs the server's deadlock
// check. When the caller's ctx ends, or the Locker closes, the
// statement is cancelled with a cancel request, which keeps the session;
// the lock, if the grant came first, is released on the spot. A session
// whose state cannot be told afterwards (the statement failed at the
// network level, the lock could not be released, or a cancel request
// whose sending failed may still reach a later statement) is closed,
// which releases whatever it held: it held nothing handed out.

// parkLockSQL sets lock_timeout for the statement's transaction to $2
// milliseconds or half of deadlock_timeout, whichever is shorter (at least
// 10ms; GREATEST and LEAST are SQL syntax, not functions), then waits in
// pg_advisory_lock for the session-level exclusive lock on $1, and draws a
// fencing token from the schema %[1]s once granted. It returns the token
// and the backend's pid.
//
// A lock wait that reaches deadlock_timeout (1s by default) runs the
// server's deadlock check, which holds every partition of the lock table
// while it looks: with many parked waits each second, every lock and
// unlock of the database stalls behind them (bench scenario 11 with 1,000
// names showed hand-overs falling to a fifth). A parked wait therefore
// never lasts that long: it ends at lock_timeout and is sent again.
const parkLockSQL = `WITH t AS MATERIALIZED (SELECT pg_catalog.set_config('lock_timeout', ` +
	`GREATEST(10, LEAST($2::pg_catalog.int8, (pg_catalog.date_part('epoch', ` +
	`pg_catalog.current_setting('deadlock_timeout')::pg_catalog.interval) OPERATOR(pg_catalog.*) 500)::pg_catalog.int8))::pg_catalog.text ` +
	`OPERATOR(pg_catalog.||) 'ms', true)), ` +
	`l AS MATERIALIZED (SELECT pg_catalog.pg_advisory_lock($1::pg_catalog.int8) FROM t) ` +
	`SELECT %[1]s.pgfence_next_token(), pg_catalog.pg_backend_pid() FROM l`

// queryCanceled is the SQLSTATE of a statement ended by a cancel request.
const queryCanceled = "57014"

// parkSessionLocked returns a session for key id to park on, reserved for
// it (parked, one acquisition in flight) with the key's keyState, or nil
// when the Locker cannot park now: the key is held or asked for in this
// Locker, MaxSessions-1 sessions are parked already, or no session is idle
// and none may be opened. open reports that the caller must open it. The
// caller holds k.mu.
func (k *Locker) parkSessionLocked(id int64) (s *session, open bool) {
	s, ok := k.parkableLocked(id)
	if !ok {
		return nil, false
	}
	if s == nil {
		s, open = k.newSessionLocked(), true
	}
	s.parked = true
	s.inflight++
	k.keys[id] = &keyState{exclusive: true, refs: 1, s: s, released: make(chan struct{})}
	return s, open
}

// parkableLocked reports whether a call waiting for key id can park now,
// and on which idle session (nil: a new one). The caller holds k.mu.
func (k *Locker) parkableLocked(id int64) (s *session, ok bool) {
	if k.closed || k.noPark || k.keys[id] != nil {
		return nil, false
	}
	parked := 0
	for _, c := range k.sessions {
		if c.parked {
			parked++
		}
	}
	if parked+1 >= k.cfg.MaxSessions {
		return nil, false
	}
	for _, c := range k.sessions { // live or opening, oldest first
		if !c.parked && !c.dead && c.inflight == 0 && len(c.locks) == 0 && c.conn != nil {
			return c, true
		}
	}
	return nil, len(k.sessions) < k.cfg.MaxSessions
}

// canPark reports whether a call waiting for key id could park now.
func (k *Locker) canPark(id int64) bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	_, ok := k.parkableLocked(id)
	return ok
}

// park waits for the exclusive lock on key on a parked session (see
// above). parked is false when the Locker could not park (nothing was
// asked); then the caller waits as before. Otherwise it returns the Lease,
// or why not: ctx's error when ctx ended (the lock is not held), a
// transient error when the session failed (retry), or the server's error.
// ctx is the acquire's operation ctx, values the caller's own.
func (k *Locker) park(ctx, values context.Context, key Key) (l *Lease, parked bool, err error) {
	id := key.id
	k.mu.Lock()
	s, open := k.parkSessionLocked(id)
	k.mu.Unlock()
	if s == nil {
		return nil, false, nil
	}
	// unpark gives the reservation back (the lock was not granted),
	// waking the Locker's other calls for the key.
	unpark := func() {
		k.mu.Lock()
		s.parked = false
		s.inflight--
		k.dropKeyRefLocked(id)
		k.mu.Unlock()
	}
	if err := k.sessionReady(ctx, s, open); err != nil {
		unpark()
		return nil, true, err
	}
	select {
	case s.sem <- struct{}{}:
	case <-ctx.Done():
		unpark()
		return nil, true, ctx.Err()
	}
	for {
		token, err := k.parkOnce(ctx, s, key)
		if err == nil {
			k.mu.Lock()
			s.parked = false
			k.mu.Unlock()
			l = k.granted(s, values, key, false, token)
			// The session's turn is given back before the lock is handed
			// out (or released: Release queues on the session too).
			<-s.sem
			l, err = k.handOut(ctx, key, l)
			return l, true, err
		}
		if errors.Is(err, errParkTimeout) && ctx.Err() == nil && k.closeCtx.Err() == nil {
			continue
		}
		<-s.sem
		unpark()
		if errors.Is(err, errParkTimeout) {
			err = ctx.Err()
			if err == nil {
				err = pgfence.ErrClosed
			}
		}
		return nil, true, err
	}
}

// errParkTimeout is parkOnce's error when lock_timeout ended the wait and
// the session holds nothing: wait again.
var errParkTimeout = errors.New("the parked wait timed out")

// parkOnce runs one wait statement on s for key. It returns the token, or
// errParkTimeout when the wait ended without the lock (lock_timeout, or a
// cancel: the caller checks its ctx), with s fit for another statement; on
// any other error s holds nothing, or has been closed (failed). The caller
// holds s.sem and the parked reservation.
func (k *Locker) parkOnce(ctx context.Context, s *session, key Key) (int64, error) {
	k.mu.Lock()
	dead, closed := s.dead, k.closed
	k.mu.Unlock()
	if closed {
		return 0, pgfence.ErrClosed
	}
	if dead {
		return 0, fmt.Errorf("pgfence: advisory: lock %v: %w", key, errSessionFailed)
	}
	wait := k.cfg.SessionCheckInterval
	qctx, qcancel := context.WithTimeout(context.WithoutCancel(ctx), wait+k.cfg.QueryTimeout)
	defer qcancel()
	// A cancel request ends the statement without closing the session
	// (pgx would close it if qctx were cancelled).
	var (
		once      sync.Once
		cancelErr error // set before sent closes
		sent      = make(chan struct{})
	)
	cancel := func() {
		once.Do(func() {
			defer close(sent)
			cctx, ccancel := context.WithTimeout(context.Background(), k.cfg.QueryTimeout)
			defer ccancel()
			cancelErr = s.conn.PgConn().CancelRequest(cctx)
		})
	}
	if ctx.Err() != nil || k.closeCtx.Err() != nil {
		return 0, errParkTimeout // ended before the statement: send none
	}
	stopCtx := context.AfterFunc(ctx, cancel)
	stopClose := context.AfterFunc(k.closeCtx, cancel)
	var token, pid int64
	err := s.conn.QueryRow(qctx, k.sql.parkLock, key.id, wait.Milliseconds()).Scan(&token, &pid)
	// A cancel under way is waited for: once the server has taken it
	// (CancelRequest returns when the server closes the cancel
	// connection, after signalling the backend), the backend, which has
	// answered the statement, discards it as it waits for the next
	// command, so it cannot reach a later statement. A cancel whose
	// sending failed may still arrive: then the session is not reused.
	unsure := false
	if stoppedCtx, stoppedClose := stopCtx(), stopClose(); !stoppedCtx || !stoppedClose {
		<-sent
		unsure = cancelErr != nil
	}
	if err == nil {
		err = s.checkPID(int32(pid))
		if err != nil {
			k.failSession(ctx, s, err, nil)
			return 0, fmt.Errorf("pgfence: advisory: lock %v: %w", key, err)
		}
		if unsure {
			// Granted, but a cancel may still reach the session: the
			// caller is leaving anyway, and closing the session releases
			// the lock.
			k.closeParked(ctx, s)
			return 0, errParkTimeout
		}
		// Granted, even if the caller is leaving (park checks its ctx).
		return token, nil
	}
	if unsure {
		k.closeParked(ctx, s)
		return 0, errParkTimeout
	}
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || s.conn.IsClosed() || pgErr.Code == readOnlySQLState {
		// A network failure, or a standby (see lockOnSession): drop the
		// session.
		k.failSession(ctx, s, err, nil)
		return 0, fmt.Errorf("pgfence: advisory: lock %v: session failed: %w", key, err)
	}
	// The server reported an error. Session locks survive the rollback of
	// the statement that took them: release the lock if the grant came
	// before the error (the token draw failed, or was cancelled); the
	// session holds nothing else, so that is decidable.
	if uerr := k.undoFailedLock(ctx, s, key, false); uerr != nil {
		k.failSession(ctx, s, uerr, nil)
		return 0, fmt.Errorf("pgfence: advisory: lock %v: session failed: %w", key, uerr)
	}
	if pgErr.Code == lockNotAvailable || pgErr.Code == queryCanceled {
		// lock_timeout (on the lock, or on the token draw after it), the
		// cancel, or a statement_timeout of the role or database shorter
		// than lock_timeout: nothing is held now; wait again.
		return 0, errParkTimeout
	}
	return 0, fmt.Errorf("pgfence: advisory: lock %v: %w", key, err)
}

// closeParked closes s, a parked session that a cancel request may still
// reach: it holds nothing handed out, so nobody is told; closing releases
// whatever the server still holds for it. The caller holds s.sem.
func (k *Locker) closeParked(ctx context.Context, s *session) {
	k.mu.Lock()
	if s.dead {
		k.mu.Unlock()
		return
	}
	k.closeEmptyLocked(ctx, s, "pgfence: advisory: parked session closed: a cancel request to it may still arrive")
}
