package patroni

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence"
	"github.com/pgfence/pgfence/advisory"
	"github.com/pgfence/pgfence/fence"
	"github.com/pgfence/pgfence/leasetable"
	"github.com/pgfence/pgfence/test/chaos"
)

// SQL of the workload's own tables, in schema hasuite.
const (
	// setupSQL creates the protected rows and the audit trail: every
	// accepted fenced write inserts one audit row in its own transaction.
	setupSQL = `CREATE SCHEMA IF NOT EXISTS hasuite;
CREATE TABLE IF NOT EXISTS hasuite.resource (
    id          int    PRIMARY KEY,
    val         bigint NOT NULL DEFAULT 0,
    fence_token bigint NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS hasuite.audit (
    write_id bigint  PRIMARY KEY,
    resource int     NOT NULL,
    token    bigint  NOT NULL,
    val      bigint  NOT NULL,
    process  int     NOT NULL,
    zombie   boolean NOT NULL
)`
	// resourceInsertSQL adds the row of one lock name.
	resourceInsertSQL = `INSERT INTO hasuite.resource (id) VALUES ($1) ON CONFLICT (id) DO NOTHING`
	// auditInsertSQL records, in the fenced write's transaction, the value
	// the write produced; it reads the row the guarded UPDATE has locked.
	auditInsertSQL = `INSERT INTO hasuite.audit (write_id, resource, token, val, process, zombie)
SELECT $1::pg_catalog.int8, r.id, $3::pg_catalog.int8, r.val, $4::pg_catalog.int4, $5::pg_catalog.bool
FROM hasuite.resource AS r WHERE r.id = $2::pg_catalog.int4`
	// auditSelectSQL reads the audit trail, after the run.
	auditSelectSQL = `SELECT write_id, resource, token, val, process, zombie FROM hasuite.audit ORDER BY resource, val`
	// resourceSelectSQL reads the protected rows, after the run.
	resourceSelectSQL = `SELECT id, val, fence_token FROM hasuite.resource ORDER BY id`
	// listenSessionsSQL lists the LISTEN connections of the workload's
	// Lockers on a server (their application_name ends in -listen).
	listenSessionsSQL = `SELECT a.application_name FROM pg_catalog.pg_stat_activity AS a
WHERE a.application_name OPERATOR(pg_catalog.~~) 'hasuite-%-listen'`
)

// fencedWrite is the guarded write every holder makes: it adds one to its
// resource's value, under its token.
var fencedWrite = fence.Update("hasuite.resource").Set("val = val + 1").Where("id = $1")

// Hold is one grant as its holder saw it: from the Acquire's return until
// the holder learned of a loss (Done closed before it released) or started
// its Release.
type Hold struct {
	Process  int
	Strategy string
	Name     string
	Token    int64
	From     time.Duration
	// To is when the holder stopped believing it held the lock: the loss
	// it observed or its Release call; math.MaxInt64 while it holds.
	To time.Duration
	// LostAt is when the holder observed the loss (Done closed before its
	// Release); zero when it released first.
	LostAt time.Duration
	// Long marks a lease held across a fault.
	Long bool

	releasing bool
}

// Workload is the suite's clients: leasetable and advisory holders, each
// with its own Locker and pool (as separate processes would have), on the
// cluster's multi-host URL, making fenced writes with an audit trail. It
// records every grant, release and write.
type Workload struct {
	// zctx bounds the zombies, which outlive their holders' loops.
	zctx   context.Context
	clock  *Clock
	url    string
	writes *pgxpool.Pool

	mu    sync.Mutex
	ops   []chaos.Op
	holds []*Hold
	// ackedLatest maps a resource to the latest grant (Hold.From) among
	// the holds that have an acknowledged write of it.
	ackedLatest map[int]time.Duration
	ackedWake   chan struct{} // closed and replaced on each acknowledged write
	resources   map[string]int
	// pending holds the names whose row is not created yet.
	pending map[string]int
	// unavailable holds the indexes of the failed operations whose error
	// matched pgfence.ErrUnavailable.
	unavailable map[int]bool
	lockers     []func()
	pools       []*pgxpool.Pool
	writeSeq    atomic.Int64
	processes   atomic.Int64

	holders sync.WaitGroup
	zombies sync.WaitGroup
}

// NewWorkload sets up the tables on url (the multi-host URL) and returns a
// workload with a pool for its writes. ctx also bounds the zombies (see
// Holder), which may outlive the holders' own contexts.
func NewWorkload(ctx context.Context, url string, clock *Clock) (*Workload, error) {
	w := &Workload{zctx: ctx, clock: clock, url: url, ackedLatest: map[int]time.Duration{}, ackedWake: make(chan struct{}),
		resources: map[string]int{}, pending: map[string]int{}, unavailable: map[int]bool{}}
	var err error
	if w.writes, err = w.pool(ctx, "hasuite-writes", 16); err != nil {
		return nil, err
	}
	if _, err := w.writes.Exec(ctx, setupSQL); err != nil {
		w.Close()
		return nil, fmt.Errorf("patroni: workload tables: %w", err)
	}
	return w, nil
}

// pool opens a pool on the multi-host URL with application_name app.
func (w *Workload) pool(ctx context.Context, app string, maxConns int32) (*pgxpool.Pool, error) {
	pc, err := pgxpool.ParseConfig(w.url)
	if err != nil {
		return nil, err
	}
	pc.MaxConns = maxConns
	pc.ConnConfig.RuntimeParams["application_name"] = app
	p, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		return nil, err
	}
	w.mu.Lock()
	w.pools = append(w.pools, p)
	w.mu.Unlock()
	return p, nil
}

// resource returns the row protected by name, creating it: the name is
// recorded once its row's INSERT has committed (on failure the next call
// tries again with the same id).
func (w *Workload) resource(ctx context.Context, name string) (int, error) {
	w.mu.Lock()
	id, ok := w.resources[name]
	if !ok {
		if id, ok = w.pending[name]; !ok {
			id = len(w.resources) + len(w.pending) + 1
			w.pending[name] = id
		}
		ok = false
	}
	w.mu.Unlock()
	if ok {
		return id, nil
	}
	if _, err := w.writes.Exec(ctx, resourceInsertSQL, id); err != nil {
		return 0, fmt.Errorf("patroni: resource row: %w", err)
	}
	w.mu.Lock()
	delete(w.pending, name)
	w.resources[name] = id
	w.mu.Unlock()
	return id, nil
}

// LeaseLocker returns a new leasetable Locker with its own pool; its LISTEN
// connection's application_name is app + "-listen".
func (w *Workload) LeaseLocker(ctx context.Context, app string, ttl time.Duration) (*leasetable.Locker, error) {
	p, err := w.pool(ctx, app, 4)
	if err != nil {
		return nil, err
	}
	lc := p.Config().ConnConfig.Copy()
	lc.RuntimeParams["application_name"] = app + "-listen"
	l, err := leasetable.New(ctx, p, &leasetable.Config{TTL: ttl, ListenConnConfig: lc, Owner: app})
	if err != nil {
		return nil, err
	}
	w.mu.Lock()
	w.lockers = append(w.lockers, l.Close)
	w.mu.Unlock()
	return l, nil
}

// AdvisoryLocker returns a new advisory Locker with its own pool: one lock
// session, checked every 100ms.
func (w *Workload) AdvisoryLocker(ctx context.Context, app string) (*advisory.Locker, error) {
	p, err := w.pool(ctx, app+"-pool", 2)
	if err != nil {
		return nil, err
	}
	l, err := advisory.New(ctx, p, &advisory.Config{
		ApplicationName: app, MaxSessions: 1, SessionCheckInterval: 100 * time.Millisecond,
		QueryTimeout: time.Second,
	})
	if err != nil {
		return nil, err
	}
	w.mu.Lock()
	w.lockers = append(w.lockers, l.Close)
	w.mu.Unlock()
	return l, nil
}

// invoke records the start of an operation and returns its index.
func (w *Workload) invoke(op chaos.Op) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	op.Index = len(w.ops)
	op.Call = int64(w.clock.Now())
	op.Outcome = chaos.Pending
	w.ops = append(w.ops, op)
	return op.Index
}

// complete records the outcome of operation i.
func (w *Workload) complete(i int, outcome chaos.Outcome, edit func(*chaos.Op)) {
	w.mu.Lock()
	defer w.mu.Unlock()
	op := &w.ops[i]
	op.Return = int64(w.clock.Now())
	op.Outcome = outcome
	if edit != nil {
		edit(op)
	}
}

// History returns the operations recorded so far.
func (w *Workload) History() chaos.History {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append(chaos.History(nil), w.ops...)
}

// Unavailable reports whether operation i failed with an error matching
// pgfence.ErrUnavailable.
func (w *Workload) Unavailable(i int) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.unavailable[i]
}

// Holds returns a copy of the holds recorded so far.
func (w *Workload) Holds() []Hold {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := make([]Hold, len(w.holds))
	for i, h := range w.holds {
		out[i] = *h
	}
	return out
}

// granted records a grant and watches its lease: the hold ends when the
// holder learns of a loss or starts to release.
func (w *Workload) granted(p int, strategy, name string, lease pgfence.Lease, long bool) *Hold {
	h := &Hold{Process: p, Strategy: strategy, Name: name, Token: lease.Token(), From: w.clock.Now(),
		To: math.MaxInt64, Long: long}
	w.mu.Lock()
	w.holds = append(w.holds, h)
	w.mu.Unlock()
	go func() {
		<-lease.Done()
		now := w.clock.Now()
		w.mu.Lock()
		defer w.mu.Unlock()
		if !h.releasing {
			h.LostAt, h.To = now, now
		}
	}()
	return h
}

// lost reports whether the holder has learned that h was lost.
func (w *Workload) lost(h *Hold) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return h.LostAt != 0
}

// release records and runs the release of h.
func (w *Workload) release(p int, h *Hold, lease pgfence.Lease) error {
	w.mu.Lock()
	if h.To == math.MaxInt64 {
		h.releasing = true
		h.To = w.clock.Now()
	}
	lost := h.LostAt != 0
	w.mu.Unlock()
	i := w.invoke(chaos.Op{Process: p, Kind: chaos.Release, Name: h.Name, Token: h.Token, Lost: lost})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	err := lease.Release(ctx)
	outcome := chaos.Ok
	if err != nil && !errors.Is(err, pgfence.ErrNotHeld) {
		outcome = chaos.Unknown
	}
	w.complete(i, outcome, func(o *chaos.Op) {
		if err != nil {
			o.Err = err.Error()
		}
	})
	return err
}

// acquire records and runs one Acquire.
func (w *Workload) acquire(ctx context.Context, p int, strategy, name string, l pgfence.Locker,
	opts *pgfence.AcquireOpts, long bool) (pgfence.Lease, *Hold, error) {
	i := w.invoke(chaos.Op{Process: p, Kind: chaos.Acquire, Name: name})
	lease, err := l.Acquire(ctx, name, opts)
	if err != nil {
		w.complete(i, chaos.Fail, func(o *chaos.Op) { o.Err = err.Error() })
		if errors.Is(err, pgfence.ErrUnavailable) {
			w.mu.Lock()
			w.unavailable[i] = true
			w.mu.Unlock()
		}
		return nil, nil, err
	}
	h := w.granted(p, strategy, name, lease, long)
	w.complete(i, chaos.Ok, func(o *chaos.Op) { o.Token = lease.Token(); o.Return = int64(h.From) })
	return lease, h, nil
}

// Write makes one fenced write of h's resource with h's token, and its
// audit row, in one transaction; it records it (Value is the write's id).
func (w *Workload) Write(ctx context.Context, h *Hold, zombie bool) (chaos.Outcome, error) {
	p, name, token := h.Process, h.Name, h.Token
	res, err := w.resource(ctx, name)
	if err != nil {
		return chaos.Fail, err
	}
	id := w.writeSeq.Add(1)
	i := w.invoke(chaos.Op{Process: p, Kind: chaos.Write, Name: name, Token: token, Value: id, Lost: zombie})
	outcome, err := w.write(ctx, id, res, p, token, zombie)
	w.complete(i, outcome, func(o *chaos.Op) {
		if err != nil {
			o.Err = err.Error()
			o.Fenced = chaos.IsFenced(err)
		}
	})
	if outcome == chaos.Ok {
		w.mu.Lock()
		if h.From > w.ackedLatest[res] {
			w.ackedLatest[res] = h.From
		}
		close(w.ackedWake)
		w.ackedWake = make(chan struct{})
		w.mu.Unlock()
	}
	return outcome, err
}

func (w *Workload) write(ctx context.Context, id int64, res, p int, token int64, zombie bool) (chaos.Outcome, error) {
	tx, err := w.writes.Begin(ctx)
	if err != nil {
		return chaos.Fail, err
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	// An error before COMMIT was sent leaves the transaction uncommitted:
	// nothing took effect.
	if _, err := fencedWrite.Exec(ctx, tx, token, res); err != nil {
		return chaos.Fail, err
	}
	if _, err := tx.Exec(ctx, auditInsertSQL, id, res, token, p, zombie); err != nil {
		return chaos.Fail, err
	}
	switch err := tx.Commit(ctx); {
	case err == nil:
		return chaos.Ok, nil
	case errors.Is(err, pgx.ErrTxCommitRollback):
		return chaos.Fail, err
	default:
		return chaos.Unknown, err
	}
}

// laterAcked waits until a holder granted after grant has an acknowledged
// write of res, or ctx ends; it reports whether one has.
func (w *Workload) laterAcked(ctx context.Context, res int, grant time.Duration) bool {
	for {
		w.mu.Lock()
		newer := w.ackedLatest[res] > grant
		wake := w.ackedWake
		w.mu.Unlock()
		if newer {
			return true
		}
		select {
		case <-wake:
		case <-ctx.Done():
			return false
		}
	}
}

// zombie is a holder that lost its lock (h) and writes anyway: once a
// holder granted after it has had a write of the resource acknowledged (or
// after 15s), it tries one fenced write with its old token, retrying for a
// while when the database is unreachable. Every attempt is recorded with
// Lost set.
func (w *Workload) zombie(h *Hold) {
	ctx := w.zctx
	w.zombies.Add(1)
	go func() {
		defer w.zombies.Done()
		res, err := w.resource(ctx, h.Name)
		if err != nil {
			return
		}
		wctx, cancel := context.WithTimeout(ctx, 15*time.Second)
		w.laterAcked(wctx, res, h.From)
		cancel()
		deadline := time.Now().Add(10 * time.Second)
		for ctx.Err() == nil && time.Now().Before(deadline) {
			octx, cancel := context.WithTimeout(ctx, 3*time.Second)
			outcome, err := w.Write(octx, h, true)
			cancel()
			if outcome != chaos.Fail || chaos.IsFenced(err) {
				return
			}
			_ = sleepCtx(ctx, 200*time.Millisecond)
		}
	}()
}

// Holder runs a holder until ctx ends: acquire name (waiting up to 3s),
// make one or two fenced writes with pauses of up to 150ms, release. After
// a write that did not succeed it waits (up to 3s) to learn whether its
// lock was lost. A holder that learns its lock was lost stops writing,
// releases, and leaves a zombie behind (see zombie). A failed Acquire is
// retried after 20ms.
func (w *Workload) Holder(ctx context.Context, strategy, name string, l pgfence.Locker, seed uint64) {
	p := int(w.processes.Add(1))
	w.holders.Add(1)
	go func() {
		defer w.holders.Done()
		rng := rand.New(rand.NewPCG(seed, uint64(p)))
		for ctx.Err() == nil {
			actx, cancel := context.WithTimeout(ctx, 3*time.Second)
			lease, h, err := w.acquire(actx, p, strategy, name, l, nil, false)
			cancel()
			if err != nil {
				_ = sleepCtx(ctx, 20*time.Millisecond)
				continue
			}
			failed := false
			for n := 1 + rng.IntN(2); n > 0 && !w.lost(h); n-- {
				_ = sleepCtx(ctx, time.Duration(rng.Int64N(int64(150*time.Millisecond))))
				if w.lost(h) {
					break
				}
				octx, cancel := context.WithTimeout(ctx, 3*time.Second)
				if o, _ := w.Write(octx, h, false); o != chaos.Ok {
					failed = true
				}
				cancel()
			}
			if failed {
				// A write that did not go through, as during a failover:
				// find out whether the lock survived before releasing it.
				select {
				case <-lease.Done():
				case <-time.After(3 * time.Second):
				case <-ctx.Done():
				}
			}
			lost := w.lost(h)
			_ = w.release(p, h, lease)
			if lost {
				w.zombie(h)
			}
		}
	}()
}

// LongHold is a lease held across a fault by a holder that writes every
// 500ms, and a contender on another Locker waiting for it.
type LongHold struct {
	w       *Workload
	p       int
	lease   pgfence.Lease
	hold    *Hold
	stop    context.CancelFunc
	done    chan struct{}
	writes  atomic.Int64
	failed  atomic.Int64
	granted chan time.Duration // the contender's grant time
}

// StartLongHold acquires name on holder (with ttl) and keeps writing under
// it; a contender on contender waits for name meanwhile.
func (w *Workload) StartLongHold(ctx context.Context, name string, ttl time.Duration, holder, contender pgfence.Locker) (*LongHold, error) {
	p := int(w.processes.Add(1))
	actx, cancel := context.WithTimeout(ctx, 10*time.Second)
	lease, h, err := w.acquire(actx, p, "leasetable", name, holder, &pgfence.AcquireOpts{TTL: ttl}, true)
	cancel()
	if err != nil {
		return nil, fmt.Errorf("patroni: long hold of %s: %w", name, err)
	}
	hctx, stop := context.WithCancel(ctx)
	lh := &LongHold{w: w, p: p, lease: lease, hold: h, stop: stop, done: make(chan struct{}),
		granted: make(chan time.Duration, 1)}
	go func() {
		defer close(lh.done)
		for hctx.Err() == nil && !w.lost(h) {
			octx, cancel := context.WithTimeout(hctx, 3*time.Second)
			if o, _ := w.Write(octx, h, false); o == chaos.Ok {
				lh.writes.Add(1)
			} else {
				lh.failed.Add(1)
			}
			cancel()
			_ = sleepCtx(hctx, 500*time.Millisecond)
		}
	}()
	cp := int(w.processes.Add(1))
	w.holders.Add(1)
	go func() {
		defer w.holders.Done()
		for ctx.Err() == nil {
			actx, cancel := context.WithTimeout(ctx, 2*time.Minute)
			cl, ch, err := w.acquire(actx, cp, "leasetable", name, contender, &pgfence.AcquireOpts{TTL: ttl}, true)
			cancel()
			if err != nil {
				_ = sleepCtx(ctx, 20*time.Millisecond)
				continue
			}
			lh.granted <- ch.From
			octx, cancel := context.WithTimeout(ctx, 3*time.Second)
			_, _ = w.Write(octx, ch, false)
			cancel()
			_ = w.release(cp, ch, cl)
			return
		}
	}()
	return lh, nil
}

// LongResult is what became of a long hold.
type LongResult struct {
	// Kept says the lease was still held when the holder released it.
	Kept bool
	// LostAt is when the holder learned it was lost, if it was.
	LostAt time.Duration
	// Writes and Failed count its writes, acknowledged or not.
	Writes, Failed int64
	// ReleaseErr is the release's error.
	ReleaseErr error
	// Granted says the contender was granted the lease (within a minute of the
	// release); HandOver is then the time from the release's call (or, for
	// a lost lease, from the holder learning of the loss) to that grant:
	// negative when the contender was granted the lease while the holder
	// still believed it held it.
	Granted  bool
	HandOver time.Duration
	// GrantedAt is the contender's grant time, when Granted.
	GrantedAt time.Duration
	// ReleasedAt and ReleaseReturned are when the release was called and
	// when it returned.
	ReleasedAt, ReleaseReturned time.Duration
}

// Finish stops the long holder's writes, releases the lease (a lost lease
// leaves a zombie), and waits for the contender's grant.
func (lh *LongHold) Finish(ctx context.Context) LongResult {
	lh.stop()
	<-lh.done
	w := lh.w
	lost := w.lost(lh.hold)
	r := LongResult{Kept: !lost, Writes: lh.writes.Load(), Failed: lh.failed.Load()}
	w.mu.Lock()
	r.LostAt = lh.hold.LostAt
	w.mu.Unlock()
	r.ReleasedAt = w.clock.Now()
	r.ReleaseErr = w.release(lh.p, lh.hold, lh.lease)
	r.ReleaseReturned = w.clock.Now()
	if lost {
		w.zombie(lh.hold)
	}
	w.mu.Lock()
	from := lh.hold.To // the loss, or the release's call
	w.mu.Unlock()
	select {
	case g := <-lh.granted:
		r.Granted, r.HandOver, r.GrantedAt = true, g-from, g
	case <-time.After(time.Minute):
	case <-ctx.Done():
	}
	return r
}

// Stop waits for the holders (their ctx must have ended) and the zombies,
// then closes the Lockers.
func (w *Workload) Stop() {
	w.holders.Wait()
	w.zombies.Wait()
	w.mu.Lock()
	lockers := w.lockers
	w.lockers = nil
	w.mu.Unlock()
	for _, c := range lockers {
		c()
	}
}

// Close closes the pools (after Stop).
func (w *Workload) Close() {
	w.mu.Lock()
	pools := w.pools
	w.pools = nil
	w.mu.Unlock()
	for _, p := range pools {
		p.Close()
	}
}

// AuditRow is one accepted fenced write, as the final primary has it.
type AuditRow struct {
	WriteID  int64
	Resource int
	Token    int64
	Val      int64
	Process  int
	Zombie   bool
}

// Final is the database's state after the run.
type Final struct {
	Audit []AuditRow
	// Rows maps each resource to its value and token.
	Rows map[int][2]int64
}

// ReadFinal reads the audit trail and the rows through the writes pool,
// retrying for up to a minute while no primary answers.
func (w *Workload) ReadFinal(ctx context.Context) (*Final, error) {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	for {
		f, err := w.readFinal(ctx)
		if err == nil {
			return f, nil
		}
		if err := sleepCtx(ctx, 200*time.Millisecond); err != nil {
			return nil, fmt.Errorf("patroni: read final state: %w", err)
		}
	}
}

func (w *Workload) readFinal(ctx context.Context) (*Final, error) {
	f := &Final{Rows: map[int][2]int64{}}
	rows, err := w.writes.Query(ctx, auditSelectSQL)
	if err != nil {
		return nil, err
	}
	f.Audit, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (AuditRow, error) {
		var a AuditRow
		err := r.Scan(&a.WriteID, &a.Resource, &a.Token, &a.Val, &a.Process, &a.Zombie)
		return a, err
	})
	if err != nil {
		return nil, err
	}
	rows, err = w.writes.Query(ctx, resourceSelectSQL)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	for rows.Next() {
		var id int
		var val, tok int64
		if err := rows.Scan(&id, &val, &tok); err != nil {
			return nil, err
		}
		f.Rows[id] = [2]int64{val, tok}
	}
	return f, rows.Err()
}

// Resources returns the lock names and their resource ids.
func (w *Workload) Resources() map[string]int {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := make(map[string]int, len(w.resources))
	for k, v := range w.resources {
		out[k] = v
	}
	return out
}

// ListenSessions returns the application_names of the workload's LISTEN
// connections on the server at url, sorted.
func ListenSessions(ctx context.Context, url string) ([]string, error) {
	conn, err := connect(ctx, url)
	if err != nil {
		return nil, err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	rows, err := conn.Query(ctx, listenSessionsSQL)
	if err != nil {
		return nil, err
	}
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	sort.Strings(names)
	return names, err
}

func connect(ctx context.Context, url string) (*pgx.Conn, error) {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return nil, fmt.Errorf("patroni: connect: %w", err)
	}
	return conn, nil
}
