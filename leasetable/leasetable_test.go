package leasetable_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence"
	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/leasetable"
)

func countRows(t *testing.T, db *pgtest.DB) int {
	t.Helper()
	var n int
	require.NoError(t, db.Pool.QueryRow(context.Background(), "SELECT count(*) FROM pgfence.pgfence_leases").Scan(&n))
	return n
}

func TestNewBadInput(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDB(t)

	_, err := leasetable.New(t.Context(), nil, nil)
	require.ErrorContains(t, err, "pool is nil")

	for _, tc := range []struct {
		name string
		cfg  leasetable.Config
		want string
	}{
		{"negative TTL", leasetable.Config{TTL: -time.Second}, "Config.TTL"},
		{"TTL below minimum", leasetable.Config{TTL: time.Millisecond}, "must be between 100ms and 168h0m0s"},
		{"TTL above maximum", leasetable.Config{TTL: leasetable.MaxTTL + 1}, "must be between 100ms and 168h0m0s"},
		{"negative renew interval", leasetable.Config{RenewInterval: -1}, "RenewInterval"},
		{"negative margin", leasetable.Config{SafetyMargin: -1}, "SafetyMargin"},
		{"TTL too short for cadence", leasetable.Config{TTL: time.Second, RenewInterval: 500 * time.Millisecond}, "too short"},
		{"margin eats TTL", leasetable.Config{TTL: time.Second, SafetyMargin: 900 * time.Millisecond}, "too short"},
		{"negative query timeout", leasetable.Config{QueryTimeout: -1}, "Config.QueryTimeout"},
		{"tiny listen check interval", leasetable.Config{ListenCheckInterval: time.Millisecond}, "ListenCheckInterval"},
		{"oversized owner", leasetable.Config{Owner: strings.Repeat("o", 513)}, "Config.Owner"},
		{"owner with NUL", leasetable.Config{Owner: "a\x00b"}, "NUL"},
		{"owner not UTF-8", leasetable.Config{Owner: "\xff"}, "UTF-8"},
		{"oversized schema", leasetable.Config{Schema: strings.Repeat("s", 64)}, "Config.Schema"},
		{"schema with NUL", leasetable.Config{Schema: "a\x00b"}, "Config.Schema"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := tc.cfg
			_, err := leasetable.New(t.Context(), db.Pool, &cfg)
			require.ErrorContains(t, err, tc.want)
		})
	}

	k := newLocker(t, db.Pool, nil)
	ctx := context.Background()
	for _, tc := range []struct {
		name, lease string
		opts        *leasetable.AcquireOpts
		want        string
	}{
		{"empty name", "", nil, "empty"},
		{"oversized name", strings.Repeat("n", 513), nil, "513 bytes"},
		{"name not UTF-8", "\xfe", nil, "UTF-8"},
		{"name with NUL", "x\x00", nil, "NUL"},
		{"negative TTL", "ok", &leasetable.AcquireOpts{TTL: -time.Second}, "AcquireOpts.TTL"},
		{"tiny TTL", "ok", &leasetable.AcquireOpts{TTL: time.Millisecond}, "AcquireOpts.TTL"},
		{"negative wait", "ok", &leasetable.AcquireOpts{WaitTimeout: -1}, "WaitTimeout"},
		{"negative at-least", "ok", &leasetable.AcquireOpts{AtLeast: -1}, "AtLeast"},
		{"shared", "ok", &leasetable.AcquireOpts{Shared: true}, "AcquireOpts.Shared"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := k.TryAcquire(ctx, tc.lease, tc.opts)
			require.ErrorContains(t, err, tc.want)
			_, err = k.Acquire(ctx, tc.lease, tc.opts)
			require.ErrorContains(t, err, tc.want)
			err = k.Do(ctx, tc.lease, tc.opts, func(context.Context, pgfence.Lease) error {
				t.Error("fn called despite bad input")
				return nil
			})
			require.ErrorContains(t, err, tc.want)
		})
	}
	_, _, err = k.Get(ctx, "")
	require.ErrorContains(t, err, "empty")
	require.Zero(t, countRows(t, db), "bad input must write nothing")

	// A name of exactly the maximum length is fine.
	l, err := k.TryAcquire(ctx, strings.Repeat("n", leasetable.MaxNameLength), nil)
	require.NoError(t, err)
	require.NoError(t, l.Release(ctx))
}

func TestTryAcquireAndRelease(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.NewDB(t)
	a := newLocker(t, db.Pool, &leasetable.Config{Owner: "a"})
	b := newLocker(t, db.NewPool(t, nil), &leasetable.Config{Owner: "b"})

	la, err := a.TryAcquire(ctx, "job", nil)
	require.NoError(t, err)
	require.Equal(t, "job", la.Name())
	require.NoError(t, la.Err())
	require.Positive(t, la.Token())

	_, err = b.TryAcquire(ctx, "job", nil)
	require.ErrorIs(t, err, pgfence.ErrNotAcquired)
	_, err = a.TryAcquire(ctx, "job", nil)
	require.ErrorIs(t, err, pgfence.ErrNotAcquired, "a Locker does not re-enter its own lease")

	info, ok, err := b.Get(ctx, "job")
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, "a", info.Owner)
	require.Equal(t, la.Token(), info.Token)
	require.True(t, info.ExpiresAt.After(info.AcquiredAt))
	require.Equal(t, la.(*leasetable.Lease).AcquiredAt(), info.AcquiredAt)

	list, err := b.List(ctx)
	require.NoError(t, err)
	require.Equal(t, []leasetable.LeaseInfo{info}, list)

	require.NoError(t, la.Release(ctx))
	require.NoError(t, la.Release(ctx), "a second Release returns nil")
	<-la.Done()
	require.ErrorIs(t, la.Err(), pgfence.ErrNotHeld)
	require.NotErrorIs(t, la.Err(), pgfence.ErrLeaseLost)
	require.ErrorIs(t, context.Cause(la.Context()), pgfence.ErrNotHeld)

	_, ok, err = b.Get(ctx, "job")
	require.NoError(t, err)
	require.False(t, ok)
	list, err = b.List(ctx)
	require.NoError(t, err)
	require.Empty(t, list)
	require.Equal(t, 1, countRows(t, db), "release expires the row in place")

	lb, err := b.TryAcquire(ctx, "job", nil)
	require.NoError(t, err)
	require.Greater(t, lb.Token(), la.Token())
	require.NoError(t, lb.Release(ctx))
}

// TestHeldPredicate checks the exact predicate that package fence relies
// on: name, token, and expires_at > now() on the database clock.
func TestHeldPredicate(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.NewDB(t)
	k := newLocker(t, db.Pool, &leasetable.Config{TTL: 3 * time.Second, RenewInterval: 100 * time.Millisecond})
	held := func(name string, token int64) bool {
		t.Helper()
		var ok bool
		require.NoError(t, db.Pool.QueryRow(ctx, `SELECT EXISTS (SELECT FROM pgfence.pgfence_leases
			WHERE name = $1 AND fence = $2 AND expires_at > now())`, name, token).Scan(&ok))
		return ok
	}

	l, err := k.TryAcquire(ctx, "p", nil)
	require.NoError(t, err)
	require.True(t, held("p", l.Token()))
	require.False(t, held("p", l.Token()-1), "negative control: another token is not held")
	require.NoError(t, l.Release(ctx))
	require.False(t, held("p", l.Token()), "released")

	l, err = k.TryAcquire(ctx, "p", nil)
	require.NoError(t, err)
	_, err = db.Pool.Exec(ctx, "UPDATE pgfence.pgfence_leases SET expires_at = now() WHERE name = 'p'")
	require.NoError(t, err)
	require.False(t, held("p", l.Token()), "expired")
	waitFor(t, l.Done(), "the loss to be noticed")
}

func TestReleaseIsOwnerChecked(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.NewDB(t)
	k := newLocker(t, db.Pool, nil)

	l, err := k.TryAcquire(ctx, "stolen", nil)
	require.NoError(t, err)
	// Someone else takes the row over behind the Locker's back.
	var thiefToken int64
	var thiefExpiry time.Time
	require.NoError(t, db.Pool.QueryRow(ctx, `UPDATE pgfence.pgfence_leases SET owner = 'thief', fence = pgfence.pgfence_next_token(),
		expires_at = now() + interval '1 hour' WHERE name = 'stolen' RETURNING fence, expires_at`).Scan(&thiefToken, &thiefExpiry))

	require.ErrorIs(t, l.Release(ctx), pgfence.ErrNotHeld)
	require.NoError(t, l.Release(ctx), "a second Release returns nil")
	info, ok, err := k.Get(ctx, "stolen")
	require.NoError(t, err)
	require.True(t, ok, "the thief's lease is untouched")
	require.Equal(t, "thief", info.Owner)
	require.Equal(t, thiefToken, info.Token)
	require.True(t, thiefExpiry.Equal(info.ExpiresAt))

	// Same owner id, other token: still not released.
	k2 := newLocker(t, db.Pool, &leasetable.Config{Owner: k.Owner()})
	l2, err := k2.TryAcquire(ctx, "other", nil)
	require.NoError(t, err)
	_, err = db.Pool.Exec(ctx, `UPDATE pgfence.pgfence_leases SET fence = pgfence.pgfence_next_token() WHERE name = 'other'`)
	require.NoError(t, err)
	require.ErrorIs(t, l2.Release(ctx), pgfence.ErrNotHeld)
	_, ok, err = k.Get(ctx, "other")
	require.NoError(t, err)
	require.True(t, ok)
}

func TestTokensIncreasePerName(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.NewDB(t)
	a := newLocker(t, db.Pool, &leasetable.Config{Owner: "a"})
	b := newLocker(t, db.NewPool(t, nil), &leasetable.Config{Owner: "b"})
	var tokens []int64

	// Release, then re-acquire by the other Locker.
	l, err := a.TryAcquire(ctx, "n", nil)
	require.NoError(t, err)
	tokens = append(tokens, l.Token())
	require.NoError(t, l.Release(ctx))
	l, err = b.TryAcquire(ctx, "n", nil)
	require.NoError(t, err)
	tokens = append(tokens, l.Token())

	// Expiry, then takeover: the holder's watchdog learns it lost.
	_, err = db.Pool.Exec(ctx, "UPDATE pgfence.pgfence_leases SET expires_at = now() WHERE name = 'n'")
	require.NoError(t, err)
	taken, err := a.TryAcquire(ctx, "n", nil)
	require.NoError(t, err)
	tokens = append(tokens, taken.Token())
	require.ErrorIs(t, l.Release(ctx), pgfence.ErrNotHeld)

	// Same owner again after release, and tokens drawn for other names in
	// between do not matter.
	require.NoError(t, taken.Release(ctx))
	other, err := b.TryAcquire(ctx, "other", nil)
	require.NoError(t, err)
	require.NoError(t, other.Release(ctx))
	l, err = a.TryAcquire(ctx, "n", nil)
	require.NoError(t, err)
	tokens = append(tokens, l.Token())
	require.NoError(t, l.Release(ctx))

	// The row is re-created after an operator deleted it.
	_, err = db.Pool.Exec(ctx, "DELETE FROM pgfence.pgfence_leases WHERE name = 'n'")
	require.NoError(t, err)
	l, err = b.TryAcquire(ctx, "n", nil)
	require.NoError(t, err)
	tokens = append(tokens, l.Token())
	require.NoError(t, l.Release(ctx))

	for i := 1; i < len(tokens); i++ {
		require.Greater(t, tokens[i], tokens[i-1], "tokens %v", tokens)
	}
}

func TestMutualExclusionUnderContention(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	db := pgtest.NewDB(t)
	const lockers, workers, rounds = 3, 4, 8
	var holders, maxHolders, acquisitions atomic.Int64
	var lastToken atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, lockers*workers)
	for i := range lockers {
		k := newLocker(t, db.NewPool(t, nil), &leasetable.Config{TTL: 5 * time.Second, Owner: fmt.Sprintf("locker-%d", i)})
		for range workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range rounds {
					err := k.Do(ctx, "contended", nil, func(ctx context.Context, l pgfence.Lease) error {
						n := holders.Add(1)
						defer holders.Add(-1)
						for {
							m := maxHolders.Load()
							if n <= m || maxHolders.CompareAndSwap(m, n) {
								break
							}
						}
						if prev := lastToken.Swap(l.Token()); prev >= l.Token() {
							return fmt.Errorf("token %d after %d", l.Token(), prev)
						}
						acquisitions.Add(1)
						// Do some work against the database while holding it.
						info, ok, err := k.Get(ctx, "contended")
						if err != nil {
							return err
						}
						if !ok || info.Token != l.Token() {
							return fmt.Errorf("holder %d sees %+v (held=%v)", l.Token(), info, ok)
						}
						return nil
					})
					if err != nil {
						errs <- err
						return
					}
				}
			}()
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	require.Equal(t, int64(1), maxHolders.Load())
	require.Equal(t, int64(lockers*workers*rounds), acquisitions.Load())
}

func TestRenewalKeepsLeaseAcrossSeveralTTLs(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.NewDB(t)
	const ttl = 600 * time.Millisecond
	k := newLocker(t, db.Pool, &leasetable.Config{TTL: ttl})
	other := newLocker(t, db.NewPool(t, nil), nil)

	l, err := k.TryAcquire(ctx, "renewed", nil)
	require.NoError(t, err)
	first, _, err := k.Get(ctx, "renewed")
	require.NoError(t, err)
	// Wait until the database has seen it renewed past several TTLs.
	for {
		info, ok, err := other.Get(ctx, "renewed")
		require.NoError(t, err)
		require.True(t, ok, "the lease must stay held")
		require.Equal(t, l.Token(), info.Token)
		if info.ExpiresAt.Sub(first.AcquiredAt) > 4*ttl {
			break
		}
		select {
		case <-l.Done():
			t.Fatalf("lease lost: %v", l.Err())
		case <-time.After(ttl / 4):
		}
	}
	require.NoError(t, l.Err())
	_, err = other.TryAcquire(ctx, "renewed", nil)
	require.ErrorIs(t, err, pgfence.ErrNotAcquired)
	require.NoError(t, l.Release(ctx))
}

func TestLossWhenRowIsTakenOver(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.NewDB(t)
	// Frequent renewals notice the takeover long before the local deadline.
	k := newLocker(t, db.Pool, &leasetable.Config{TTL: 3 * time.Second, RenewInterval: 100 * time.Millisecond})

	for _, steal := range []string{
		"UPDATE pgfence.pgfence_leases SET owner = 'thief', fence = pgfence.pgfence_next_token() WHERE name = $1",
		"UPDATE pgfence.pgfence_leases SET expires_at = now() WHERE name = $1",
		"DELETE FROM pgfence.pgfence_leases WHERE name = $1",
	} {
		l, err := k.TryAcquire(ctx, "victim", nil)
		require.NoError(t, err)
		_, err = db.Pool.Exec(ctx, steal, "victim")
		require.NoError(t, err)
		waitFor(t, l.Done(), "the loss to be noticed")
		require.ErrorIs(t, l.Err(), pgfence.ErrLeaseLost)
		require.ErrorContains(t, l.Err(), "no longer held in the database")
		require.ErrorIs(t, context.Cause(l.Context()), pgfence.ErrLeaseLost)
		require.ErrorIs(t, l.Release(ctx), pgfence.ErrNotHeld)
		_, err = db.Pool.Exec(ctx, "DELETE FROM pgfence.pgfence_leases")
		require.NoError(t, err)
	}
}

func TestLossWhenRenewalsAreBlocked(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.NewDB(t)
	logs := newLogWatch()
	k := newLocker(t, db.Pool, &leasetable.Config{
		TTL: 2 * time.Second, RenewInterval: 300 * time.Millisecond, SafetyMargin: 800 * time.Millisecond,
		Logger: logs.logger(),
	})

	l, err := k.TryAcquire(ctx, "blocked", nil)
	require.NoError(t, err)
	// Negative control: renewals go through while nothing blocks them.
	waitFor(t, logs.next("lease renewed"), "a renewal")
	waitFor(t, logs.next("lease renewed"), "a second renewal")
	require.NoError(t, l.Err())

	// Block renewals: hold the row lock in another transaction.
	failing := logs.next("renewal failed")
	tx, err := db.NewPool(t, nil).Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = tx.Exec(ctx, "SELECT 1 FROM pgfence.pgfence_leases WHERE name = 'blocked' FOR UPDATE")
	require.NoError(t, err)

	waitFor(t, l.Done(), "the lease to be given up")
	waitFor(t, failing, "the blocked renewal to be reported")
	require.ErrorIs(t, l.Err(), pgfence.ErrLeaseLost)
	require.ErrorContains(t, l.Err(), "local deadline")
	// The holder gave up while the database still considers it held: nobody
	// else could have been granted the lease yet.
	var stillHeld bool
	require.NoError(t, tx.QueryRow(ctx,
		"SELECT expires_at > clock_timestamp() FROM pgfence.pgfence_leases WHERE name = 'blocked'").Scan(&stillHeld))
	require.True(t, stillHeld, "the local deadline must come before the database's expiry")
	require.NoError(t, tx.Rollback(ctx))
	require.ErrorIs(t, l.Release(ctx), pgfence.ErrNotHeld)
}

func TestHandOverThroughNotify(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.NewDB(t)
	cfg := &leasetable.Config{TTL: 30 * time.Second}
	holder := newLocker(t, db.Pool, cfg)
	logs := newLogWatch()
	waiterCfg := *cfg
	waiterCfg.Logger = logs.logger()
	waiter := newLocker(t, db.NewPool(t, nil), &waiterCfg)

	l, err := holder.TryAcquire(ctx, "handover", nil)
	require.NoError(t, err)

	listening := logs.next("LISTEN connection ready")
	waiting := logs.next("waiting for lease")
	type result struct {
		l   pgfence.Lease
		err error
	}
	got := make(chan result, 1)
	go func() {
		// Far shorter than the TTL: only a notification can wake it in time.
		wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		l, err := waiter.Acquire(wctx, "handover", nil)
		got <- result{l, err}
	}()
	waitFor(t, listening, "the listener")
	waitFor(t, waiting, "the waiter to wait")
	require.NoError(t, l.Release(ctx))
	r := <-got
	require.NoError(t, r.err)
	require.Greater(t, r.l.Token(), l.Token())
	require.NoError(t, r.l.Release(ctx))
}

func TestListenerReconnectsAndWaitersFallBack(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.NewDB(t)
	logs := newLogWatch()
	waiter := newLocker(t, db.NewPool(t, nil), &leasetable.Config{TTL: 30 * time.Second, Logger: logs.logger()})
	holder := newLocker(t, db.Pool, &leasetable.Config{TTL: 30 * time.Second})

	// Start the listener with a first wait, then kill its connection.
	listening := logs.next("LISTEN connection ready")
	_, err := waiter.Acquire(ctx, "warmup", nil)
	require.NoError(t, err)
	waitFor(t, listening, "the listener")
	failed := logs.next("LISTEN connection failed")
	back := logs.next("LISTEN connection ready")
	var killed int
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
		WHERE datname = current_database() AND (query LIKE 'LISTEN%' OR query LIKE 'UNLISTEN%')`).Scan(&killed))
	require.Equal(t, 1, killed)
	waitFor(t, failed, "the listener to notice")
	waitFor(t, back, "the listener to reconnect")

	// Hand-over works through the new connection.
	l, err := holder.TryAcquire(ctx, "after-reconnect", nil)
	require.NoError(t, err)
	waiting := logs.next("waiting for lease")
	got := acquireAsync(waiter, "after-reconnect", 10*time.Second)
	waitFor(t, waiting, "the waiter to wait")
	require.NoError(t, l.Release(ctx))
	r := <-got
	require.NoError(t, r.err)
	require.NoError(t, r.l.Release(ctx))
}

// The health check of an idle LISTEN connection lets WaitForNotification
// time out and then makes a round trip; a healthy connection survives both
// and keeps delivering notifications.
func TestListenHealthCheckKeepsAHealthyConnection(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.NewDB(t)
	logs := newLogWatch()
	// The check must be answered within the interval: a second, not the
	// minimum, leaves a margin on a loaded machine and still checks thrice.
	waiter := newLocker(t, db.NewPool(t, nil), &leasetable.Config{
		TTL: 30 * time.Second, Logger: logs.logger(), ListenCheckInterval: time.Second,
	})
	holder := newLocker(t, db.Pool, &leasetable.Config{TTL: 30 * time.Second})
	logs.count("LISTEN connection failed")

	listening := logs.next("LISTEN connection ready")
	warmup, err := waiter.Acquire(ctx, "warmup", nil)
	require.NoError(t, err)
	require.NoError(t, warmup.Release(ctx))
	waitFor(t, listening, "the listener")

	// Each check is a statement on the LISTEN session: watch its start time
	// advance on the server, on the same backend.
	const listenerSQL = `SELECT pid, query_start FROM pg_stat_activity
		WHERE datname = current_database() AND (query LIKE 'LISTEN%' OR query LIKE 'UNLISTEN%')`
	var pid int32
	var last time.Time
	require.NoError(t, db.Pool.QueryRow(ctx, listenerSQL).Scan(&pid, &last))
	for range 3 {
		var p int32
		require.Eventually(t, func() bool {
			var start time.Time
			if db.Pool.QueryRow(ctx, listenerSQL).Scan(&p, &start) != nil || !start.After(last) {
				return false
			}
			last = start
			return true
		}, 30*time.Second, 20*time.Millisecond, "a health check")
		require.Equal(t, pid, p, "the LISTEN connection is not replaced; warnings:\n%s", logs.warnings())
	}
	require.Zero(t, logs.count("LISTEN connection failed"))

	// Notifications still arrive: a hand-over far below the TTL.
	l, err := holder.TryAcquire(ctx, "after-checks", nil)
	require.NoError(t, err)
	waiting := logs.next("waiting for lease")
	got := acquireAsync(waiter, "after-checks", 10*time.Second)
	waitFor(t, waiting, "the waiter to wait")
	require.NoError(t, l.Release(ctx))
	r := <-got
	require.NoError(t, r.err)
	require.NoError(t, r.l.Release(ctx))
	require.Zero(t, logs.count("LISTEN connection failed"))
}

// A pool whose connection configuration carries its own OnNotification
// callback: pgx then buffers no notifications on connections made from it,
// and the LISTEN connection, made from the same configuration, must still
// deliver releases to waiters.
func TestHandOverWithPoolOnNotification(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.NewDB(t)
	logs := newLogWatch()
	var userCallbacks atomic.Int64
	waiterPool := db.NewPool(t, func(c *pgxpool.Config) {
		c.ConnConfig.OnNotification = func(*pgconn.PgConn, *pgconn.Notification) { userCallbacks.Add(1) }
	})
	waiter := newLocker(t, waiterPool, &leasetable.Config{TTL: time.Minute, Logger: logs.logger()})
	holder := newLocker(t, db.Pool, &leasetable.Config{TTL: time.Minute})

	l, err := holder.TryAcquire(ctx, "handover", nil)
	require.NoError(t, err)
	listening := logs.next("LISTEN connection ready")
	waiting := logs.next("waiting for lease")
	// Far shorter than the holder's TTL: only a notification wakes it in time.
	got := acquireAsync(waiter, "handover", 10*time.Second)
	waitFor(t, listening, "the listener")
	waitFor(t, waiting, "the waiter to wait")
	require.NoError(t, l.Release(ctx))
	r := <-got
	require.NoError(t, r.err)
	require.NoError(t, r.l.Release(ctx))
	require.Zero(t, userCallbacks.Load(), "the LISTEN connection is pgfence's own: the pool's callback sees none of its notifications")
}

func TestWaitingWithoutListenRetriesAtExpiry(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.NewDB(t)
	logs := newLogWatch()
	waiter := newLocker(t, db.NewPool(t, nil), &leasetable.Config{DisableListen: true, Logger: logs.logger()})
	holder := newLocker(t, db.Pool, nil)

	// The holder disappears without releasing: its row stays until expiry,
	// two seconds from now, so that the waiter's first attempt finds it
	// held however slow the server.
	l, err := holder.TryAcquire(ctx, "expiring", nil)
	require.NoError(t, err)
	_, err = db.Pool.Exec(ctx, `UPDATE pgfence.pgfence_leases SET owner = 'gone', fence = pgfence.pgfence_next_token(),
		expires_at = pg_catalog.now() + interval '2 seconds' WHERE name = 'expiring'`)
	require.NoError(t, err)

	waiting := logs.next("waiting for lease")
	got := acquireAsync(waiter, "expiring", 20*time.Second)
	waitFor(t, waiting, "the waiter to wait")
	waitFor(t, l.Done(), "the holder to notice")
	r := <-got
	require.NoError(t, r.err)
	require.Greater(t, r.l.Token(), l.Token())
	require.NoError(t, r.l.Release(ctx))
}

func TestAcquireWaitTimeoutAndContext(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.NewDB(t)
	a := newLocker(t, db.Pool, nil)
	b := newLocker(t, db.NewPool(t, nil), nil)
	l, err := a.TryAcquire(ctx, "busy", nil)
	require.NoError(t, err)

	_, err = b.Acquire(ctx, "busy", &leasetable.AcquireOpts{WaitTimeout: 200 * time.Millisecond})
	require.ErrorIs(t, err, pgfence.ErrNotAcquired)
	require.ErrorIs(t, err, context.DeadlineExceeded)

	cctx, cancel := context.WithCancelCause(ctx)
	cause := fmt.Errorf("shutting down")
	cancel(cause)
	_, err = b.Acquire(cctx, "busy", nil)
	require.ErrorIs(t, err, cause)

	err = b.Do(ctx, "busy", &leasetable.AcquireOpts{WaitTimeout: 100 * time.Millisecond}, func(context.Context, pgfence.Lease) error {
		t.Error("fn called without the lease")
		return nil
	})
	require.ErrorIs(t, err, pgfence.ErrNotAcquired)
	require.NoError(t, l.Release(ctx))
}

func TestAtLeastKeepsLeaseAfterRelease(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.NewDB(t)
	a := newLocker(t, db.Pool, nil)
	b := newLocker(t, db.NewPool(t, nil), nil)

	l, err := a.TryAcquire(ctx, "nightly", &leasetable.AcquireOpts{AtLeast: time.Hour})
	require.NoError(t, err)
	require.NoError(t, l.Release(ctx))
	<-l.Done()
	_, err = b.TryAcquire(ctx, "nightly", nil)
	require.ErrorIs(t, err, pgfence.ErrNotAcquired, "held for AtLeast after release")
	info, ok, err := b.Get(ctx, "nightly")
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, time.Hour, info.ExpiresAt.Sub(info.AcquiredAt))

	// Released after AtLeast has passed: free at once.
	l, err = a.TryAcquire(ctx, "short", &leasetable.AcquireOpts{AtLeast: time.Microsecond})
	require.NoError(t, err)
	require.NoError(t, l.Release(ctx))
	l2, err := b.TryAcquire(ctx, "short", nil)
	require.NoError(t, err)
	require.NoError(t, l2.Release(ctx))
}

func TestDo(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.NewDB(t)
	k := newLocker(t, db.Pool, &leasetable.Config{TTL: 600 * time.Millisecond})

	// fn's error is returned, and the lease is released either way.
	boom := fmt.Errorf("boom")
	var token int64
	err := k.Do(ctx, "job", nil, func(ctx context.Context, l pgfence.Lease) error {
		token = l.Token()
		return boom
	})
	require.ErrorIs(t, err, boom)
	_, ok, err := k.Get(ctx, "job")
	require.NoError(t, err)
	require.False(t, ok)

	// Lost while fn runs: fn's context is cancelled with ErrLeaseLost, and Do
	// reports it even though fn returned nil.
	err = k.Do(ctx, "job", nil, func(ctx context.Context, l pgfence.Lease) error {
		require.Greater(t, l.Token(), token)
		_, err := db.Pool.Exec(ctx, "UPDATE pgfence.pgfence_leases SET fence = pgfence.pgfence_next_token() WHERE name = 'job'")
		require.NoError(t, err)
		waitFor(t, ctx.Done(), "fn's context to end")
		require.ErrorIs(t, context.Cause(ctx), pgfence.ErrLeaseLost)
		return nil
	})
	require.ErrorIs(t, err, pgfence.ErrLeaseLost)

	// The caller's cancellation reaches fn too.
	cctx, cancel := context.WithCancel(ctx)
	err = k.Do(cctx, "job2", nil, func(ctx context.Context, l pgfence.Lease) error {
		cancel()
		<-ctx.Done()
		return ctx.Err()
	})
	require.ErrorIs(t, err, context.Canceled)
	_, ok, err = k.Get(ctx, "job2")
	require.NoError(t, err)
	require.False(t, ok, "released although the caller's context ended")
	require.ErrorContains(t, k.Do(ctx, "x", nil, nil), "fn is nil")
}

func TestCloseReleasesAndStops(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.NewDB(t)
	logs := newLogWatch()
	k, err := leasetable.New(ctx, db.Pool, &leasetable.Config{Logger: logs.logger()})
	require.NoError(t, err)
	other := newLocker(t, db.NewPool(t, nil), nil)

	l, err := k.TryAcquire(ctx, "held", nil)
	require.NoError(t, err)
	ol, err := other.TryAcquire(ctx, "theirs", nil)
	require.NoError(t, err)
	waiting := logs.next("waiting for lease")
	got := make(chan error, 1)
	go func() {
		_, err := k.Acquire(ctx, "theirs", nil)
		got <- err
	}()
	waitFor(t, waiting, "the waiter to wait")

	k.Close()
	k.Close()
	require.ErrorIs(t, <-got, pgfence.ErrClosed)
	<-l.Done()
	require.ErrorIs(t, l.Err(), pgfence.ErrLeaseLost)
	require.ErrorIs(t, l.Err(), pgfence.ErrClosed)
	require.NoError(t, l.Release(ctx), "already released by Close")
	_, ok, err := other.Get(ctx, "held")
	require.NoError(t, err)
	require.False(t, ok, "Close released the lease")

	_, err = k.TryAcquire(ctx, "x", nil)
	require.ErrorIs(t, err, pgfence.ErrClosed)
	_, err = k.Acquire(ctx, "x", nil)
	require.ErrorIs(t, err, pgfence.ErrClosed)
	_, err = k.List(ctx)
	require.ErrorIs(t, err, pgfence.ErrClosed)
	_, _, err = k.Get(ctx, "x")
	require.ErrorIs(t, err, pgfence.ErrClosed)

	// The caller's pool is still open.
	require.NoError(t, db.Pool.Ping(ctx))
	require.NoError(t, ol.Release(ctx))
}

// renewTracer records the batches of the renewal statement (the only
// statement that calls pgfence_renew; acquires and releases are batched
// too, through pgfence_acquire and pgfence_release).
type renewTracer struct{ batches chan int }

func (r *renewTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	if strings.Contains(d.SQL, ".pgfence_renew(") && len(d.Args) == 4 {
		if names, ok := d.Args[0].([]string); ok {
			select {
			case r.batches <- len(names):
			default:
			}
		}
	}
	return ctx
}

func (r *renewTracer) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func TestRenewalIsBatched(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.NewDB(t)
	tracer := &renewTracer{batches: make(chan int, 100)}
	pool := db.NewPool(t, func(c *pgxpool.Config) { c.ConnConfig.Tracer = tracer })
	// Leases acquired within half a renewal interval are renewed together.
	k := newLocker(t, pool, &leasetable.Config{TTL: 6 * time.Second})
	const n = 20
	leases := make([]pgfence.Lease, n)
	for i := range leases {
		var err error
		leases[i], err = k.TryAcquire(ctx, fmt.Sprintf("batch-%02d", i), nil)
		require.NoError(t, err)
	}
	select {
	case size := <-tracer.batches:
		require.Equal(t, n, size, "one statement renews every lease")
	case <-time.After(30 * time.Second):
		t.Fatal("no renewal")
	}
	for _, l := range leases {
		require.NoError(t, l.Release(ctx))
	}
}

func TestFailedTryAcquireDrawsNoToken(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.NewDB(t)
	holder := newLocker(t, db.Pool, nil)
	other := newLocker(t, db.Pool, nil)
	l, err := holder.TryAcquire(ctx, "busy", nil)
	require.NoError(t, err)
	lastToken := func() int64 {
		var v int64
		require.NoError(t, db.Pool.QueryRow(ctx, "SELECT last_value FROM pgfence.pgfence_leases_fence_seq").Scan(&v))
		return v
	}
	before := lastToken()
	for range 3 {
		_, err := other.TryAcquire(ctx, "busy", nil)
		require.ErrorIs(t, err, pgfence.ErrNotAcquired)
	}
	require.Equal(t, before, lastToken(), "a failed attempt on a held lease draws no token")
	require.NoError(t, l.Release(ctx))
	l2, err := other.TryAcquire(ctx, "busy", nil)
	require.NoError(t, err)
	require.Greater(t, l2.Token(), l.Token())
	require.Greater(t, lastToken(), before, "negative control: an acquisition draws one")
	require.NoError(t, l2.Release(ctx))
}
