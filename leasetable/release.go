package leasetable

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/pgfence/pgfence"
	"github.com/pgfence/pgfence/internal/events"
	"github.com/pgfence/pgfence/internal/install"
	"github.com/pgfence/pgfence/internal/retry"
)

// releaseSQL gives up a batch of leases (%[1]s is the schema) through the
// SECURITY DEFINER pgfence_release: only rows still held with the token and
// secret presented, expired in place (or at acquired_at + AtLeast), with a
// notification on [NotifyChannel] for each. A release that frees every row
// at once commits with synchronous_commit off. It returns the tokens it
// released. $1 names, $2 tokens, $3 secrets, $4 AtLeast in microseconds.
const releaseSQL = `SELECT fence, durability FROM %[1]s.pgfence_release($1, $2, $3, $4)`

var errReleased = fmt.Errorf("pgfence: leasetable: lease was released: %w", pgfence.ErrNotHeld)

// Release gives the lease up: Done closes, renewals stop, and the row, if
// this lease still holds it, is expired (at once, or at acquired_at +
// [AcquireOpts].AtLeast), which wakes the waiters of every Locker. It runs
// under context.WithoutCancel(ctx) bounded by [Config].QueryTimeout, so it
// works from a defer; transient errors are retried within that bound, then
// in the background until the lease would have expired or Close.
//
// It returns an error matching [pgfence.ErrNotHeld] when the lease had been
// lost, one matching [pgfence.ErrUnavailable] when the retries ran out, one
// matching [pgfence.ErrMaxHold] once after a release at MaxHold, and other
// errors wrapped (a later call tries again). After a call returned nil or
// ErrNotHeld, later calls return nil, and so does a call on a nil *Lease.
func (l *Lease) Release(ctx context.Context) error {
	if l == nil {
		return nil
	}
	if err := l.release(ctx, errReleased); err != nil {
		return err
	}
	if l.endedAtMax.CompareAndSwap(true, false) {
		return l.Err()
	}
	return nil
}

// maxHoldReached releases l at its MaxHold, as a loss with a cause matching
// [pgfence.ErrMaxHold].
func (k *Locker) maxHoldReached(l *Lease) {
	cause := fmt.Errorf("pgfence: leasetable: lease %q (token %d) held for its MaxHold of %v: %w",
		l.name, l.token, l.timing.maxHold, pgfence.ErrMaxHold)
	k.mu.Lock()
	held := l.state == stateHeld
	k.mu.Unlock()
	if !held {
		return
	}
	l.endedAtMax.Store(true)
	if err := l.release(l.values, cause); err != nil {
		k.cfg.Logger.WarnContext(l.values, "pgfence: leasetable: release at MaxHold failed; the lease expires after its TTL", append(logAttrs(l), "error", err)...)
	}
}

// release ends l with cause, releases its row, and reports it as the
// Released event, or for Close and MaxHold as the Lost event.
func (l *Lease) release(ctx context.Context, cause error) error {
	l.releaseMu.Lock()
	defer l.releaseMu.Unlock()
	k := l.k
	k.mu.Lock()
	if l.dbReleased {
		k.mu.Unlock()
		return nil
	}
	endsNow := l.state == stateHeld && l.adopted
	if l.state == stateHeld {
		k.endLocked(l, stateReleased, cause)
		l.wasHeld = true
	}
	inflight, retrying := l.inflight, l.retrying
	k.mu.Unlock()

	op := pgfence.Op{Kind: pgfence.OpRelease, Strategy: pgfence.StrategyLeaseTable, Name: l.name, Batch: 1}
	ctx = k.ev.StartOp(ctx, op)
	err := l.releaseInDB(ctx, inflight, retrying)
	switch {
	case !endsNow:
	case cause == errReleased:
		k.nReleased.Add(1)
		if k.ev.Enabled() {
			k.ev.Sync(ctx, pgfence.Released{Lock: l.lock(), HeldFor: time.Since(l.grantedAt), Err: err})
		}
	default: // Close, MaxHold
		k.nLost.Add(1)
		if k.ev.Enabled() {
			k.ev.Async(l.values, pgfence.Lost{Lock: l.lock(), HeldFor: time.Since(l.grantedAt), Cause: cause})
		}
	}
	k.ev.EndOp(ctx, op, err)
	return err
}

// releaseInDB releases l's row once a background retry (retrying) and a
// renewal (inflight) in flight have ended, retrying transient errors, and
// hands the release to a background retry when they outlast its bound.
func (l *Lease) releaseInDB(ctx context.Context, inflight, retrying chan struct{}) error {
	k := l.k
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), k.cfg.QueryTimeout)
	defer cancel()
	if retrying != nil {
		select {
		case <-retrying:
		case <-ctx.Done():
			return fmt.Errorf("pgfence: leasetable: release %q (token %d): still retrying in the background: %w",
				l.name, l.token, pgfence.ErrUnavailable)
		}
		k.mu.Lock()
		done, err := l.dbReleased, l.retryErr
		l.retrying = nil
		k.mu.Unlock()
		if done {
			return nil
		}
		if err != nil && !k.retryable(err) {
			return fmt.Errorf("pgfence: leasetable: release %q (token %d): %w", l.name, l.token, err)
		}
		// It gave up: one more try.
	}
	if inflight != nil {
		// A renewal must not extend the row after the release.
		select {
		case <-inflight:
		case <-ctx.Done():
			return fmt.Errorf("pgfence: leasetable: release %q: waiting for a renewal: %w", l.name, ctx.Err())
		}
	}
	held, err := k.releaseRetrying(ctx, l)
	if err != nil {
		if k.retryable(err) || (ctx.Err() != nil && (k.hooks == nil || !k.hooks.noRetry)) {
			if err == ctx.Err() {
				err = fmt.Errorf("no answer within QueryTimeout %v: %w", k.cfg.QueryTimeout, err)
			}
			later := "; retrying in the background until it expires"
			if !k.retryReleaseLater(ctx, l) {
				later = "; the lease expires after its TTL"
			}
			return fmt.Errorf("pgfence: leasetable: release %q (token %d): %w%s",
				l.name, l.token, retry.Unavailable("", err), later)
		}
		return fmt.Errorf("pgfence: leasetable: release %q (token %d): %w", l.name, l.token, err)
	}
	k.released(l)
	if !held || !l.wasHeld {
		return fmt.Errorf("pgfence: leasetable: release %q (token %d): %w", l.name, l.token, pgfence.ErrNotHeld)
	}
	k.cfg.Logger.DebugContext(ctx, "pgfence: leasetable: released", logAttrs(l)...)
	return nil
}

// releaseRetrying releases l's row, retrying transient errors with backoff
// while ctx lasts. It reports whether the row was still held by l.
func (k *Locker) releaseRetrying(ctx context.Context, l *Lease) (bool, error) {
	for failures := 1; ; failures++ {
		held, err := k.releaseRow(ctx, l.name, l.token, l.secret, l.timing.atLeast)
		if err == nil || ctx.Err() != nil || !k.retryable(err) {
			return held, err
		}
		k.suspectListen()
		wait := k.backoff.Wait(failures)
		k.cfg.Logger.DebugContext(ctx, "pgfence: leasetable: release failed; retrying", append(logAttrs(l), "error", err, "retry_in", wait)...)
		if sleep(ctx, wait) != nil {
			return false, err
		}
	}
}

// retryReleaseLater retries l's release in the background, with ctx's
// values, until it succeeds, the lease would have expired in the database,
// or Close. After Close it does nothing and reports false.
func (k *Locker) retryReleaseLater(ctx context.Context, l *Lease) bool {
	k.mu.Lock()
	if k.closed {
		k.mu.Unlock()
		return false
	}
	until := l.deadline.Add(l.timing.margin)
	done := make(chan struct{})
	l.retrying = done
	k.background.Add(1)
	k.mu.Unlock()
	values := context.WithoutCancel(ctx)
	go func() {
		defer k.background.Done()
		rctx, stop := events.Values(values, k.closeCtx)
		defer stop()
		rctx, cancel := context.WithDeadline(rctx, until)
		defer cancel()
		var err error
		defer func() {
			k.mu.Lock()
			l.retryErr = err
			k.mu.Unlock()
			close(done)
		}()
		for failures := 1; ; failures++ {
			if sleep(rctx, k.backoff.Wait(failures)) != nil {
				level := slog.LevelWarn
				if k.closeCtx.Err() != nil {
					level = slog.LevelDebug // Close stopped it
				}
				k.cfg.Logger.Log(values, level, "pgfence: leasetable: gave up retrying a release; the lease expires after its TTL",
					append(logAttrs(l), "error", err)...)
				return
			}
			actx, acancel := context.WithTimeout(rctx, k.cfg.QueryTimeout)
			_, err = k.releaseRow(actx, l.name, l.token, l.secret, l.timing.atLeast)
			acancel()
			if err == nil {
				k.released(l)
				k.cfg.Logger.InfoContext(values, "pgfence: leasetable: released after retrying", append(logAttrs(l), "attempts", failures+1)...)
				return
			}
			if !k.retryable(err) && rctx.Err() == nil && !errors.Is(err, context.DeadlineExceeded) {
				k.cfg.Logger.WarnContext(values, "pgfence: leasetable: retrying a release failed; the lease expires after its TTL",
					append(logAttrs(l), "error", err)...)
				return
			}
		}
	}()
	return true
}

// released records that l's row was released (or found not held) and wakes
// the name's waiters.
func (k *Locker) released(l *Lease) {
	k.mu.Lock()
	defer k.mu.Unlock()
	l.dbReleased = true
	for w := range k.waiters[l.name] {
		w.wake()
	}
	k.wakePermitWaitersLocked(l.name)
}

// releaseReq is one caller's request to release a lease.
type releaseReq struct {
	ctx       context.Context
	name      string
	token     int64
	secret    string
	atLeastUs int64
	res       chan releaseReply // buffered(1)
}

// releaseReply is the outcome of one release request: held reports that the
// row was still this lease's.
type releaseReply struct {
	held bool
	err  error
}

// releaseRow releases one row through the Locker's batcher, and reports
// whether the lease still held it.
func (k *Locker) releaseRow(ctx context.Context, name string, token int64, secret string, atLeast time.Duration) (bool, error) {
	r := &releaseReq{ctx: ctx, name: name, token: token, secret: secret, atLeastUs: atLeast.Microseconds(), res: make(chan releaseReply, 1)}
	if k.releases.runNow(r) {
		rep := <-r.res
		if rep.err != nil && ctx.Err() != nil {
			// Cancelled with ctx: ctx's error, as for a queued request.
			return false, ctx.Err()
		}
		return rep.held, rep.err
	}
	k.releases.submit(r)
	select {
	case rep := <-r.res:
		return rep.held, rep.err
	case <-ctx.Done():
		return false, ctx.Err()
	}
}

// execReleases runs releaseSQL for batch and answers each request; on a
// statement error it answers none and returns the error.
func (k *Locker) execReleases(batch []*releaseReq) (err error) {
	defer func() { err = install.WrapPermission(err, "", k.cfg.Schema) }() // names the missing grant
	ctxs := make([]context.Context, 0, len(batch))
	for _, r := range batch {
		ctxs = append(ctxs, r.ctx) // the opener's first
	}
	values := ctxs[0]
	if k.ev.Enabled() && len(batch) > 1 {
		op := pgfence.Op{Kind: pgfence.OpRelease, Strategy: pgfence.StrategyLeaseTable, Batch: len(batch), Links: ctxs[1:]}
		values = k.ev.StartOp(values, op)
		defer func() { k.ev.EndOp(values, op, err) }()
	}
	slices.SortFunc(batch, func(a, b *releaseReq) int { return strings.Compare(a.name, b.name) })
	names := make([]string, 0, len(batch))
	tokens := make([]int64, 0, len(batch))
	secrets := make([]string, 0, len(batch))
	atLeast := make([]int64, 0, len(batch))
	for _, r := range batch {
		names = append(names, r.name)
		tokens = append(tokens, r.token)
		secrets = append(secrets, r.secret)
		atLeast = append(atLeast, r.atLeastUs)
	}
	// The callers' contexts are detached and bounded by QueryTimeout.
	ctx, cancel := batchContext(context.Background(), values, ctxs)
	defer cancel()
	conn, err := k.conn(ctx, "release", k.cfg.QueryTimeout, true)
	if err != nil {
		return err
	}
	defer conn.Release()
	rows, err := conn.Query(ctx, k.sql.release, names, tokens, secrets, atLeast)
	if err != nil {
		k.discardStale(conn, err)
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

// failRelease answers one release request with err.
func failRelease(r *releaseReq, err error) { r.res <- releaseReply{err: err} }

// giveBackReq is a lease taken for a caller that stopped waiting.
type giveBackReq struct {
	ctx    context.Context // the caller's: lends its values
	name   string
	token  int64
	secret string
}

// giveBack releases, each bounded by QueryTimeout, the leases taken for
// callers that stopped waiting; they go out in one release batch.
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
