package advisory_test

import (
	"context"
	"fmt"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence"
	"github.com/pgfence/pgfence/advisory"
	"github.com/pgfence/pgfence/internal/pgtest"
)

func TestLossOnTerminatedBackend(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.NewDB(t)
	l := newLocker(t, db.Pool, fastConfig("pgfence-terminate"))
	advisory.SetSessionFill(l, 0) // a session per key, up to MaxSessions
	other := newLocker(t, db.NewPool(t, nil), nil)
	keyA, keyB := advisory.Name("victim"), advisory.Name("bystander")

	lkA, err := l.TryAcquireKey(ctx, keyA, nil)
	require.NoError(t, err)
	lkB, err := l.TryAcquireKey(ctx, keyB, nil)
	require.NoError(t, err)
	pidA, pidB := holderPID(t, db, keyA), holderPID(t, db, keyB)
	require.NotEqual(t, pidA, pidB, "the two locks are on two sessions")
	require.Equal(t, 2, sessionCount(t, db.Pool, "pgfence-terminate"))

	var ok bool
	require.NoError(t, db.Pool.QueryRow(ctx, "SELECT pg_terminate_backend($1, 5000)", pidA).Scan(&ok))
	require.True(t, ok)

	waitDone(t, lkA)
	require.ErrorIs(t, lkA.Err(), pgfence.ErrLeaseLost)
	require.ErrorIs(t, context.Cause(lkA.Context()), pgfence.ErrLeaseLost)

	// Negative control: the lock on the other session is still held.
	require.NoError(t, lkB.Err())
	select {
	case <-lkB.Done():
		t.Fatal("the lock on the surviving session was reported lost")
	default:
	}
	require.Equal(t, []int32{pidB}, holderPIDs(t, db.Pool, keyB))

	require.ErrorIs(t, lkA.Release(ctx), pgfence.ErrNotHeld)
	require.NoError(t, lkA.Release(ctx), "a second Release is a no-op")

	// The key is free for others, and the Locker did not re-acquire it.
	lkO, err := other.TryAcquireKey(ctx, keyA, nil)
	require.NoError(t, err)
	require.Greater(t, lkO.Token(), lkA.Token())
	_, err = l.TryAcquireKey(ctx, keyA, nil)
	require.ErrorIs(t, err, pgfence.ErrNotAcquired)
	require.NoError(t, lkO.Release(ctx))

	// The Locker opens a new session for new locks.
	lkA2, err := l.TryAcquireKey(ctx, keyA, nil)
	require.NoError(t, err)
	require.NoError(t, lkA2.Release(ctx))
	require.NoError(t, lkB.Release(ctx))
}

// TestDoCancelsOnLoss loses the lock while fn runs: fn's context is
// cancelled with the loss as its cause, and Do's error reports the loss
// whether fn swallows the cancellation (returns nil) or returns ctx.Err(),
// which Do joins with the loss.
func TestDoCancelsOnLoss(t *testing.T) {
	t.Parallel()
	for _, fnReturnsCtxErr := range []bool{false, true} {
		t.Run(fmt.Sprintf("fnReturnsCtxErr=%v", fnReturnsCtxErr), func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			db := pgtest.NewDB(t)
			l := newLocker(t, db.Pool, fastConfig("pgfence-do-loss"))
			key := advisory.ID(99)

			var lease pgfence.Lease
			err := l.DoKey(ctx, key, nil, func(ctx context.Context, lk pgfence.Lease) error {
				lease = lk
				// Not fn's ctx: it may be cancelled before the statement returns.
				_, err := db.Pool.Exec(context.Background(), "SELECT pg_terminate_backend($1, 5000)", holderPID(t, db, key))
				require.NoError(t, err)
				<-ctx.Done()
				require.ErrorIs(t, context.Cause(ctx), pgfence.ErrLeaseLost)
				if fnReturnsCtxErr {
					return ctx.Err()
				}
				return nil
			})
			require.ErrorIs(t, err, pgfence.ErrLeaseLost)
			if fnReturnsCtxErr {
				require.ErrorIs(t, err, context.Canceled, "fn's error is joined with the loss")
			} else {
				require.NotErrorIs(t, err, context.Canceled, "negative control: the loss alone")
			}
			require.ErrorIs(t, lease.Err(), pgfence.ErrLeaseLost)
			require.Zero(t, heldAdvisoryLocks(t, db.Pool))
		})
	}
}

func TestLossOnServerRestart(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c, srv := pgtest.NewCluster(t, nil)
	db := srv.NewDB(t)
	l := newLocker(t, db.Pool, fastConfig("pgfence-restart"))
	key := advisory.Name("restart")

	lk, err := l.TryAcquireKey(ctx, key, nil)
	require.NoError(t, err)

	require.NoError(t, c.Crash(syscall.SIGKILL))
	waitDone(t, lk)
	require.ErrorIs(t, lk.Err(), pgfence.ErrLeaseLost)
	require.NoError(t, c.Start(ctx))

	// Another Locker, on a fresh pool, gets the key, with a larger token:
	// the crash did not make the sequence hand out an old token again.
	pool := db.NewPool(t, nil)
	other := newLocker(t, pool, nil)
	lkO, err := other.TryAcquireKey(ctx, key, nil)
	require.NoError(t, err)
	require.Greater(t, lkO.Token(), lk.Token())
	require.ErrorIs(t, lk.Release(ctx), pgfence.ErrNotHeld)

	// The first Locker did not silently re-acquire, and still works.
	_, err = l.TryAcquireKey(ctx, key, nil)
	require.ErrorIs(t, err, pgfence.ErrNotAcquired)
	require.NoError(t, lkO.Release(ctx))
	lk2, err := l.TryAcquireKey(ctx, key, nil)
	require.NoError(t, err)
	require.Greater(t, lk2.Token(), lkO.Token())
	require.NoError(t, lk2.Release(ctx))
}

// TestManyLocksFewSessions takes 10,000 locks from 16 goroutines with the
// default Config: fewer acquisitions are ever in flight than fill a
// session, so every lock lives on one session, and the database sees that
// one connection besides the pools'.
func TestManyLocksFewSessions(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.NewDB(t)
	pool := db.NewPool(t, func(c *pgxpool.Config) { c.MaxConns = 2 })
	const app = "pgfence-many"
	l := newLocker(t, pool, &advisory.Config{ApplicationName: app})

	n, workers := 10000, 16
	if testing.Short() {
		n = 1000
	}
	locks := make([]*advisory.Lease, n)
	errs := make(chan error, workers)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < n; i += workers {
				lk, err := l.TryAcquireKey(ctx, advisory.ID(int64(1)<<40+int64(i)), nil)
				if err != nil {
					errs <- err
					return
				}
				locks[i] = lk
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}

	require.Equal(t, n, heldAdvisoryLocks(t, db.Pool))
	require.Equal(t, 1, sessionCount(t, db.Pool, app), "16 callers fit on one session")
	var backends int
	require.NoError(t, db.Pool.QueryRow(ctx,
		"SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()").Scan(&backends))
	t.Logf("%d locks held by 1 lock session; %d backends on the database in all", n, backends)
	require.LessOrEqual(t, backends, 1+int(pool.Config().MaxConns)+int(db.Pool.Config().MaxConns))

	for _, lk := range locks {
		require.NoError(t, lk.Release(ctx))
	}
	require.Zero(t, heldAdvisoryLocks(t, db.Pool))
}

// TestStatementOnDeadSession covers a session that dies between watchdog
// checks: the next statement on it fails, and that fails the whole session.
func TestStatementOnDeadSession(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.NewDB(t)
	// One session, and a watchdog too slow to notice during the test
	// (nor looking at the idle socket: SetNoPeek).
	l := newLocker(t, db.Pool, &advisory.Config{
		MaxSessions:          1,
		SessionCheckInterval: time.Hour,
		TCPKeepalivesIdle:    3 * time.Hour,
		TCPUserTimeout:       3 * time.Hour,
	})
	advisory.SetNoPeek(l)
	terminate := func(key advisory.Key) {
		_, err := db.Pool.Exec(ctx, "SELECT pg_terminate_backend($1, 5000)", holderPID(t, db, key))
		require.NoError(t, err)
	}

	lkA, err := l.TryAcquireKey(ctx, advisory.ID(1), nil)
	require.NoError(t, err)
	lkB, err := l.TryAcquireKey(ctx, advisory.ID(2), nil)
	require.NoError(t, err)
	terminate(lkA.Key())
	require.NoError(t, lkB.Err(), "not noticed yet")

	// Release fails on the dead session: lkA is reported not held, and lkB,
	// on the same session, is lost at once.
	require.ErrorIs(t, lkA.Release(ctx), pgfence.ErrNotHeld)
	waitDone(t, lkB)
	require.ErrorIs(t, lkB.Err(), pgfence.ErrLeaseLost)

	// A lock statement on a dead session fails the session likewise, and
	// the acquire retries on a new session: the caller gets the lock.
	lkC, err := l.TryAcquireKey(ctx, advisory.ID(3), nil)
	require.NoError(t, err, "a new session replaces the dead one")
	terminate(lkC.Key())
	lkD, err := l.TryAcquireKey(ctx, advisory.ID(4), nil)
	require.NoError(t, err, "retried on a new session")
	waitDone(t, lkC)
	require.ErrorIs(t, lkC.Err(), pgfence.ErrLeaseLost)
	require.NoError(t, lkD.Err())
	require.Equal(t, 1, heldAdvisoryLocks(t, db.Pool))
	require.NoError(t, lkD.Release(ctx))

	// Negative control: without retries the same statement fails, with
	// an error that says the database was unavailable.
	advisory.SetNoRetry(l)
	lkE, err := l.TryAcquireKey(ctx, advisory.ID(5), nil)
	require.NoError(t, err)
	terminate(lkE.Key())
	_, err = l.TryAcquireKey(ctx, advisory.ID(6), nil)
	require.ErrorIs(t, err, pgfence.ErrUnavailable)
	require.NotErrorIs(t, err, pgfence.ErrNotAcquired)
	waitDone(t, lkE)
	require.ErrorIs(t, lkE.Err(), pgfence.ErrLeaseLost)
	require.Zero(t, heldAdvisoryLocks(t, db.Pool))
}

// TestLossOnHungBackend stops the lock session's backend (SIGSTOP): the
// connection stays open but nothing answers. The holder learns of the loss
// from the watchdog's timeout while the server still holds the lock, and
// the lock is free once the backend runs again and sees the connection
// closed.
func TestLossOnHungBackend(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	_, srv := pgtest.NewCluster(t, nil) // a local server, so its backends can be signalled
	db := srv.NewDB(t)
	cfg := fastConfig("pgfence-hung")
	cfg.QueryTimeout = 500 * time.Millisecond
	l := newLocker(t, db.Pool, cfg)
	other := newLocker(t, db.NewPool(t, nil), nil)
	key := advisory.Name("hung")

	lk, err := l.TryAcquireKey(ctx, key, nil)
	require.NoError(t, err)
	pid := int(holderPID(t, db, key))
	require.NoError(t, syscall.Kill(pid, syscall.SIGSTOP))
	resumed := false
	resume := func() {
		if !resumed {
			resumed = true
			require.NoError(t, syscall.Kill(pid, syscall.SIGCONT))
		}
	}
	t.Cleanup(resume)

	waitDone(t, lk)
	require.ErrorIs(t, lk.Err(), pgfence.ErrLeaseLost)
	require.ErrorContains(t, lk.Err(), "liveness check failed")
	_, err = other.TryAcquireKey(ctx, key, nil)
	require.ErrorIs(t, err, pgfence.ErrNotAcquired, "the stopped backend still holds the lock: the holder learned first")

	resume()
	lkO, err := other.AcquireKey(ctx, key, &advisory.AcquireOpts{WaitTimeout: 30 * time.Second})
	require.NoError(t, err, "the backend exits once resumed, releasing the lock")
	require.Greater(t, lkO.Token(), lk.Token())
	require.NoError(t, lkO.Release(ctx))
}

// TestLockTableFull fills the server's lock table: the failing TryAcquireKey
// returns the server's error, and the session, with every lock on it, stays.
func TestLockTableFull(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	_, srv := pgtest.NewCluster(t, &pgtest.ClusterOptions{Settings: map[string]string{
		"max_locks_per_transaction": "10",
		"max_connections":           "20",
	}})
	db := srv.NewDB(t)
	const app = "pgfence-full"
	l := newLocker(t, db.Pool, &advisory.Config{MaxSessions: 1, ApplicationName: app})

	var locks []*advisory.Lease
	var err error
	for i := range 100000 {
		var lk *advisory.Lease
		if lk, err = l.TryAcquireKey(ctx, advisory.ID(int64(i)), nil); err != nil {
			break
		}
		locks = append(locks, lk)
	}
	var pgErr *pgconn.PgError
	require.ErrorAs(t, err, &pgErr)
	require.Equal(t, "53200", pgErr.Code, "out of shared memory")
	require.NotEmpty(t, locks)
	t.Logf("the lock table filled up after %d locks: %v", len(locks), err)

	for _, lk := range locks {
		require.NoError(t, lk.Err())
	}
	// Make room (a new connection needs lock table entries too).
	for _, lk := range locks[:50] {
		require.NoError(t, lk.Release(ctx))
	}
	lk, err := l.TryAcquireKey(ctx, advisory.ID(-1), nil)
	require.NoError(t, err, "the same session takes a lock again")
	require.Equal(t, 1, sessionCount(t, db.Pool, app))
	require.NoError(t, lk.Release(ctx))
	for _, lk := range locks[50:] {
		require.NoError(t, lk.Release(ctx))
	}
	require.Zero(t, heldAdvisoryLocks(t, db.Pool))
}
