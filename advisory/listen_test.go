package advisory_test

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence"
	"github.com/pgfence/pgfence/advisory"
	"github.com/pgfence/pgfence/internal/pgtest"
)

// slowPolls makes l's waiting Lock calls pause 15s to 30s between attempts,
// so that within the tests' 10s deadlines only a notification can wake them.
func slowPolls(l *advisory.Locker) { advisory.SetFirstPollInterval(l, 30*time.Second) }

// listenerPID waits until the LISTEN connection of the Locker whose
// ApplicationName is appName is listening (other than on backend notPID),
// and returns its backend pid.
func listenerPID(t *testing.T, pool *pgxpool.Pool, appName string, notPID int32) int32 {
	t.Helper()
	var pid int32
	require.Eventually(t, func() bool {
		err := pool.QueryRow(context.Background(), `
			SELECT pid FROM pg_stat_activity
			WHERE datname = current_database() AND application_name = $1
			  AND query = 'LISTEN `+advisory.NotifyChannel+`' AND pid <> $2`, appName+"-listen", notPID).Scan(&pid)
		return err == nil
	}, 30*time.Second, 10*time.Millisecond, "the LISTEN connection of %s", appName)
	return pid
}

// waitTried waits until a lock session of the Locker whose ApplicationName
// is appName has finished an attempt at a lock (and is idle).
func waitTried(t *testing.T, pool *pgxpool.Pool, appName string) {
	t.Helper()
	require.Eventually(t, func() bool {
		var n int
		require.NoError(t, pool.QueryRow(context.Background(), `
			SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND application_name = $1
			  AND state = 'idle' AND query LIKE '%pg_try_advisory_lock%'`, appName).Scan(&n))
		return n > 0
	}, 30*time.Second, 10*time.Millisecond, "an attempt by %s", appName)
}

// lockResult is the outcome of a Lock call run in a goroutine.
type lockResult struct {
	lk  *advisory.Lock
	err error
}

// lockAsync runs l.Lock(key) with a 10s deadline in a goroutine.
func lockAsync(l *advisory.Locker, key advisory.Key, opts *advisory.LockOpts) <-chan lockResult {
	ch := make(chan lockResult, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		lk, err := l.Lock(ctx, key, opts)
		ch <- lockResult{lk, err}
	}()
	return ch
}

func TestUnlockAnnouncesRelease(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.NewDB(t)
	conn := db.Conn(t)
	_, err := conn.Exec(ctx, "LISTEN "+advisory.NotifyChannel)
	require.NoError(t, err)
	l := newLocker(t, db.NewPool(t, nil), &advisory.Config{DisableListen: true})
	next := func() string {
		wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		n, err := conn.WaitForNotification(wctx)
		require.NoError(t, err)
		return n.Payload
	}
	// marker notifies on the channel from the listening connection itself:
	// it arrives after whatever was announced before it, so receiving it
	// next shows that nothing was.
	marker := func() {
		_, err := conn.Exec(ctx, "NOTIFY "+advisory.NotifyChannel+", 'marker'")
		require.NoError(t, err)
	}

	key := advisory.ID(-42)
	lk, err := l.TryLock(ctx, key, nil)
	require.NoError(t, err)
	require.NoError(t, lk.Unlock(ctx))
	require.Equal(t, "-42", next(), "an exclusive unlock announces its key in decimal")

	// Shared: only the last holder of the Locker announces the release.
	key = advisory.Name("shared")
	s1, err := l.TryLock(ctx, key, &advisory.LockOpts{Shared: true})
	require.NoError(t, err)
	s2, err := l.TryLock(ctx, key, &advisory.LockOpts{Shared: true})
	require.NoError(t, err)
	require.NoError(t, s1.Unlock(ctx))
	marker()
	require.Equal(t, "marker", next(), "the key is still held: no announcement")
	require.NoError(t, s2.Unlock(ctx))
	require.Equal(t, strconv.FormatInt(key.Int64(), 10), next())

	// A lost lock announces nothing from this Locker (the server frees it).
	lk, err = l.TryLock(ctx, key, nil)
	require.NoError(t, err)
	l.Close()
	require.ErrorIs(t, lk.Unlock(ctx), pgfence.ErrNotHeld)
	marker()
	require.Equal(t, "marker", next())
}

func TestWaiterWokenByAnotherLockersUnlock(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.NewDB(t)
	a := newLocker(t, db.Pool, nil)
	const appB = "pgfence-wake-b"
	b := newLocker(t, db.NewPool(t, nil), &advisory.Config{
		MaxSessions: 2, MaxPollInterval: 30 * time.Second, ApplicationName: appB,
	})
	slowPolls(b)

	const n = 8
	held := make([]*advisory.Lock, n)
	waits := make([]<-chan lockResult, n)
	for i := range n {
		var err error
		held[i], err = a.TryLock(ctx, advisory.ID(int64(1000+i)), nil)
		require.NoError(t, err)
		waits[i] = lockAsync(b, advisory.ID(int64(1000+i)), nil)
	}
	listenerPID(t, db.Pool, appB, 0)
	waitTried(t, db.Pool, appB)

	// Waiting takes no session beyond the Locker's lock sessions and its
	// one LISTEN connection.
	require.LessOrEqual(t, sessionCount(t, db.Pool, appB), 2)
	require.Equal(t, 1, sessionCount(t, db.Pool, appB+"-listen"))

	for i := range n {
		require.NoError(t, held[i].Unlock(ctx))
	}
	for i := range n {
		r := <-waits[i]
		require.NoError(t, r.err, "waiter %d is woken by the announcement, well before its next poll", i)
		require.Greater(t, r.lk.Token(), held[i].Token())
		require.NoError(t, r.lk.Unlock(ctx))
	}
	require.LessOrEqual(t, sessionCount(t, db.Pool, appB), 2)
	require.Equal(t, 1, sessionCount(t, db.Pool, appB+"-listen"))

	b.Close()
	require.Zero(t, sessionCount(t, db.Pool, appB+"-listen"), "Close closes the LISTEN connection")
}

func TestWaitingWithoutListen(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.NewDB(t)
	a := newLocker(t, db.Pool, nil)

	for _, tc := range []struct {
		name  string
		slow  bool // polls too slow to see the release in time
		wants error
	}{
		{name: "polling finds the key free"},
		{name: "negative control: without notifications a slow poller misses it", slow: true, wants: pgfence.ErrNotAcquired},
	} {
		t.Run(tc.name, func(t *testing.T) {
			appB := fmt.Sprintf("pgfence-nolisten-%t", tc.slow)
			cfg := &advisory.Config{DisableListen: true, MaxPollInterval: 50 * time.Millisecond, ApplicationName: appB}
			if tc.slow {
				cfg.MaxPollInterval = 30 * time.Second
			}
			b := newLocker(t, db.NewPool(t, nil), cfg)
			if tc.slow {
				slowPolls(b)
			}
			key := advisory.Name(appB)
			held, err := a.TryLock(ctx, key, nil)
			require.NoError(t, err)
			got := lockAsync(b, key, &advisory.LockOpts{WaitTimeout: 3 * time.Second})
			waitTried(t, db.Pool, appB)
			require.NoError(t, held.Unlock(ctx))
			r := <-got
			require.Zero(t, sessionCount(t, db.Pool, appB+"-listen"), "no LISTEN connection")
			if tc.wants != nil {
				require.ErrorIs(t, r.err, tc.wants)
				return
			}
			require.NoError(t, r.err)
			require.Greater(t, r.lk.Token(), held.Token())
			require.NoError(t, r.lk.Unlock(ctx))
		})
	}
}

func TestListenerReconnects(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.NewDB(t)
	a := newLocker(t, db.Pool, nil)
	const appB = "pgfence-relisten-b"
	logs := &recordHandler{}
	b := newLocker(t, db.NewPool(t, nil), &advisory.Config{
		MaxPollInterval: 30 * time.Second, ApplicationName: appB, Logger: slog.New(logs),
	})
	slowPolls(b)

	key := advisory.Name("relisten")
	held, err := a.TryLock(ctx, key, nil)
	require.NoError(t, err)
	got := lockAsync(b, key, nil)
	pid := listenerPID(t, db.Pool, appB, 0)

	var killed bool
	require.NoError(t, db.Pool.QueryRow(ctx, "SELECT pg_terminate_backend($1, 5000)", pid).Scan(&killed))
	require.True(t, killed)
	newPID := listenerPID(t, db.Pool, appB, pid)
	require.NotEqual(t, pid, newPID)
	select {
	case <-logs.logged("advisory: LISTEN connection failed; waiters poll until it is back"):
	case <-time.After(30 * time.Second):
		t.Fatal("the listener's failure was not logged")
	}

	require.NoError(t, held.Unlock(ctx))
	r := <-got
	require.NoError(t, r.err, "the waiter is woken through the new LISTEN connection")
	require.Greater(t, r.lk.Token(), held.Token())
	require.NoError(t, r.lk.Unlock(ctx))
	require.Equal(t, 1, sessionCount(t, db.Pool, appB+"-listen"))
}
