package advisory

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgconn/ctxwatch"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence"
	"github.com/pgfence/pgfence/internal/pgtest"
)

// syncWaitOutcome is what a parked Acquire ended in its commit's wait for
// a synchronous standby returned.
type syncWaitOutcome struct {
	lease   *Lease
	err     error
	granted *Lease // the grant that reached the hand-out, if any
	k       *Locker
}

// TestSyncWaitCancelledGrant: a parked Acquire whose grant commits while
// no synchronous standby answers waits in the commit; its ctx or Close
// ending then makes the server end the wait with a WARNING and report
// success for a token the standby may not have. That grant is not handed
// out: Acquire returns ctx's error or ErrClosed and the key is free.
// Negative control: with the WARNING's check removed, it reaches the hand-out (under Close, Acquire may
// return it).
func TestSyncWaitCancelledGrant(t *testing.T) {
	t.Parallel()
	// lc_messages C: the WARNING's text is checked below.
	_, srv := pgtest.NewCluster(t, &pgtest.ClusterOptions{Settings: map[string]string{"lc_messages": "C"}})
	db := srv.NewDB(t)
	admin := db.Conn(t)
	for i, tc := range []struct {
		name          string
		byClose, keep bool
		wantErr       error
	}{
		{name: "ctx", wantErr: context.Canceled},
		{name: "ctx/control", keep: true, wantErr: context.Canceled},
		{name: "close", byClose: true, wantErr: pgfence.ErrClosed},
		{name: "close/control", byClose: true, keep: true},
	} {
		key := ID(int64(9100 + i))
		t.Run(tc.name, func(t *testing.T) {
			o := syncWaitScenario(t, db, admin, key, tc.byClose, tc.keep)
			if !tc.keep {
				require.ErrorIs(t, o.err, tc.wantErr)
				require.Nil(t, o.lease)
				require.Nil(t, o.granted, "no grant reached the hand-out")
				st := o.k.Stats()
				require.Zero(t, st.Acquired)
				require.Zero(t, st.Lost)
				requireKeyFree(t, admin, key)
				return
			}
			require.NotNil(t, o.granted, "control: the grant of the cancelled wait reached the hand-out")
			require.NotZero(t, o.granted.Token())
			switch {
			case !tc.byClose:
				// handOut sees ctx ended and releases the grant.
				require.ErrorIs(t, o.err, context.Canceled)
				require.Nil(t, o.lease)
			case o.err == nil:
				t.Logf("control: Acquire handed out token %d, then Close lost it", o.lease.Token())
				require.Equal(t, o.granted, o.lease)
				require.Equal(t, uint64(1), o.k.Stats().Acquired)
				require.Eventually(t, func() bool { return errors.Is(o.lease.Err(), pgfence.ErrLeaseLost) }, 20*time.Second, 5*time.Millisecond)
			default:
				t.Logf("control: Close ended the grant at its hand-out: %v", o.err)
				require.ErrorIs(t, o.err, pgfence.ErrClosed)
			}
			requireKeyFree(t, admin, key)
		})
	}
}

// syncWaitScenario parks an Acquire of key on a new Locker while a plain
// session holds key, names a synchronous standby that does not exist,
// releases key so that the parked statement is granted and waits in its
// commit for the standby, then ends the wait by cancelling Acquire's ctx
// (or by Close). keep hands out a grant its cancel raced.
func syncWaitScenario(t *testing.T, db *pgtest.DB, admin *pgx.Conn, key Key, byClose, keep bool) syncWaitOutcome {
	t.Helper()
	ctx, stop := context.WithTimeout(context.Background(), 2*time.Minute)
	defer stop()
	var warned atomic.Bool
	pool := db.NewPool(t, func(c *pgxpool.Config) {
		c.ConnConfig.OnNotice = func(_ *pgconn.PgConn, n *pgconn.Notice) {
			if n.Severity == "WARNING" && n.Code == "01000" && strings.Contains(n.Message, "canceling wait for synchronous replication") {
				warned.Store(true)
			}
		}
	})
	k, err := New(ctx, pool, &Config{SessionCheckInterval: 200 * time.Millisecond, QueryTimeout: 5 * time.Second})
	require.NoError(t, err)
	t.Cleanup(k.Close)
	hooksOf(k).keepWarned = keep
	var mu sync.Mutex
	o := syncWaitOutcome{k: k}
	hooksOf(k).afterGrant = func(l *Lease) {
		mu.Lock()
		defer mu.Unlock()
		o.granted = l
	}

	holder := db.Conn(t)
	_, err = holder.Exec(ctx, `SELECT pg_advisory_lock($1)`, key.Int64())
	require.NoError(t, err)

	actx, cancel := context.WithCancel(ctx)
	defer cancel()
	type result struct {
		lease *Lease
		err   error
	}
	res := make(chan result, 1)
	go func() {
		l, err := k.AcquireKey(actx, key, nil)
		res <- result{l, err}
	}()
	var pid int32
	require.Eventually(t, func() bool {
		k.mu.Lock()
		defer k.mu.Unlock()
		for _, s := range k.sessions {
			if s.parked && s.pid != 0 {
				pid = s.pid
				return true
			}
		}
		return false
	}, 30*time.Second, time.Millisecond, "Acquire parks")
	waitEvent(t, admin, pid, "advisory")

	// A commit that wrote WAL now waits for a standby that never comes.
	nameMissingStandby(t, ctx, admin)
	defer resetSyncStandby(t, admin)
	// A backend reloads before its next statement: once the parked wait
	// has begun two more statements (each ends at lock_timeout), the
	// one running draws its token under the new setting.
	var prev time.Time
	starts := 0
	require.Eventually(t, func() bool {
		var qs time.Time
		if err := admin.QueryRow(ctx, `SELECT query_start FROM pg_stat_activity WHERE pid = $1`, pid).Scan(&qs); err != nil {
			return false
		}
		if !prev.IsZero() && !qs.Equal(prev) {
			starts++
		}
		prev = qs
		return starts >= 2
	}, 30*time.Second, 2*time.Millisecond, "the parked wait begins two more statements")
	select {
	case r := <-res:
		t.Fatalf("Acquire returned before the release: %v, %v", r.lease, r.err)
	default:
	}

	// The holder's release writes no WAL, so it does not wait.
	var freed bool
	uctx, ucancel := context.WithTimeout(ctx, 20*time.Second)
	defer ucancel()
	require.NoError(t, holder.QueryRow(uctx, `SELECT pg_advisory_unlock($1)`, key.Int64()).Scan(&freed))
	require.True(t, freed)
	waitEvent(t, admin, pid, "SyncRep")
	require.False(t, warned.Load())

	if byClose {
		go k.Close()
	} else {
		cancel()
	}
	select {
	case r := <-res:
		o.lease, o.err = r.lease, r.err
	case <-time.After(time.Minute):
		t.Fatal("Acquire did not return")
	}
	require.True(t, warned.Load(), "the server ended the sync wait with its WARNING and reported success")
	mu.Lock()
	defer mu.Unlock()
	return o
}

// waitEvent waits until backend pid waits on event.
func waitEvent(t *testing.T, admin *pgx.Conn, pid int32, event string) {
	t.Helper()
	require.Eventually(t, func() bool {
		var ev string
		err := admin.QueryRow(context.Background(),
			`SELECT coalesce(wait_event, '') FROM pg_stat_activity WHERE pid = $1`, pid).Scan(&ev)
		return err == nil && ev == event
	}, 30*time.Second, 2*time.Millisecond, "backend %d waits on %s", pid, event)
}

// requireKeyFree checks that no session holds key and that another one can
// take it.
func requireKeyFree(t *testing.T, admin *pgx.Conn, key Key) {
	t.Helper()
	ctx := context.Background()
	require.Eventually(t, func() bool {
		n := -1
		_ = admin.QueryRow(ctx, `
			SELECT count(*) FROM pg_locks
			WHERE locktype = 'advisory' AND granted AND objsubid = 1
			  AND classid = $1::bigint::oid AND objid = $2::bigint::oid
			  AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`,
			int64(uint64(key.Int64())>>32), int64(uint64(key.Int64())&0xffffffff)).Scan(&n)
		return n == 0
	}, 20*time.Second, 5*time.Millisecond, "key %v not held", key)
	var got bool
	require.NoError(t, admin.QueryRow(ctx, `SELECT pg_try_advisory_lock($1)`, key.Int64()).Scan(&got))
	require.True(t, got, "another session takes the key")
	require.NoError(t, admin.QueryRow(ctx, `SELECT pg_advisory_unlock($1)`, key.Int64()).Scan(&got))
	require.True(t, got)
}

// TestSyncWaitQueryTimeoutHandsNothingOut: a lock statement whose commit
// waits for a synchronous standby that never answers ends at QueryTimeout
// by the session's deadline, never by a cancel request, even when the
// pool is configured with pgx's cancel-request context watcher: the
// session fails and no lease is handed out. Negative control: with the
// pool's watcher kept (and the WARNING's check removed), the cancel makes the server end the wait with its
// WARNING and report success, and TryAcquire hands out a token the standby
// may not have.
func TestSyncWaitQueryTimeoutHandsNothingOut(t *testing.T) {
	t.Parallel()
	for _, keep := range []bool{false, true} {
		t.Run(map[bool]string{false: "pinned", true: "control"}[keep], func(t *testing.T) {
			t.Parallel()
			ctx, stop := context.WithTimeout(context.Background(), 2*time.Minute)
			defer stop()
			_, srv := pgtest.NewCluster(t, &pgtest.ClusterOptions{Settings: map[string]string{"lc_messages": "C"}})
			db := srv.NewDB(t)
			admin := db.Conn(t)
			var warned atomic.Bool
			pool := db.NewPool(t, func(c *pgxpool.Config) {
				c.ConnConfig.BuildContextWatcherHandler = func(pc *pgconn.PgConn) ctxwatch.Handler {
					return &pgconn.CancelRequestContextWatcherHandler{Conn: pc, DeadlineDelay: time.Minute}
				}
				c.ConnConfig.OnNotice = func(_ *pgconn.PgConn, n *pgconn.Notice) {
					if n.Severity == "WARNING" && n.Code == "01000" && strings.Contains(n.Message, "canceling wait for synchronous replication") {
						warned.Store(true)
					}
				}
			})
			// A commit that writes WAL now waits for a standby that never
			// comes; the Locker's session, opened after this, has the setting.
			nameMissingStandby(t, ctx, admin)
			t.Cleanup(func() { resetSyncStandby(t, admin) })
			k, err := New(ctx, pool, &Config{QueryTimeout: time.Second})
			require.NoError(t, err)
			t.Cleanup(k.Close)
			hooksOf(k).keepWatcher = keep
			hooksOf(k).keepWarned = keep // the control removes both checks: the watcher's and the WARNING's
			hooksOf(k).noRetry = true

			key := ID(2)
			l, err := k.TryAcquireKey(ctx, key, nil)
			// Let the backend's wait end, so that the key is freed.
			_, rerr := admin.Exec(ctx, `ALTER SYSTEM RESET synchronous_standby_names`)
			require.NoError(t, rerr)
			_, rerr = admin.Exec(ctx, `SELECT pg_reload_conf()`)
			require.NoError(t, rerr)
			if keep {
				require.NoError(t, err, "control: the cancelled wait reports success")
				require.NotNil(t, l)
				require.True(t, warned.Load(), "control: the server ended the sync wait with its WARNING")
				t.Logf("control: handed out token %d that the standby may not have", l.Token())
				require.NoError(t, l.Release(ctx))
				return
			}
			require.Error(t, err)
			require.Nil(t, l)
			require.False(t, warned.Load(), "no cancel request reached the server")
			require.Zero(t, k.Stats().Acquired)
			requireKeyFree(t, admin, key)
		})
	}
}

// TestSyncWaitExternalCancelHandsNothingOut: a cancel sent by someone else
// (pg_cancel_backend here; a pooler may forward one) to a lock session
// whose grant's commit waits for a synchronous standby that never answers
// makes the server end the wait with a WARNING and report success. The
// grant is undone and not handed out. Negative control: with the warned
// grants kept, TryAcquire hands out a token the standby may not have.
func TestSyncWaitExternalCancelHandsNothingOut(t *testing.T) {
	t.Parallel()
	for _, keep := range []bool{false, true} {
		t.Run(map[bool]string{false: "undone", true: "control"}[keep], func(t *testing.T) {
			t.Parallel()
			ctx, stop := context.WithTimeout(context.Background(), 2*time.Minute)
			defer stop()
			_, srv := pgtest.NewCluster(t, &pgtest.ClusterOptions{Settings: map[string]string{"lc_messages": "C"}})
			db := srv.NewDB(t)
			admin := db.Conn(t)
			// A database that hides warnings from its sessions: the lock
			// sessions ask for them.
			_, err := admin.Exec(ctx, `DO $$ BEGIN EXECUTE format('ALTER DATABASE %I SET client_min_messages = error', current_database()); END $$`)
			require.NoError(t, err)
			nameMissingStandby(t, ctx, admin)
			t.Cleanup(func() { resetSyncStandby(t, admin) })
			const app = "pgfence-syncwait-external"
			k, err := New(ctx, db.Pool, &Config{QueryTimeout: 5 * time.Second, ApplicationName: app})
			require.NoError(t, err)
			t.Cleanup(k.Close)
			hooksOf(k).keepWarned = keep
			hooksOf(k).noRetry = true

			key := ID(3)
			type result struct {
				l   *Lease
				err error
			}
			res := make(chan result, 1)
			go func() {
				l, err := k.TryAcquireKey(ctx, key, nil)
				res <- result{l, err}
			}()
			var pid int32
			require.Eventually(t, func() bool {
				err := admin.QueryRow(ctx, `SELECT pid FROM pg_stat_activity WHERE application_name = $1 AND wait_event = 'SyncRep'`,
					app).Scan(&pid)
				return err == nil
			}, 30*time.Second, 2*time.Millisecond, "the grant's commit waits for the standby")
			var sent bool
			require.NoError(t, admin.QueryRow(ctx, `SELECT pg_cancel_backend($1)`, pid).Scan(&sent))
			require.True(t, sent)
			var r result
			select {
			case r = <-res:
			case <-time.After(time.Minute):
				t.Fatal("TryAcquire did not return")
			}
			resetSyncStandby(t, admin)
			if keep {
				require.NoError(t, r.err, "control: the cancelled wait reports success")
				require.NotNil(t, r.l)
				t.Logf("control: handed out token %d that the standby may not have", r.l.Token())
				require.NoError(t, r.l.Release(ctx))
				return
			}
			require.ErrorIs(t, r.err, errUnconfirmedCommit)
			require.Nil(t, r.l)
			require.Zero(t, k.Stats().Acquired)
			requireKeyFree(t, admin, key)
		})
	}
}

// nameMissingStandby names a synchronous standby that never connects on
// admin's server and waits until the server has reloaded: from then on,
// every new session's commit that wrote WAL waits for it.
func nameMissingStandby(t *testing.T, ctx context.Context, admin *pgx.Conn) {
	t.Helper()
	_, err := admin.Exec(ctx, `ALTER SYSTEM SET synchronous_standby_names = 'missing_standby'`)
	require.NoError(t, err)
	_, err = admin.Exec(ctx, `SELECT pg_reload_conf()`)
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		var v string
		err := admin.QueryRow(ctx, `SELECT current_setting('synchronous_standby_names')`).Scan(&v)
		return err == nil && v == "missing_standby"
	}, 30*time.Second, 5*time.Millisecond, "the server reloads")
}

// resetSyncStandby names no synchronous standby on admin's server again, so that
// commits waiting for one end.
func resetSyncStandby(t *testing.T, admin *pgx.Conn) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err := admin.Exec(ctx, `ALTER SYSTEM RESET synchronous_standby_names`)
	require.NoError(t, err)
	_, err = admin.Exec(ctx, `SELECT pg_reload_conf()`)
	require.NoError(t, err)
}
