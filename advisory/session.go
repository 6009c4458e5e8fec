package advisory

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgconn/ctxwatch"

	"github.com/pgfence/pgfence"
	"github.com/pgfence/pgfence/internal/events"
	"github.com/pgfence/pgfence/internal/hold"
	"github.com/pgfence/pgfence/internal/retry"
)

// session is one database connection owned by a Locker, holding the
// session locks of many Leases. One caller at a time has its turn (sem) and
// runs the statements queued on it (see docs/advisory.md, Sessions).
type session struct {
	k      *Locker
	id     int
	sem    chan struct{} // the turn: held while the connection is in use
	opened chan struct{} // closed once opening finished (see openErr)
	stop   chan struct{} // closed when the session is dead: stops the watchdog

	// Set before opened is closed, read-only after.
	openErr error
	conn    *pgx.Conn // used only during a turn
	pid     int32

	// warnings counts the WARNING notices the session's backend sent (see
	// sessionConnConfig).
	warnings atomic.Uint64

	// Guarded by Locker.mu.
	dead     bool
	parked   bool // a waiting acquire runs pg_advisory_lock on it
	locks    map[*Lease]struct{}
	inflight int // acquisitions routed to the session, not yet finished

	// Requests waiting for the session's turn.
	qmu     sync.Mutex
	pending []*request
}

func (s *session) load() int { return len(s.locks) + s.inflight }

// Routing: which session a key goes to.

// keyState is who holds, or is acquiring, a key in this Locker. The server
// would grant a key again to the session holding it, so the Locker grants
// in-process: one exclusive holder, or shared holders on one session.
type keyState struct {
	exclusive bool
	refs      int           // holders plus acquisitions in flight
	s         *session      // the session holding it
	released  chan struct{} // closed when the last ref is dropped
	// refused is set before released closes when the last ref was an
	// acquisition the server refused, so that the calls that waited for it
	// do not all ask again at once.
	refused bool
}

// dropKeyRefLocked drops one reference to key id, forgetting the key and
// waking the calls waiting for it when it was the last. The caller holds
// k.mu.
func (k *Locker) dropKeyRefLocked(id int64) {
	ks := k.keys[id]
	if ks == nil {
		return
	}
	ks.refs--
	if ks.refs == 0 {
		delete(k.keys, id)
		close(ks.released)
	}
}

// sessionFill is the number of acquisitions in flight on a session from
// which new keys go to another one: the callers of one session share its
// statements and WAL flushes.
const sessionFill = 32

// pickSessionLocked chooses the session for a new key: the oldest unparked
// one with fewer than sessionFill acquisitions in flight, else a new one
// while MaxSessions allows, else the least loaded. open reports that the
// caller must open it. The caller holds k.mu.
func (k *Locker) pickSessionLocked() (s *session, open bool) {
	fill := k.hooks.fillAt()
	for _, c := range k.sessions {
		if c.parked {
			continue
		}
		if c.inflight < fill {
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
		k:      k,
		id:     k.nextSessionID,
		sem:    make(chan struct{}, 1),
		opened: make(chan struct{}),
		stop:   make(chan struct{}),
		locks:  make(map[*Lease]struct{}),
	}
	k.sessions = append(k.sessions, s)
	return s
}

// parkSessionLocked reserves a session for a wait on key id to park on,
// with the key's keyState, or returns nil when the Locker cannot park now.
// open reports that the caller must open it. The caller holds k.mu.
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

// parkableLocked reports whether a wait for key id can park now, and on
// which idle session (nil: a new one). At most MaxSessions-1 sessions park,
// so one is left for other keys. The caller holds k.mu.
func (k *Locker) parkableLocked(id int64) (s *session, ok bool) {
	if k.closed || !k.hooks.parks() || k.keys[id] != nil {
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
	for _, c := range k.sessions {
		if !c.parked && !c.dead && c.inflight == 0 && len(c.locks) == 0 && c.conn != nil {
			return c, true
		}
	}
	return nil, len(k.sessions) < k.cfg.MaxSessions
}

// canPark reports whether a wait for key id could park now.
func (k *Locker) canPark(id int64) bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	_, ok := k.parkableLocked(id)
	return ok
}

// removeLocked takes s out of the Locker's sessions. The caller holds k.mu.
func (s *session) removeLocked() {
	k := s.k
	if i := slices.Index(k.sessions, s); i >= 0 {
		k.sessions = slices.Delete(k.sessions, i, i+1)
	}
}

// Opening, and statements on the session.

// sessionSetupSQL runs once on a new lock session: it returns the backend's
// pid (checked on every later statement) and sets the server-side TCP
// timeouts that drop a vanished client's session. It takes no lock.
const sessionSetupSQL = `SELECT pg_catalog.pg_backend_pid(), ` +
	`pg_catalog.set_config('tcp_keepalives_idle', $1, false), pg_catalog.set_config('tcp_keepalives_interval', $2, false), ` +
	`pg_catalog.set_config('tcp_keepalives_count', $3, false), pg_catalog.set_config('tcp_user_timeout', $4, false), ` +
	`pg_catalog.set_config('client_min_messages', 'warning', false)`

// ready waits until s is open, dialing it first when open is true (the
// caller reserved a new session). The dial runs in the background, so the
// caller can leave when ctx ends while others wait on. It returns ctx's
// error, or why the session could not be opened.
func (s *session) ready(ctx context.Context, open bool) error {
	if open {
		s.k.wg.Go(func() { s.open(ctx) })
	}
	select {
	case <-s.opened:
	case <-ctx.Done():
		return ctx.Err()
	}
	return s.openErr
}

// sessionConnConfig returns a copy of cc for s. Its statements end, when
// their context does, by the connection's deadline (pgconn's deadline
// context watcher), never by a cancel request: a cancel that reached a
// commit waiting for a synchronous standby would make the server report
// success for a token the standby may not have. And it counts the WARNING
// notices in s.warnings (then calls cc's OnNotice): a lock statement that
// drew a warning is not trusted (see distrusted), as a cancel, the
// Locker's own or someone else's, ends that wait with one (sessionSetupSQL
// makes sure warnings are sent).
func (s *session) sessionConnConfig(cc *pgx.ConnConfig) *pgx.ConnConfig {
	c := cc.Copy()
	if s.k.hooks.pinsDeadlineWatcher() {
		c.BuildContextWatcherHandler = func(pc *pgconn.PgConn) ctxwatch.Handler {
			return &pgconn.DeadlineContextWatcherHandler{Conn: pc.Conn()}
		}
	}
	prev := cc.OnNotice
	c.OnNotice = func(pc *pgconn.PgConn, n *pgconn.Notice) {
		if n.SeverityUnlocalized == "WARNING" || n.SeverityUnlocalized == "" && n.Severity == "WARNING" {
			s.warnings.Add(1)
		}
		if prev != nil {
			prev(pc, n)
		}
	}
	return c
}

// errUnconfirmedCommit is the error of lock requests whose statement was
// granted with a WARNING from the server: the commit's wait for a
// synchronous standby may have been cancelled, so the tokens may be
// missing from the standby. The grants are undone; the acquire retries.
var errUnconfirmedCommit = errors.New("the server reported the grant's commit with a warning (a cancelled wait for a synchronous standby?); not handed out")

// distrusted reports whether a WARNING arrived since the count before (a
// lock statement's grants are then not handed out), unless a test keeps
// them.
func (s *session) distrusted(before uint64) bool {
	return s.warnings.Load() != before && !s.k.hooks.keepsWarnedGrants()
}

// open dials s, runs sessionSetupSQL and starts the watchdog, or records
// why it failed. It carries ctx's values but not its cancellation (others
// may wait for s), bounded by QueryTimeout.
func (s *session) open(ctx context.Context) {
	k := s.k
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), k.cfg.QueryTimeout)
	defer cancel()
	conn, err := pgx.ConnectConfig(ctx, s.sessionConnConfig(k.connConfig))
	var pid int32
	if err == nil {
		var idle, interval, count, userTimeout string
		err = conn.QueryRow(ctx, sessionSetupSQL,
			strconv.FormatInt(int64(k.cfg.TCPKeepalivesIdle/time.Second), 10),
			strconv.FormatInt(int64(k.cfg.TCPKeepalivesInterval/time.Second), 10),
			strconv.Itoa(k.cfg.TCPKeepalivesCount),
			strconv.FormatInt(k.cfg.TCPUserTimeout.Milliseconds(), 10),
		).Scan(&pid, &idle, &interval, &count, &userTimeout, new(string))
		if err == nil {
			k.log.DebugContext(ctx, "pgfence: advisory: lock session opened", "session", s.id, "pid", pid,
				"tcp_keepalives_idle", idle, "tcp_keepalives_interval", interval,
				"tcp_keepalives_count", count, "tcp_user_timeout", userTimeout)
		} else {
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
		s.removeLocked()
		k.log.WarnContext(ctx, "pgfence: advisory: cannot open lock session", "error", err)
	} else {
		s.conn, s.pid = conn, pid
		k.wg.Add(1)
		go s.watch(k.hooks.peekEvery())
	}
	k.mu.Unlock()
	close(s.opened)
}

// query runs f with parent's values but not its cancellation, bounded by
// QueryTimeout: cancelling a statement makes pgx close the connection,
// dropping every lock on it. The caller has the turn.
func (s *session) query(parent context.Context, f func(ctx context.Context) error) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(parent), s.k.cfg.QueryTimeout)
	defer cancel()
	return f(ctx)
}

// queryKey runs q, a statement on key id ($1) returning one value and the
// backend's pid, as query would, scans the value into dest and checks the
// pid. It is query without a closure, for the hot path. The caller has the
// turn.
func (s *session) queryKey(parent context.Context, q string, id int64, dest any) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(parent), s.k.cfg.QueryTimeout)
	defer cancel()
	var pid int32
	if err := s.conn.QueryRow(ctx, q, id).Scan(dest, &pid); err != nil {
		return err
	}
	return s.checkPID(pid)
}

// pingSQL is the liveness check of a lock session; it takes no lock.
const pingSQL = `SELECT pg_catalog.pg_backend_pid()`

// ping checks s with a round trip. The caller has the turn.
func (s *session) ping(ctx context.Context) error {
	return s.query(ctx, func(ctx context.Context) error {
		var pid int32
		if err := s.conn.QueryRow(ctx, pingSQL).Scan(&pid); err != nil {
			return err
		}
		return s.checkPID(pid)
	})
}

// checkPID reports a statement that ran on another backend than the one s
// started on: the connection goes through a transaction-pooling proxy.
func (s *session) checkPID(pid int32) error {
	if pid != s.pid {
		return fmt.Errorf("pgfence: advisory: the session's statements ran on backend %d, then on backend %d: "+
			"the connection goes through a transaction- or statement-pooling proxy (such as PgBouncer "+
			"with pool_mode=transaction), where session advisory locks do not work; connect the Locker "+
			"directly to PostgreSQL, or use Locker.TryAcquireTx/AcquireTx", s.pid, pid)
	}
	return nil
}

// The turn: requests queued on the session run together.

// request is one acquire's lock request, or one Release's unlock, queued
// on a session for its turn.
type request struct {
	ctx, values context.Context // the operation's ctx; the caller's own
	key         Key
	shared      bool
	unlock      *Lease        // the lock to release; nil for a lock request
	done        chan struct{} // closed once the answer below is set
	l           *Lease        // a lock request's grant
	released    bool          // an unlock's: this call ended the lock
	err         error
}

// grant asks for key on s, combined with the requests queued meanwhile. ran
// is false when ctx ended before the request was taken into a statement
// (err is then ctx.Err()); once taken, it is answered whatever ctx does.
func (s *session) grant(ctx, values context.Context, key Key, shared bool) (l *Lease, ran bool, err error) {
	r := &request{ctx: ctx, values: values, key: key, shared: shared, done: make(chan struct{})}
	if !s.submit(ctx.Done(), r) {
		return nil, false, ctx.Err()
	}
	return r.l, true, r.err
}

// submit queues r on s and returns once r is answered: by this caller, when
// it gets the turn and runs every request queued then, or by another caller
// that had it. When cancel closes before r was taken into a statement,
// submit withdraws r and returns false.
func (s *session) submit(cancel <-chan struct{}, r *request) bool {
	s.qmu.Lock()
	s.pending = append(s.pending, r)
	s.qmu.Unlock()
	for {
		select {
		case s.sem <- struct{}{}:
			// A turn answers or requeues each request it took before it
			// ends, so r is answered or still queued.
			select {
			case <-r.done:
			default:
				s.gather()
				s.qmu.Lock()
				batch := s.pending
				s.pending = nil
				s.qmu.Unlock()
				s.runTurn(r.ctx, r, batch)
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
			// Taken into a statement, or to be requeued: wait.
			cancel = nil
		}
	}
}

// gatherRounds bounds how often gather yields.
const gatherRounds = 4

// gather lets the goroutines about to queue on s do so before the caller
// with the turn takes the queue, so that they share its statements. It
// yields until the queue stops growing, at most gatherRounds times, and
// never sleeps. The caller has the turn.
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

// maxLockBatch is the most lock requests one statement carries (the most
// positions pgfence_next_tokens draws for).
const maxLockBatch = 65536

// runTurn answers the requests of batch, own (the turn holder's) among
// them, in two phases: the unlocks in one statement, answered at once; then
// the lock requests, with those queued meanwhile, in another. When own is
// an unlock, the lock requests are requeued for the next turn instead.
// ctx lends its values to the statements. The caller has the turn.
func (s *session) runTurn(ctx context.Context, own *request, batch []*request) {
	h := s.k.hooks
	var grants, unlocks []*request
	for _, r := range batch {
		if r.unlock != nil {
			unlocks = append(unlocks, r)
		} else {
			grants = append(grants, r)
		}
	}
	if len(unlocks) > 0 {
		if live := s.liveUnlocks(unlocks); len(live) > 0 {
			s.unlockBatch(ctx, live)
		}
		for _, r := range unlocks {
			close(r.done)
		}
		h.unlocksAnswered()
		if own.unlock != nil {
			s.requeue(grants)
			grants = nil
		} else {
			s.gather()
			if h.recollect() {
				grants = append(grants, s.takeGrants()...)
			}
		}
	}
	h.turn(len(grants), len(unlocks))
	for part := range slices.Chunk(grants, h.lockBatchMax()) {
		s.lockBatch(ctx, part)
	}
	for _, r := range grants {
		close(r.done)
	}
}

// requeue puts grants back at the head of s's queue.
func (s *session) requeue(grants []*request) {
	if len(grants) == 0 {
		return
	}
	s.qmu.Lock()
	s.pending = append(grants, s.pending...)
	s.qmu.Unlock()
}

// takeGrants removes the lock requests queued on s and returns them.
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

// Lock statements.

// tryLockSQL takes the session-level exclusive advisory lock on $1 if no
// other session holds it and, only when granted, draws a fencing token from
// the schema %[1]s in the same statement (NULL when not granted).
const tryLockSQL = `SELECT CASE WHEN pg_catalog.pg_try_advisory_lock($1) THEN %[1]s.pgfence_next_token() END, pg_catalog.pg_backend_pid()`

// tryLockSharedSQL is tryLockSQL for the shared lock on $1.
const tryLockSharedSQL = `SELECT CASE WHEN pg_catalog.pg_try_advisory_lock_shared($1) THEN %[1]s.pgfence_next_token() END, pg_catalog.pg_backend_pid()`

// tryLockBatchSQL tries, for each key of $1 in order, the session-level
// lock (shared where $2 is true), then draws with one pgfence_next_tokens
// call a token for each granted one, in that order (NULL when not granted).
// It returns each key's position in $1 (from 1), its token and the
// backend's pid.
const tryLockBatchSQL = `WITH g AS MATERIALIZED (SELECT pg_catalog.array_agg(CASE WHEN r.sh ` +
	`THEN pg_catalog.pg_try_advisory_lock_shared(r.k) ELSE pg_catalog.pg_try_advisory_lock(r.k) END ORDER BY r.i) AS granted ` +
	`FROM ROWS FROM (pg_catalog.unnest($1::pg_catalog.int8[]), pg_catalog.unnest($2::pg_catalog.bool[])) WITH ORDINALITY AS r(k, sh, i)) ` +
	`SELECT t.i, t.token, pg_catalog.pg_backend_pid() ` +
	`FROM g, pg_catalog.unnest(%[1]s.pgfence_next_tokens(g.granted)) WITH ORDINALITY AS t(token, i)`

// readOnlySQLState is read_only_sql_transaction: the server is a standby.
const readOnlySQLState = "25006"

// errSessionFailed is the error of a request whose session failed before
// its turn came; the acquire retries on another session.
var errSessionFailed = errors.New("the session failed")

// lockBatch answers the lock requests of batch with one statement on s
// (tryLockSQL when alone, tryLockBatchSQL otherwise). When the server fails
// the combined statement on a live session, it is undone and each request
// runs alone. The caller has the turn.
func (s *session) lockBatch(ctx context.Context, batch []*request) {
	k := s.k
	k.hooks.lockStatement(len(batch))
	if len(batch) == 1 {
		r := batch[0]
		r.l, r.err = s.lock(r.ctx, r.values, r.key, r.shared)
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
	warned := s.warnings.Load()
	tokens, err := s.queryBatch(ctx, batch)
	if err == nil && s.distrusted(warned) && slices.ContainsFunc(tokens, func(t *int64) bool { return t != nil }) {
		if uerr := s.undoFailedBatch(ctx, batch); uerr != nil {
			s.fail(ctx, uerr)
			for _, r := range batch {
				r.err = fmt.Errorf("pgfence: advisory: lock %v: session failed, its locks are lost: %w", r.key, uerr)
			}
			return
		}
		for _, r := range batch {
			r.err = fmt.Errorf("pgfence: advisory: lock %v: %w", r.key, errUnconfirmedCommit)
		}
		return
	}
	if err != nil {
		var pgErr *pgconn.PgError
		readOnly := errors.As(err, &pgErr) && pgErr.Code == readOnlySQLState
		if pgErr != nil && !readOnly && !s.conn.IsClosed() && s.undoFailedBatch(ctx, batch) == nil {
			for _, r := range batch {
				r.l, r.err = s.lock(r.ctx, r.values, r.key, r.shared)
			}
			return
		}
		s.fail(ctx, err)
		for _, r := range batch {
			r.err = fmt.Errorf("pgfence: advisory: lock %v: session failed, its locks are lost: %w", r.key, err)
		}
		return
	}
	for i, r := range batch {
		if tokens[i] == nil {
			r.err = fmt.Errorf("pgfence: advisory: lock %v: %w", r.key, pgfence.ErrNotAcquired)
			continue
		}
		r.l = s.granted(r.values, r.key, r.shared, *tokens[i])
	}
}

// lock runs the single-key lock statement on s with ctx (values is the
// caller's own, kept by the Lease). A server error on a live session is
// undone and returned, keeping the session; any other failure, or a
// read-only server, drops the session. The caller has the turn.
func (s *session) lock(ctx, values context.Context, key Key, shared bool) (*Lease, error) {
	k := s.k
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
	warned := s.warnings.Load()
	if err := s.queryKey(ctx, q, key.id, &token); err != nil {
		// Session locks survive the rollback of the statement that took
		// them: a failed statement may have left the lock granted.
		var pgErr *pgconn.PgError
		readOnly := errors.As(err, &pgErr) && pgErr.Code == readOnlySQLState
		if pgErr != nil && !readOnly && !s.conn.IsClosed() && s.undoFailedLock(ctx, key, shared) == nil {
			return nil, fmt.Errorf("pgfence: advisory: lock %v: %w", key, err)
		}
		s.fail(ctx, err)
		return nil, fmt.Errorf("pgfence: advisory: lock %v: session failed, its locks are lost: %w", key, err)
	}
	if token == nil {
		return nil, fmt.Errorf("pgfence: advisory: lock %v: %w", key, pgfence.ErrNotAcquired)
	}
	if s.distrusted(warned) {
		if err := s.undoFailedLock(ctx, key, shared); err != nil {
			s.fail(ctx, err)
			return nil, fmt.Errorf("pgfence: advisory: lock %v: session failed, its locks are lost: %w", key, err)
		}
		return nil, fmt.Errorf("pgfence: advisory: lock %v: %w", key, errUnconfirmedCommit)
	}
	return s.granted(values, key, shared, *token), nil
}

// queryBatch runs tryLockBatchSQL for batch on s (as queryKey runs its
// statement) and returns each request's token, nil when not granted. The
// caller has the turn.
func (s *session) queryBatch(ctx context.Context, batch []*request) ([]*int64, error) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.k.cfg.QueryTimeout)
	defer cancel()
	keys, shared := make([]int64, len(batch)), make([]bool, len(batch))
	for i, r := range batch {
		keys[i], shared[i] = r.key.id, r.shared
	}
	rows, err := s.conn.Query(ctx, s.k.sql.tryLockBatch, keys, shared)
	if err != nil {
		return nil, err
	}
	tokens := make([]*int64, len(batch))
	return tokens, scanPositions(s, rows, tokens)
}

// scanPositions reads the rows (position from 1, value, backend pid) of a
// combined statement for len(out) keys, checks the pid and that each
// position comes once, and stores each value at its position in out. It
// closes rows.
func scanPositions[T any](s *session, rows pgx.Rows, out []T) error {
	defer rows.Close()
	seen := make([]bool, len(out))
	got := 0
	var ( // declared once: Scan would allocate per row otherwise
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

// errAmbiguousUndo is the error of an undo that cannot tell whether the
// failed statement's grant stuck.
var errAmbiguousUndo = errors.New("pgfence: advisory: the session already holds the key")

// undoFailedBatch undoes what a failed combined statement may have granted,
// as undoFailedLock does per key; a key asked for twice cannot be told
// apart, and returns errAmbiguousUndo. The caller has the turn.
func (s *session) undoFailedBatch(ctx context.Context, batch []*request) error {
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
		if err := s.undoFailedLock(ctx, r.key, r.shared); err != nil {
			return err
		}
	}
	return nil
}

// undoFailedLock releases key on s if a failed lock statement left it
// granted. That is decidable only when s holds no other hold of key;
// otherwise, or when the unlock fails, it returns an error and the caller
// must drop the session. The caller has the turn.
func (s *session) undoFailedLock(ctx context.Context, key Key, shared bool) error {
	k := s.k
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
	return s.queryKey(ctx, q, key.id, &released)
}

// granted records a lock granted on s with token, turning the acquisition's
// reservation into the Lease's, and returns the Lease.
func (s *session) granted(values context.Context, key Key, shared bool, token int64) *Lease {
	k := s.k
	l := &Lease{k: k, s: s, key: key, shared: shared, token: token, acquired: time.Now(), values: values}
	l.ctx, l.cancel = context.WithCancelCause(hold.Mark(context.Background(), k, key.markName(), l))
	k.mu.Lock()
	s.inflight--
	s.locks[l] = struct{}{}
	k.mu.Unlock()
	return l
}

// Unlock statements.

// unlockSQL releases one hold of the session-level exclusive lock on $1.
const unlockSQL = `SELECT pg_catalog.pg_advisory_unlock($1), pg_catalog.pg_backend_pid()`

// unlockSharedSQL releases one hold of the session-level shared lock on $1.
const unlockSharedSQL = `SELECT pg_catalog.pg_advisory_unlock_shared($1), pg_catalog.pg_backend_pid()`

// unlockNotifySQL is unlockSQL that then wakes the waiters of other
// Lockers, if any (see wake.go): when the unlock succeeded it tries the
// transaction lock on $1's interest key, which fails only while a LISTEN
// connection holds it, and then sends NOTIFY. CASE fixes the order.
const unlockNotifySQL = `SELECT CASE WHEN NOT pg_catalog.pg_advisory_unlock($1::pg_catalog.int8) THEN false ` + unlockWakeSQL

// unlockSharedNotifySQL is unlockNotifySQL for the shared lock on $1.
const unlockSharedNotifySQL = `SELECT CASE WHEN NOT pg_catalog.pg_advisory_unlock_shared($1::pg_catalog.int8) THEN false ` + unlockWakeSQL

// unlockWakeSQL is the end of unlockNotifySQL: the NOTIFY of waiters.
const unlockWakeSQL = `WHEN pg_catalog.pg_try_advisory_xact_lock(` + interestClassIDText + `, ` + interestObjIDSQL + `) THEN true ` +
	`ELSE ` + asyncCommitSQL + ` AND pg_catalog.pg_notify('` + NotifyChannel + `', $1::pg_catalog.int8::pg_catalog.text) IS NOT NULL END, pg_catalog.pg_backend_pid()`

// asyncCommitSQL lets an unlock that notifies commit without waiting for
// the WAL flush: it changes no data, and never shares its transaction with
// a token draw.
const asyncCommitSQL = `pg_catalog.set_config('synchronous_commit', 'off', true) IS NOT NULL`

// unlockBatchSQL releases, for each key of $1 in order, one hold of the
// session-level lock (shared where $2 is true) and, where $3 is true and
// the unlock succeeded, wakes waiters as unlockNotifySQL does. It returns
// each key's position in $1 (from 1), whether the session held the lock,
// and the backend's pid.
const unlockBatchSQL = `SELECT r.i, CASE WHEN NOT CASE WHEN r.sh THEN pg_catalog.pg_advisory_unlock_shared(r.k) ` +
	`ELSE pg_catalog.pg_advisory_unlock(r.k) END THEN false WHEN NOT r.n THEN true ` +
	`WHEN pg_catalog.pg_try_advisory_xact_lock(` + interestClassIDText + `, ` + interestObjIDOfRow + `) THEN true ` +
	`ELSE ` + asyncCommitSQL + ` AND pg_catalog.pg_notify('` + NotifyChannel + `', r.k::pg_catalog.text) IS NOT NULL END, pg_catalog.pg_backend_pid() ` +
	`FROM ROWS FROM (pg_catalog.unnest($1::pg_catalog.int8[]), pg_catalog.unnest($2::pg_catalog.bool[]), ` +
	`pg_catalog.unnest($3::pg_catalog.bool[])) WITH ORDINALITY AS r(k, sh, n, i)`

// interestObjIDOfRow is interestObjIDSQL for the key r.k of unlockBatchSQL.
const interestObjIDOfRow = `(((r.k OPERATOR(pg_catalog.#) (r.k OPERATOR(pg_catalog.>>) 32)) ` +
	`OPERATOR(pg_catalog.&) 4294967295) OPERATOR(pg_catalog.-) 2147483648)::pg_catalog.int4`

// errNotHeldByServer is the failure of an unlock the server answered
// false: the session did not hold the lock.
var errNotHeldByServer = errors.New("the server reports the lock was not held by the session")

// liveUnlocks answers the unlocks of batch whose lock was lost, without a
// statement, and returns the others, marked as ended by their call.
func (s *session) liveUnlocks(batch []*request) []*request {
	k := s.k
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

// unlockBatch answers the unlocks of live (none lost) with one statement on
// s. A failed statement, or a lock the server says s did not hold, drops s
// with every lock on it. The caller has the turn.
func (s *session) unlockBatch(ctx context.Context, live []*request) {
	if len(live) == 1 {
		live[0].err = s.unlock(live[0].ctx, live[0].unlock)
		return
	}
	ok, err := s.queryUnlocks(ctx, live)
	if err != nil {
		s.failUnlocks(ctx, live, err, nil)
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
		s.failUnlocks(ctx, live, errNotHeldByServer, failed)
	}
}

// queryUnlocks runs unlockBatchSQL for batch on s (as queryKey runs its
// statement) and returns whether the server held each lock. The caller has
// the turn.
func (s *session) queryUnlocks(ctx context.Context, batch []*request) ([]bool, error) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.k.cfg.QueryTimeout)
	defer cancel()
	keys, shared, notify := make([]int64, len(batch)), make([]bool, len(batch)), make([]bool, len(batch))
	for i, r := range batch {
		keys[i], shared[i] = r.key.id, r.shared
		_, notify[i] = r.unlock.unlockStatement()
	}
	rows, err := s.conn.Query(ctx, unlockBatchSQL, keys, shared, notify)
	if err != nil {
		return nil, err
	}
	ok := make([]bool, len(batch))
	return ok, scanPositions(s, rows, ok)
}

// unlock runs l's unlock statement alone on s, with ctx's values. The
// caller has the turn and has checked that l is not lost.
func (s *session) unlock(ctx context.Context, l *Lease) error {
	q, _ := l.unlockStatement()
	var ok bool
	err := s.queryKey(ctx, q, l.key.id, &ok)
	if err == nil && !ok {
		err = errNotHeldByServer
	}
	if err != nil {
		s.fail(ctx, err, l)
		return l.failedUnlock()
	}
	l.unlocked()
	return nil
}

// failUnlocks drops s after a failed unlock statement (failed nil: every
// unlock of batch failed) and answers the failed unlocks. The caller has
// the turn.
func (s *session) failUnlocks(ctx context.Context, batch []*request, cause error, failed []*Lease) {
	if failed == nil {
		for _, r := range batch {
			failed = append(failed, r.unlock)
		}
	}
	s.fail(ctx, cause, failed...)
	for _, r := range batch {
		if slices.Contains(failed, r.unlock) {
			r.err = r.unlock.failedUnlock()
		}
	}
}

// Parked waits: the session blocks in pg_advisory_lock for one key.

// parkLockSQL sets lock_timeout for the statement's transaction to $2
// milliseconds or half of deadlock_timeout, whichever is shorter (at least
// 10ms), then waits in pg_advisory_lock for the exclusive lock on $1 and
// draws a token from the schema %[1]s. It returns the token and the
// backend's pid. A parked wait never reaches deadlock_timeout, whose
// deadlock check would stall every lock of the database.
const parkLockSQL = `WITH t AS MATERIALIZED (SELECT pg_catalog.set_config('lock_timeout', ` +
	`GREATEST(10, LEAST($2::pg_catalog.int8, (pg_catalog.date_part('epoch', ` +
	`pg_catalog.current_setting('deadlock_timeout')::pg_catalog.interval) OPERATOR(pg_catalog.*) 500)::pg_catalog.int8))::pg_catalog.text ` +
	`OPERATOR(pg_catalog.||) 'ms', true)), ` +
	`l AS MATERIALIZED (SELECT pg_catalog.pg_advisory_lock($1::pg_catalog.int8) FROM t) ` +
	`SELECT %[1]s.pgfence_next_token(), pg_catalog.pg_backend_pid() FROM l`

// queryCanceled is the SQLSTATE of a statement ended by a cancel request.
const queryCanceled = "57014"

// errParkTimeout is parkOnce's error when the wait ended without a grant
// to hand out and s holds nothing: wait again, unless ctx or the Locker's
// close ended it.
var errParkTimeout = errors.New("the parked wait timed out")

// park waits on s, reserved for key by parkSessionLocked (open: dial it
// first), for the exclusive lock on key in the server, running parkLockSQL
// until it is granted. It returns the granted Lease, not yet handed out, or
// ctx's error when ctx ended (nothing is held), a transient error when s
// failed, or the server's error.
func (s *session) park(ctx, values context.Context, key Key, open bool) (*Lease, error) {
	k := s.k
	if err := s.ready(ctx, open); err != nil {
		s.unpark(key.id)
		return nil, err
	}
	select {
	case s.sem <- struct{}{}:
	case <-ctx.Done():
		s.unpark(key.id)
		return nil, ctx.Err()
	}
	for {
		token, err := s.parkOnce(ctx, key)
		if err == nil {
			k.mu.Lock()
			s.parked = false
			k.mu.Unlock()
			l := s.granted(values, key, false, token)
			<-s.sem // before the hand-out: a Release queues on s too
			return l, nil
		}
		if errors.Is(err, errParkTimeout) && ctx.Err() == nil && k.closeCtx.Err() == nil {
			continue
		}
		<-s.sem
		s.unpark(key.id)
		if errors.Is(err, errParkTimeout) {
			err = ctx.Err()
			if err == nil {
				err = pgfence.ErrClosed
			}
		}
		return nil, err
	}
}

// unpark gives back the parked reservation for key id (not granted),
// waking the Locker's other calls for the key.
func (s *session) unpark(id int64) {
	k := s.k
	k.mu.Lock()
	s.parked = false
	s.inflight--
	k.dropKeyRefLocked(id)
	k.mu.Unlock()
}

// parkOnce runs one wait statement on s for key. It returns the token, or
// errParkTimeout when the wait ended without the lock (lock_timeout, or a
// cancel) with s fit for another; on any other error s holds nothing or was
// closed. A grant whose statement drew a WARNING (its own cancel request,
// or someone else's, reached the commit's wait for a synchronous standby)
// is not returned: s is closed, freeing the lock. The caller has the turn
// and the parked reservation.
func (s *session) parkOnce(ctx context.Context, key Key) (int64, error) {
	k := s.k
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
	// A cancel request ends the statement and keeps the session (pgx would
	// close it if qctx were cancelled).
	var cancelErr error // set before sent closes
	sent := make(chan struct{})
	cancel := sync.OnceFunc(func() {
		defer close(sent)
		cctx, ccancel := context.WithTimeout(context.Background(), k.cfg.QueryTimeout)
		defer ccancel()
		cancelErr = s.conn.PgConn().CancelRequest(cctx)
	})
	if ctx.Err() != nil || k.closeCtx.Err() != nil {
		return 0, errParkTimeout // ended before the statement: send none
	}
	stopCtx := context.AfterFunc(ctx, cancel)
	stopClose := context.AfterFunc(k.closeCtx, cancel)
	var token, pid int64
	warned := s.warnings.Load()
	err := s.conn.QueryRow(qctx, k.sql.parkLock, key.id, wait.Milliseconds()).Scan(&token, &pid)
	// Wait for a cancel under way: once the server took it, it cannot reach
	// a later statement. One whose sending failed still may: then s is not
	// reused.
	unsure := false
	if stoppedCtx, stoppedClose := stopCtx(), stopClose(); !stoppedCtx || !stoppedClose {
		<-sent
		unsure = cancelErr != nil
	}
	if err == nil {
		if err = s.checkPID(int32(pid)); err != nil {
			s.fail(ctx, err)
			return 0, fmt.Errorf("pgfence: advisory: lock %v: %w", key, err)
		}
		if unsure {
			s.closeParked(ctx) // releases the lock; the caller is leaving
			return 0, errParkTimeout
		}
		if s.distrusted(warned) {
			s.closeParked(ctx) // releases the lock; the acquire retries
			return 0, fmt.Errorf("pgfence: advisory: lock %v: %w: %w", key, errUnconfirmedCommit, errSessionFailed)
		}
		return token, nil
	}
	if unsure {
		s.closeParked(ctx)
		return 0, errParkTimeout
	}
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || s.conn.IsClosed() || pgErr.Code == readOnlySQLState {
		s.fail(ctx, err)
		return 0, fmt.Errorf("pgfence: advisory: lock %v: session failed: %w", key, err)
	}
	// A server error: release the lock if the grant came first (s holds
	// nothing else, so that is decidable).
	if uerr := s.undoFailedLock(ctx, key, false); uerr != nil {
		s.fail(ctx, uerr)
		return 0, fmt.Errorf("pgfence: advisory: lock %v: session failed: %w", key, uerr)
	}
	if pgErr.Code == lockNotAvailable || pgErr.Code == queryCanceled {
		return 0, errParkTimeout // lock_timeout, statement_timeout or the cancel
	}
	return 0, fmt.Errorf("pgfence: advisory: lock %v: %w", key, err)
}

// closeParked closes s, a parked session that a cancel request may still
// reach; it holds nothing handed out. The caller has the turn.
func (s *session) closeParked(ctx context.Context) {
	s.k.mu.Lock()
	if s.dead {
		s.k.mu.Unlock()
		return
	}
	s.closeEmptyLocked(ctx, "pgfence: advisory: parked session closed: a cancel request to it may still arrive")
}

// Failure and close.

// unlockAllSQL releases every session-level advisory lock of the session.
const unlockAllSQL = `SELECT pg_catalog.pg_advisory_unlock_all()`

// fail marks s dead and closes it: every lock on it is lost (its context
// cancelled with a cause matching pgfence.ErrLeaseLost, a Lost event for
// each handed out except releasing, whose Release reports the failure).
// The holders are told before the close, which frees the locks on the
// server. ctx lends its values to the log record. The caller has the turn.
func (s *session) fail(ctx context.Context, cause error, releasing ...*Lease) {
	k := s.k
	k.mu.Lock()
	if s.dead {
		k.mu.Unlock()
		return
	}
	s.dead = true
	s.removeLocked()
	lostCause := fmt.Errorf("%w: advisory session (backend pid %d): %w", pgfence.ErrSessionEnded, s.pid, cause)
	n := len(s.locks)
	now := time.Now()
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
	closing := errors.Is(cause, pgfence.ErrClosed)
	if !closing && retry.Transient(cause) {
		listener.Suspect() // the LISTEN connection may be gone too
	}
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), k.cfg.QueryTimeout)
	defer cancel()
	if closing {
		// Free the locks before Close returns.
		_, _ = s.conn.Exec(cctx, unlockAllSQL)
	} else {
		k.log.WarnContext(ctx, "pgfence: advisory: lock session lost", "session", s.id, "pid", s.pid, "locks", n, "error", cause)
	}
	_ = s.conn.Close(cctx)
}

// closeEmptyLocked closes s, which holds no lock handed out, and logs msg
// at Debug. The caller holds k.mu, which it releases, and has the turn.
func (s *session) closeEmptyLocked(ctx context.Context, msg string) {
	k := s.k
	s.dead = true
	s.removeLocked()
	close(s.stop)
	k.mu.Unlock()
	k.log.DebugContext(ctx, msg, "session", s.id, "pid", s.pid)
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), k.cfg.QueryTimeout)
	defer cancel()
	_ = s.conn.Close(cctx)
}

// The watchdog.

// sessionPeekInterval is how often the watchdog looks whether an idle
// session's socket has anything to read.
const sessionPeekInterval = 50 * time.Millisecond

// watch is the watchdog of s. Every SessionCheckInterval it checks s, when
// idle, with a round trip; in between, every peek (sessionPeekInterval), it looks
// without one whether the idle socket has anything to read (the server is
// ending the session) and then checks at once. A session in use is checked
// by its statement. A session without locks for SessionIdleTimeout is
// closed.
func (s *session) watch(peek time.Duration) {
	k := s.k
	defer k.wg.Done()
	every := k.cfg.SessionCheckInterval
	if peek > 0 && peek < every {
		every = peek
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
		if due && s.retireIfIdle(&idleSince) {
			<-s.sem
			return
		}
		s.check()
		<-s.sem
	}
}

// check is one watchdog check of s, the renewal of its locks: an OpRenew
// covering every lock on s, with the values of the ctx that acquired the
// oldest. On success each lock is Renewed; on failure s fails. The caller
// has the turn.
func (s *session) check() {
	k := s.k
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
	err := s.ping(ctx)
	if err != nil {
		err = fmt.Errorf("pgfence: advisory: liveness check failed: %w", err)
	}
	if k.ev != nil && first != nil {
		k.ev.EndOp(ctx, op, err)
	}
	if err != nil {
		s.fail(ctx, err)
		return
	}
	for _, l := range leases {
		if l.Err() == nil {
			k.ev.Async(context.WithoutCancel(l.values), pgfence.Renewed{Lock: l.lock()})
		}
	}
}

// retireIfIdle closes s when it has had no lock and nothing in flight for
// SessionIdleTimeout. The caller has the turn.
func (s *session) retireIfIdle(idleSince *time.Time) bool {
	k := s.k
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
	s.closeEmptyLocked(context.Background(), "pgfence: advisory: idle lock session closed")
	return true
}
