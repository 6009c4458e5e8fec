package advisory

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgfence/pgfence"
	"github.com/pgfence/pgfence/internal/events"
	"github.com/pgfence/pgfence/internal/retry"
)

// sessionSetupSQL runs once on a new lock session. It returns the backend's
// pid (checked on every later statement, to notice a transaction-pooling
// proxy that moves the session between backends), and sets the server-side
// TCP timeouts that make the server drop a vanished client's session and
// release its locks. It takes no lock.
const sessionSetupSQL = `SELECT pg_catalog.pg_backend_pid(), ` +
	`pg_catalog.set_config('tcp_keepalives_idle', $1, false), pg_catalog.set_config('tcp_keepalives_interval', $2, false), ` +
	`pg_catalog.set_config('tcp_keepalives_count', $3, false), pg_catalog.set_config('tcp_user_timeout', $4, false)`

// pingSQL is the watchdog's liveness check of a lock session; it takes no
// lock.
const pingSQL = `SELECT pg_catalog.pg_backend_pid()`

// tryLockSQL takes the session-level exclusive advisory lock on $1 if no
// other session holds it and, only when granted, draws a fencing token in
// the same statement (NULL when not granted) from the schema %[1]s.
const tryLockSQL = `SELECT CASE WHEN pg_catalog.pg_try_advisory_lock($1) THEN %[1]s.pgfence_next_token() END, pg_catalog.pg_backend_pid()`

// tryLockSharedSQL is tryLockSQL for the shared lock on $1.
const tryLockSharedSQL = `SELECT CASE WHEN pg_catalog.pg_try_advisory_lock_shared($1) THEN %[1]s.pgfence_next_token() END, pg_catalog.pg_backend_pid()`

// unlockSQL releases one hold of the session-level exclusive lock on $1.
const unlockSQL = `SELECT pg_catalog.pg_advisory_unlock($1), pg_catalog.pg_backend_pid()`

// unlockSharedSQL releases one hold of the session-level shared lock on $1.
const unlockSharedSQL = `SELECT pg_catalog.pg_advisory_unlock_shared($1), pg_catalog.pg_backend_pid()`

// unlockNotifySQL is unlockSQL for a lock held long enough that a Lock of
// another session may wait for it with interest registered (see wake.go).
// When the unlock succeeded, it then tries the transaction-level exclusive
// lock on $1's interest key, which the statement's end releases: that fails
// only while some LISTEN connection holds the interest key shared for a
// waiting Lock, and then it sends NOTIFY with the key, delivered when the
// statement commits (without waiting for the WAL flush: asyncCommitSQL).
// CASE fixes the order: unlock, test, notify.
const unlockNotifySQL = `SELECT CASE WHEN NOT pg_catalog.pg_advisory_unlock($1::pg_catalog.int8) THEN false ` + unlockWakeSQL

// unlockSharedNotifySQL is unlockNotifySQL for the shared lock on $1.
const unlockSharedNotifySQL = `SELECT CASE WHEN NOT pg_catalog.pg_advisory_unlock_shared($1::pg_catalog.int8) THEN false ` + unlockWakeSQL

// unlockWakeSQL is the end of unlockNotifySQL: the NOTIFY of waiters, if
// any.
const unlockWakeSQL = `WHEN pg_catalog.pg_try_advisory_xact_lock(` + interestClassIDText + `, ` + interestObjIDSQL + `) THEN true ` +
	`ELSE ` + asyncCommitSQL + ` AND pg_catalog.pg_notify('` + NotifyChannel + `', $1::pg_catalog.int8::pg_catalog.text) IS NOT NULL END, pg_catalog.pg_backend_pid()`

// asyncCommitSQL, part of an unlock that notifies, lets its transaction
// commit without waiting for the WAL flush: the NOTIFY alone gave the
// transaction an id and a commit record, and an unlock changes no data, so
// a crash can only lose a notification that nobody then needs. An unlock
// statement never shares its transaction with a token draw (a session's
// turn runs its unlocks and its lock requests as separate statements,
// batch.go), and set_config's is_local ends with the transaction.
const asyncCommitSQL = `pg_catalog.set_config('synchronous_commit', 'off', true) IS NOT NULL`

// unlockAllSQL releases every session-level advisory lock of the session;
// Close runs it so that the locks are free when Close returns, not only once
// the server has processed the disconnection.
const unlockAllSQL = `SELECT pg_catalog.pg_advisory_unlock_all()`

// session is one database connection owned by a Locker, holding session
// locks for many Lock handles.
type session struct {
	id    int
	sem   chan struct{} // one slot: held while the connection is in use
	ready chan struct{} // closed once opening finished (see openErr)
	stop  chan struct{} // closed when the session is dead: stops the watchdog

	// Set before ready is closed, read-only after.
	openErr error
	conn    *pgx.Conn // used only while holding sem
	pid     int32

	// Guarded by Locker.mu.
	dead     bool
	parked   bool // a waiting Acquire runs pg_advisory_lock on it (park.go)
	locks    map[*Lease]struct{}
	inflight int // acquisitions routed to the session, not yet finished

	// Lock requests waiting for the session's turn (batch.go).
	qmu     sync.Mutex
	pending []*request
}

func (s *session) load() int { return len(s.locks) + s.inflight }

// query runs f with a context that carries parent's values (for tracers)
// but not its cancellation, bounded by QueryTimeout instead: cancelling a
// statement makes pgx close the connection, dropping every lock on it. The
// caller holds s.sem.
func (s *session) query(parent context.Context, k *Locker, f func(ctx context.Context) error) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(parent), k.cfg.QueryTimeout)
	defer cancel()
	return f(ctx)
}

// queryKey runs q, a statement on the key id ($1) returning one value and
// the backend's pid, on s with the context query would give it (parent's
// values, bounded by QueryTimeout, not cancelled with parent), scans the
// value into dest and checks the pid. It is query written out, without a
// closure: this is the hot path of TryLock and Unlock, and the closure cost
// two allocations per TryLock+Unlock. The caller holds s.sem.
func (s *session) queryKey(parent context.Context, k *Locker, q string, id int64, dest any) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(parent), k.cfg.QueryTimeout)
	defer cancel()
	var pid int32
	if err := s.conn.QueryRow(ctx, q, id).Scan(dest, &pid); err != nil {
		return err
	}
	return s.checkPID(pid)
}

// ping checks s with a round trip bounded by QueryTimeout (ctx lends only
// its values). The caller holds s.sem.
func (s *session) ping(ctx context.Context, k *Locker) error {
	return s.query(ctx, k, func(ctx context.Context) error {
		var pid int32
		if err := s.conn.QueryRow(ctx, pingSQL).Scan(&pid); err != nil {
			return err
		}
		return s.checkPID(pid)
	})
}

// checkPID reports a statement that ran on another backend than the one the
// session started on: the connection goes through a transaction- or
// statement-pooling proxy, and session locks cannot be trusted.
func (s *session) checkPID(pid int32) error {
	if pid != s.pid {
		return fmt.Errorf("pgfence: advisory: the session's statements ran on backend %d, then on backend %d: "+
			"the connection goes through a transaction- or statement-pooling proxy (such as PgBouncer "+
			"with pool_mode=transaction), where session advisory locks do not work; connect the Locker "+
			"directly to PostgreSQL, or use Locker.TryAcquireTx/AcquireTx", s.pid, pid)
	}
	return nil
}

// sessionFill is the number of acquisitions in flight on a session (routed
// to it and not yet answered) from which new keys go to another session.
// Below it, every new key goes to the oldest session: the requests that
// meet on one session share its statements and WAL flushes (batch.go), so
// a session turns many concurrent grants into few round trips and
// flushes, while the same callers spread over several sessions would each
// wait for statements of their own, and a draw on one session that writes
// the sequence's WAL makes the draws of the others wait for its flush
// (measured: a fill of 8 or 4 ran no faster at 16 and 64 clients, with
// twice the flushes). A session is opened only for callers beyond that,
// up to MaxSessions.
const sessionFill = 32

// pickSessionLocked chooses the session for a new key: the oldest one
// with fewer than k.fill (sessionFill) acquisitions in flight, else a
// new one while fewer than MaxSessions exist, else the one with the
// fewest in flight. It returns open = true when the caller must open it.
// The caller holds k.mu.
func (k *Locker) pickSessionLocked() (s *session, open bool) {
	for _, c := range k.sessions { // live or opening, oldest first
		if c.parked {
			continue // waiting in pg_advisory_lock for one key (park.go)
		}
		if c.inflight < k.fill {
			return c, false
		}
		if s == nil || c.inflight < s.inflight {
			s = c
		}
	}
	if s != nil && len(k.sessions) >= k.cfg.MaxSessions {
		return s, false
	}
	return k.newSessionLocked(), true
}

// newSessionLocked adds a session to open to k.sessions. The caller holds
// k.mu and opens it.
func (k *Locker) newSessionLocked() *session {
	k.nextSessionID++
	s := &session{
		id:    k.nextSessionID,
		sem:   make(chan struct{}, 1),
		ready: make(chan struct{}),
		stop:  make(chan struct{}),
		locks: make(map[*Lease]struct{}),
	}
	k.sessions = append(k.sessions, s)
	return s
}

// openSession dials s and starts its watchdog, or records why it failed.
// The dial and the setup statement carry the values of ctx, the ctx of the
// acquire that needed the session, but not its cancellation: other
// acquires may wait for the same session. They are bounded by
// QueryTimeout.
func (k *Locker) openSession(ctx context.Context, s *session) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), k.cfg.QueryTimeout)
	defer cancel()
	conn, err := pgx.ConnectConfig(ctx, k.connConfig)
	var pid int32
	if err == nil {
		var idle, interval, count, userTimeout string
		err = conn.QueryRow(ctx, sessionSetupSQL,
			strconv.FormatInt(int64(k.cfg.TCPKeepalivesIdle/time.Second), 10),
			strconv.FormatInt(int64(k.cfg.TCPKeepalivesInterval/time.Second), 10),
			strconv.Itoa(k.cfg.TCPKeepalivesCount),
			strconv.FormatInt(k.cfg.TCPUserTimeout.Milliseconds(), 10),
		).Scan(&pid, &idle, &interval, &count, &userTimeout)
		if err == nil {
			k.log.DebugContext(ctx, "pgfence: advisory: lock session opened", "session", s.id, "pid", pid,
				"tcp_keepalives_idle", idle, "tcp_keepalives_interval", interval,
				"tcp_keepalives_count", count, "tcp_user_timeout", userTimeout)
		}
		if err != nil {
			_ = conn.Close(ctx)
		}
	}
	if err != nil {
		err = fmt.Errorf("pgfence: advisory: open lock session: %w", err)
	}
	k.mu.Lock()
	if err == nil && k.closed {
		_ = conn.Close(ctx)
		err = pgfence.ErrClosed
	}
	if err != nil {
		s.openErr = err
		s.dead = true
		close(s.stop)
		k.removeSessionLocked(s)
		k.log.WarnContext(ctx, "pgfence: advisory: cannot open lock session", "error", err)
	} else {
		s.conn, s.pid = conn, pid
		k.wg.Add(1)
		go k.watch(s)
	}
	k.mu.Unlock()
	close(s.ready)
}

func (k *Locker) removeSessionLocked(s *session) {
	for i, c := range k.sessions {
		if c == s {
			k.sessions = append(k.sessions[:i], k.sessions[i+1:]...)
			return
		}
	}
}

// sessionPeekInterval is how often the watchdog looks, without a round
// trip, whether an idle session's server sent something unasked or closed
// the connection (see watch).
const sessionPeekInterval = 50 * time.Millisecond

// watch is the watchdog of s: every SessionCheckInterval it checks an idle
// session with a round trip bounded by QueryTimeout, and fails the session
// when that does not succeed. A session in use is not checked: the
// statement in progress is bounded by QueryTimeout itself and fails the
// session too; the check runs once it is idle again. In between, every
// sessionPeekInterval, it looks whether the idle session's socket has
// anything to read (readable): an idle lock session is sent nothing, so
// bytes or an end of stream mean the server is ending the session (a
// FATAL error at shutdown or pg_terminate_backend, then the close; the
// kernel's close when the backend died), and the check runs at once. So a
// session the server ended is noticed within about sessionPeekInterval,
// and only a session that went silent (the network cut, the host gone)
// waits for the check to time out. A session that held no lock for
// SessionIdleTimeout is closed.
func (k *Locker) watch(s *session) {
	defer k.wg.Done()
	every := k.cfg.SessionCheckInterval
	if k.peek > 0 && k.peek < every {
		every = k.peek
	}
	perCheck := int((k.cfg.SessionCheckInterval + every - 1) / every) // ticks per check
	t := time.NewTicker(every)
	defer t.Stop()
	idleSince := time.Now()
	ticks := 0
	for {
		select {
		case <-s.stop:
			return
		case <-t.C:
		}
		ticks++
		due := ticks >= perCheck
		select {
		case s.sem <- struct{}{}:
		default:
			continue // in use: checked once idle
		}
		if !due {
			if ready, _ := readable(s.conn.PgConn().Conn()); !ready {
				<-s.sem
				continue
			}
		}
		ticks = 0
		if due && k.retireIfIdle(s, &idleSince) {
			<-s.sem
			return
		}
		k.check(s)
		<-s.sem
	}
}

// check is one watchdog check of s, the renewal of its locks: a round trip
// bounded by QueryTimeout. It runs with the values of the ctx that
// acquired the oldest lock on s (an OpRenew covering every lock on s, the
// others' acquiring ctxs as its links) under the Locker's lifetime; on
// success each lock is Renewed, on failure the session fails and its locks
// are Lost. The caller holds s.sem.
func (k *Locker) check(s *session) {
	k.mu.Lock()
	if s.dead {
		k.mu.Unlock()
		return
	}
	var first *Lease
	var leases []*Lease // with an Observer only
	for l := range s.locks {
		if !l.out {
			continue
		}
		if first == nil || l.acquired.Before(first.acquired) {
			first = l
		}
		if k.ev != nil {
			leases = append(leases, l)
		}
	}
	k.mu.Unlock()
	values := context.Background()
	if first != nil {
		values = first.values
	}
	ctx, stop := events.Values(values, k.closeCtx)
	defer stop()
	var op pgfence.Op
	if k.ev != nil && first != nil {
		op = pgfence.Op{Kind: pgfence.OpRenew, Strategy: pgfence.StrategyAdvisory, Batch: len(leases)}
		if len(leases) == 1 {
			op.Name = first.Name()
		} else {
			op.Links = make([]context.Context, 0, len(leases)-1)
			for _, l := range leases {
				if l != first {
					op.Links = append(op.Links, context.WithoutCancel(l.values))
				}
			}
		}
		ctx = k.ev.StartOp(ctx, op)
	}
	err := s.ping(ctx, k)
	if err != nil {
		err = fmt.Errorf("pgfence: advisory: liveness check failed: %w", err)
	}
	if k.ev != nil && first != nil {
		k.ev.EndOp(ctx, op, err)
	}
	if err != nil {
		k.failSession(ctx, s, err, nil)
		return
	}
	for _, l := range leases {
		if l.Err() == nil {
			k.ev.Async(context.WithoutCancel(l.values), pgfence.Renewed{Lock: l.lock()})
		}
	}
}

// retireIfIdle closes s when it has held no lock, and had no acquisition in
// flight, for SessionIdleTimeout. The caller holds s.sem.
func (k *Locker) retireIfIdle(s *session, idleSince *time.Time) bool {
	k.mu.Lock()
	if s.dead || s.load() > 0 {
		*idleSince = time.Now()
		k.mu.Unlock()
		return false
	}
	if time.Since(*idleSince) < k.cfg.SessionIdleTimeout {
		k.mu.Unlock()
		return false
	}
	// No lock and nothing in flight: no caller can be routed here any more.
	k.closeEmptyLocked(context.Background(), s, "pgfence: advisory: idle lock session closed")
	return true
}

// closeEmptyLocked closes s, which holds no lock handed out (so nobody is
// told): it leaves the Locker's sessions, its watchdog stops, and the
// connection is closed, which releases whatever the server still holds
// for it; msg is logged at Debug. The caller holds k.mu, which it
// releases, and s.sem.
func (k *Locker) closeEmptyLocked(ctx context.Context, s *session, msg string) {
	s.dead = true
	k.removeSessionLocked(s)
	close(s.stop)
	k.mu.Unlock()
	k.log.DebugContext(ctx, msg, "session", s.id, "pid", s.pid)
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), k.cfg.QueryTimeout)
	defer cancel()
	_ = s.conn.Close(cctx)
}

// failSession marks s dead: every lock on it is lost (its context is
// cancelled with a cause matching pgfence.ErrLeaseLost, and a Lost event is
// sent for each lock handed out, but releasing, whose Release reports the
// failure itself: releasing lists them) and the connection is closed, which makes the server
// release whatever it still holds. ctx lends its values to the log record
// (the ctx of the operation that failed). The caller holds s.sem. Nothing
// is re-acquired.
func (k *Locker) failSession(ctx context.Context, s *session, cause error, releasing ...*Lease) {
	k.mu.Lock()
	if s.dead {
		k.mu.Unlock()
		return
	}
	s.dead = true
	k.removeSessionLocked(s)
	lostCause := fmt.Errorf("%w: advisory session (backend pid %d): %w", pgfence.ErrSessionEnded, s.pid, cause)
	n := len(s.locks)
	now := time.Now()
	// Tell the holders first, then close: when the session is still alive
	// (a timeout), the server releases the locks only once it is closed.
	for l := range s.locks {
		l.state = stateLost
		l.stopMaxHoldLocked()
		k.dropKeyRefLocked(l.key.id)
		l.cancel(lostCause)
		if l.out && !slices.Contains(releasing, l) {
			k.lost.Add(1)
			if k.ev != nil {
				k.ev.Async(context.WithoutCancel(l.values), pgfence.Lost{Lock: l.lock(), HeldFor: now.Sub(l.acquired), Cause: lostCause})
			}
		}
	}
	clear(s.locks)
	close(s.stop)
	listener := k.listener
	k.mu.Unlock()
	if !errors.Is(cause, pgfence.ErrClosed) && retry.Transient(cause) {
		// The server may be gone for the LISTEN connection too: have it
		// checked now rather than at its next periodic check.
		listener.Suspect()
	}
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), k.cfg.QueryTimeout)
	defer cancel()
	if errors.Is(cause, pgfence.ErrClosed) {
		// A deliberate close of a healthy session: release the locks
		// before returning, so they are free for others when Close returns.
		_, _ = s.conn.Exec(cctx, unlockAllSQL)
	} else {
		k.log.WarnContext(ctx, "pgfence: advisory: lock session lost", "session", s.id, "pid", s.pid, "locks", n, "error", cause)
	}
	_ = s.conn.Close(cctx)
}

// readOnlySQLState is read_only_sql_transaction: the server is a standby.
const readOnlySQLState = "25006"

// errSessionFailed is the error of an acquire routed to a session that
// failed before its turn came; the acquire retries on another session.
var errSessionFailed = errors.New("the session failed")

// lockOnSession runs the lock statement on s, holding s.sem, with ctx (the
// acquire's operation ctx; values is the caller's own, kept by the Lease).
// On success the reservation becomes the Lock's.
func (k *Locker) lockOnSession(ctx, values context.Context, s *session, key Key, shared bool) (*Lease, error) {
	k.mu.Lock()
	dead, closed := s.dead, k.closed
	k.mu.Unlock()
	if closed {
		return nil, pgfence.ErrClosed
	}
	if dead {
		return nil, fmt.Errorf("pgfence: advisory: lock %v: %w", key, errSessionFailed)
	}
	q := k.sql.tryLock
	if shared {
		q = k.sql.tryLockShared
	}
	var token *int64
	err := s.queryKey(ctx, k, q, key.id, &token)
	if err != nil {
		// Session locks survive the rollback of the statement that took
		// them, so a failed statement may have left the lock granted.
		// When the server reported an error on a live connection (say,
		// "out of shared memory" from a full lock table), undo a possible
		// grant and keep the session.
		//
		// A session on a read-only server (SQLSTATE 25006 from the token
		// draw: a standby, reached through a load balancer or a URL without
		// target_session_attrs=read-write) is dropped instead, so that the
		// retry dials again and may reach the primary. Its advisory locks,
		// if any, are the standby's own and exclude nobody on the primary;
		// none was handed out, as every grant draws a token, which a
		// standby refuses.
		var pgErr *pgconn.PgError
		readOnly := errors.As(err, &pgErr) && pgErr.Code == readOnlySQLState
		if pgErr != nil && !readOnly && !s.conn.IsClosed() && k.undoFailedLock(ctx, s, key, shared) == nil {
			return nil, fmt.Errorf("pgfence: advisory: lock %v: %w", key, err)
		}
		// Otherwise the session's state is unknown: drop it with its
		// locks, and the server releases them.
		k.failSession(ctx, s, err, nil)
		return nil, fmt.Errorf("pgfence: advisory: lock %v: session failed, its locks are lost: %w", key, err)
	}
	if token == nil {
		return nil, fmt.Errorf("pgfence: advisory: lock %v: %w", key, pgfence.ErrNotAcquired)
	}
	return k.granted(s, values, key, shared, *token), nil
}

// errAmbiguousUndo is returned by undoFailedLock when it cannot tell.
var errAmbiguousUndo = errors.New("pgfence: advisory: the session already holds the key")

// undoFailedLock releases key on s if the failed lock statement left it
// granted. That is only decidable when s holds no other hold of key (an
// unlock then succeeds exactly when the failed statement's grant stuck);
// otherwise, or when the unlock fails, it returns an error and the caller
// must drop the session. The caller holds s.sem.
func (k *Locker) undoFailedLock(ctx context.Context, s *session, key Key, shared bool) error {
	k.mu.Lock()
	for l := range s.locks {
		if l.key.id == key.id {
			k.mu.Unlock()
			return errAmbiguousUndo
		}
	}
	k.mu.Unlock()
	q := unlockSQL
	if shared {
		q = unlockSharedSQL
	}
	var released bool
	return s.queryKey(ctx, k, q, key.id, &released)
}
