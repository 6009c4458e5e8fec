package leasetable

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// Group commit. Concurrent acquires (and concurrent releases) of one Locker
// are combined: while a statement is in flight, new requests queue, and the
// next statement carries all of them, so N requests cost one round trip and
// one WAL flush instead of N. A request that finds no statement in flight
// is sent at once: there is no timer, and a lone request is not delayed.

// maxInflight is how many statements of one kind (acquire or release) a
// Locker runs at once; requests arriving while that many are in flight wait
// for the next batch. One gave the most cycles per second with 16 clients
// on a durable server (BenchmarkDurableCycles; 2 and 4 were slower): larger
// batches, fewer WAL flushes.
const maxInflight = 1

// maxBatch bounds the number of requests in one statement.
const maxBatch = 1000

// batcher runs requests in batches, at most maxInflight batches at a time,
// each in its own goroutine.
type batcher[R any] struct {
	// exec runs one statement for batch and answers every request in it;
	// on a statement error it answers none and returns the error.
	exec func(batch []R) error
	fail func(r R, err error) // answers r with err

	mu      sync.Mutex
	queue   []R
	running int
	closed  bool
	wg      sync.WaitGroup // running batch goroutines
}

// submit queues r, starting a batch goroutine when fewer than maxInflight
// are running. After close, r runs alone in the calling goroutine.
func (b *batcher[R]) submit(r R) {
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		b.run([]R{r})
		return
	}
	b.queue = append(b.queue, r)
	if b.running >= maxInflight {
		b.mu.Unlock()
		return
	}
	b.running++
	b.wg.Add(1)
	b.mu.Unlock()
	go b.drain()
}

// drain runs batches until the queue is empty.
func (b *batcher[R]) drain() {
	defer b.wg.Done()
	for {
		b.mu.Lock()
		n := min(len(b.queue), maxBatch)
		if n == 0 {
			b.running--
			b.mu.Unlock()
			return
		}
		batch := slices.Clone(b.queue[:n])
		b.queue = slices.Delete(b.queue, 0, n)
		b.mu.Unlock()
		b.run(batch)
	}
}

// run runs one batch and answers every request in it. When the statement
// fails with a deadlock, the requests are retried one by one, which cannot
// deadlock: acquire batches insert in name order, but an UPDATE joined to
// its input (a release or renewal batch) locks rows in whatever order its
// plan visits them.
func (b *batcher[R]) run(batch []R) {
	err := b.exec(batch)
	if err != nil && isDeadlock(err) && len(batch) > 1 {
		for _, r := range batch {
			if err := b.exec([]R{r}); err != nil {
				b.fail(r, err)
			}
		}
		return
	}
	if err != nil {
		for _, r := range batch {
			b.fail(r, err)
		}
	}
}

// close waits for the running batches; later requests run alone in the
// caller's goroutine.
func (b *batcher[R]) close() {
	b.mu.Lock()
	b.closed = true
	b.mu.Unlock()
	b.wg.Wait()
}

// batchContext returns a context for a statement run on behalf of the
// requests whose contexts are ctxs: it is cancelled when every one of them
// has ended (nobody waits for the answer any more), or when parent ends.
func batchContext(parent context.Context, ctxs []context.Context) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(parent)
	remaining := atomic.Int64{}
	remaining.Store(int64(len(ctxs)))
	stops := make([]func() bool, 0, len(ctxs))
	for _, c := range ctxs {
		stops = append(stops, context.AfterFunc(c, func() {
			if remaining.Add(-1) == 0 {
				cancel()
			}
		}))
	}
	return ctx, func() {
		for _, stop := range stops {
			stop()
		}
		cancel()
	}
}

func isDeadlock(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "40P01"
}

// acquireBatchSQL takes a batch of leases in one statement, each as
// acquireSQL would: it inserts each missing row and takes over each row
// whose lease has expired (expires_at <= now(), database clock), drawing a
// fresh token under the row lock. Rows are inserted or locked in name
// order, so two batches over the same names cannot deadlock with each
// other. For each name it returns one row: the new lease (true), or the
// current holder (false); no row when the holder committed after this
// statement's snapshot. Names must be distinct: ON CONFLICT cannot affect a
// row twice in one statement.
//
// Tokens are drawn by pgfence_next_token() only for names that have no
// row or whose row is free in the statement's snapshot, so that a failed
// attempt on a held lease draws no token. A name absent from the snapshot
// draws its token before inserting, which (as for acquireSQL) is only used
// when no row exists; on conflict the token is drawn again under the row
// lock.
//
// $1 names, $2 owner, $3 TTLs in microseconds (parallel arrays).
const acquireBatchSQL = `
WITH req AS (
    SELECT r.name, r.ttl_us FROM unnest($1::text[], $3::bigint[]) AS r(name, ttl_us)
), acquired AS (
    INSERT INTO pgfence_leases AS l (name, owner, fence, acquired_at, expires_at)
    SELECT r.name, $2, pgfence_next_token(), now(), now() + r.ttl_us * interval '1 microsecond'
    FROM req r
    WHERE NOT EXISTS (SELECT FROM pgfence_leases h WHERE h.name = r.name AND h.expires_at > now())
    ORDER BY r.name
    ON CONFLICT (name) DO UPDATE
        SET owner = excluded.owner,
            fence = pgfence_next_token(),
            acquired_at = excluded.acquired_at,
            expires_at = excluded.expires_at
        WHERE l.expires_at <= now()
    RETURNING l.name, l.owner, l.fence, l.acquired_at, l.expires_at
)
SELECT true, name, owner, fence, acquired_at, expires_at, now() FROM acquired
UNION ALL
SELECT false, p.name, p.owner, p.fence, p.acquired_at, p.expires_at, now()
FROM pgfence_leases p
WHERE p.name IN (SELECT name FROM req) AND p.name NOT IN (SELECT name FROM acquired)`

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
	acquired              bool
	owner                 string
	token                 int64
	acquiredAt, expiresAt time.Time
	dbNow                 time.Time
	sent                  time.Time // when the statement was sent
	err                   error
}

// acquire runs one acquire through the Locker's batcher and waits for the
// reply or the end of ctx.
func (k *Locker) acquire(ctx context.Context, name string, t leaseTiming) (acquireReply, error) {
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

// execAcquires runs acquireBatchSQL for batch and answers each request; on
// a statement error it answers none and returns the error.
func (k *Locker) execAcquires(batch []*acquireReq) error {
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
	ctx, cancel := batchContext(k.closeCtx, ctxs)
	defer cancel()
	sent := time.Now()
	rows, err := k.pool.Query(ctx, acquireBatchSQL, names, k.cfg.Owner, ttls)
	if err != nil {
		return err
	}
	got := make(map[string]acquireReply, len(names))
	for rows.Next() {
		var (
			rep  acquireReply
			name string
		)
		if err := rows.Scan(&rep.acquired, &name, &rep.owner, &rep.token, &rep.acquiredAt, &rep.expiresAt, &rep.dbNow); err != nil {
			rows.Close()
			return err
		}
		rep.found = true
		got[name] = rep
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return err
	}
	k.replyAcquires(batch, got, sent, nil)
	return nil
}

// replyAcquires answers every request in batch: with err when it is not
// nil, else from got. A lease taken for a caller that stopped waiting is
// given back at once. Only the first request for a name gets got's answer;
// got is updated so that later ones find the lease held.
func (k *Locker) replyAcquires(batch []*acquireReq, got map[string]acquireReply, sent time.Time, err error) {
	for _, r := range batch {
		rep := acquireReply{err: err}
		if err == nil {
			rep = got[r.name]
			rep.sent = sent
			held := rep
			held.acquired = false
			got[r.name] = held
		}
		r.mu.Lock()
		if !r.abandoned {
			r.res <- rep
			r.mu.Unlock()
			continue
		}
		r.mu.Unlock()
		if rep.acquired {
			k.giveBack(r.name, rep.token)
		}
	}
}

// giveBack releases a lease that was taken for a caller that stopped
// waiting before it learnt of it.
func (k *Locker) giveBack(name string, token int64) {
	ctx, cancel := context.WithTimeout(context.Background(), k.cfg.ReleaseTimeout)
	defer cancel()
	if _, err := k.releaseRow(ctx, name, token, 0); err != nil {
		k.cfg.Logger.Warn("pgfence: leasetable: giving back a lease whose acquirer stopped waiting failed; it expires after its TTL",
			"lease", name, "token", token, "error", err)
	}
}

// releaseBatchSQL gives a batch of leases up, each as a lone release
// would: owner-checked, only rows with the name, owner and token that are
// still held, expired in place (never deleted), and a notification on
// NotifyChannel for each one that becomes free at once (delivered at
// commit). It returns the token of each lease it released. It locks those
// rows.
//
// When every released row becomes free at once (no AtLeast keeps one held),
// the transaction commits with synchronous_commit off: it does not wait for
// its WAL to be flushed. The notifications make each such commit take a
// database-wide lock until it completes, so waiting for the flush there
// would serialise every release on the server behind the disk. Losing such
// a release in a crash only keeps the lease held until its TTL ends; it can
// never make a lease look free early, and whoever takes the freed row
// commits durably, which flushes the release's WAL first. A release that
// keeps a row held (AtLeast) commits durably.
//
// The second column returns the durability setting the statement chose
// ('off', or NULL when left alone): it must be selected, or the planner
// removes the join to the subquery that sets it.
//
// $1 names, $2 tokens, $3 AtLeast in microseconds (parallel arrays), $4
// owner.
const releaseBatchSQL = `
WITH released AS (
    UPDATE pgfence_leases AS l
    SET expires_at = greatest(now(), l.acquired_at + r.at_least_us * interval '1 microsecond')
    FROM unnest($1::text[], $2::bigint[], $3::bigint[]) AS r(name, fence, at_least_us)
    WHERE l.name = r.name AND l.owner = $4 AND l.fence = r.fence AND l.expires_at > now()
    RETURNING l.name, l.fence, l.expires_at <= now() AS freed
)
SELECT r.fence, a.durability FROM released r
LEFT JOIN LATERAL (
    SELECT pg_notify('` + NotifyChannel + `', r.name) WHERE r.freed
) n ON true
LEFT JOIN (
    SELECT set_config('synchronous_commit', 'off', true) FROM released HAVING bool_and(freed)
) a(durability) ON true`

// releaseReq is one caller's request to release a lease.
type releaseReq struct {
	ctx       context.Context
	name      string
	token     int64
	atLeastUs int64
	res       chan releaseReply // buffered(1)
}

// releaseReply is the outcome of one release request: held reports whether
// the row was still this lease's and was released.
type releaseReply struct {
	held bool
	err  error
}

// releaseRow releases one lease row through the Locker's batcher. It
// reports whether the row was still held by the lease.
func (k *Locker) releaseRow(ctx context.Context, name string, token int64, atLeast time.Duration) (bool, error) {
	r := &releaseReq{ctx: ctx, name: name, token: token, atLeastUs: atLeast.Microseconds(), res: make(chan releaseReply, 1)}
	k.releases.submit(r)
	select {
	case rep := <-r.res:
		return rep.held, rep.err
	case <-ctx.Done():
		return false, ctx.Err()
	}
}

// failRelease answers one release request with err.
func failRelease(r *releaseReq, err error) { r.res <- releaseReply{err: err} }

// execReleases runs releaseBatchSQL for batch and answers each request; on
// a statement error it answers none and returns the error.
func (k *Locker) execReleases(batch []*releaseReq) error {
	slices.SortFunc(batch, func(a, b *releaseReq) int { return strings.Compare(a.name, b.name) })
	names := make([]string, 0, len(batch))
	tokens := make([]int64, 0, len(batch))
	atLeast := make([]int64, 0, len(batch))
	ctxs := make([]context.Context, 0, len(batch))
	for _, r := range batch {
		names = append(names, r.name)
		tokens = append(tokens, r.token)
		atLeast = append(atLeast, r.atLeastUs)
		ctxs = append(ctxs, r.ctx)
	}
	// The callers' contexts are already detached from cancellation and
	// bounded by the release timeout.
	ctx, cancel := batchContext(context.Background(), ctxs)
	defer cancel()
	rows, err := k.pool.Query(ctx, releaseBatchSQL, names, tokens, atLeast, k.cfg.Owner)
	if err != nil {
		return err
	}
	released := make(map[int64]bool, len(batch))
	for rows.Next() {
		var (
			token      int64
			durability *string
		)
		if err := rows.Scan(&token, &durability); err != nil {
			rows.Close()
			return err
		}
		released[token] = true
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return err
	}
	for _, r := range batch {
		r.res <- releaseReply{held: released[r.token]}
	}
	return nil
}
