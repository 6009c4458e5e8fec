package leasetable_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence"
	"github.com/pgfence/pgfence/internal/notifier"
	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/leasetable"
)

// semaphoreWaiting returns Semaphores' Waiting for sem, or -1 when sem is
// not listed.
func semaphoreWaiting(t *testing.T, k *leasetable.Locker, sem string) int {
	t.Helper()
	sems, err := k.Semaphores(t.Context())
	require.NoError(t, err)
	for _, s := range sems {
		if s.Name == sem {
			return s.Waiting
		}
	}
	return -1
}

// TestSemaphoreWaiting: Semaphores counts the Lockers with a caller waiting
// for a permit, not the calls: Locker a with two waiting calls and Locker b
// with one make 2, while a Locker without LISTEN, also waiting, is not
// registered and not counted. Once they stop waiting the count falls to 0
// (after the Locker's linger).
func TestSemaphoreWaiting(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	db := pgtest.NewDB(t)
	crashedPermit(t, db, "jobs", 1, time.Minute) // every permit held, for a minute
	a := newLocker(t, db.NewPool(t, nil), &leasetable.Config{Owner: "a"})
	b := newLocker(t, db.NewPool(t, nil), &leasetable.Config{Owner: "b"})
	deaf := newLocker(t, db.NewPool(t, nil), &leasetable.Config{Owner: "deaf", DisableListen: true})
	list := newLocker(t, db.Pool, &leasetable.Config{DisableListen: true})
	require.Equal(t, 0, semaphoreWaiting(t, list, "jobs"))

	wctx, stop := context.WithCancel(ctx)
	defer stop()
	errs := make(chan error, 4)
	var wg sync.WaitGroup
	for _, k := range []*leasetable.Locker{a, a, b, deaf} {
		wg.Go(func() {
			l, err := k.AcquirePermit(wctx, "jobs", 1, &pgfence.AcquireOpts{WaitTimeout: time.Minute})
			if err == nil {
				_ = l.Release(context.Background())
			}
			errs <- err
		})
	}
	require.Eventually(t, func() bool {
		return a.Stats().Waiting == 2 && b.Stats().Waiting == 1 && deaf.Stats().Waiting == 1 && semaphoreWaiting(t, list, "jobs") == 2
	}, 30*time.Second, 10*time.Millisecond, "two Lockers registered")
	sems, err := list.Semaphores(ctx)
	require.NoError(t, err)
	require.Equal(t, []leasetable.SemaphoreInfo{{Name: "jobs", Permits: 1, InUse: 1, Waiting: 2}}, sems)

	stop()
	wg.Wait()
	close(errs)
	for err := range errs {
		require.ErrorIs(t, err, context.Canceled)
	}
	require.Eventually(t, func() bool { return semaphoreWaiting(t, list, "jobs") == 0 },
		30*time.Second, 20*time.Millisecond, "nobody waits once the Lockers' linger passed")
}

// TestSemaphoreWaitingCountsOnlyInterest: only a granted shared lock on the
// semaphore's own interest key, in the current database, is counted. A
// session holding it is counted (for keys of both signs, which pg_locks
// shows unsigned); the same key held exclusively, requested and not
// granted, as one bigint, in another database with the same notify key, or
// a neighbouring key, is not.
func TestSemaphoreWaitingCountsOnlyInterest(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	db := pgtest.NewDB(t)
	list := newLocker(t, db.Pool, &leasetable.Config{DisableListen: true})
	key, err := notifier.LoadKey(ctx, db.Pool, `"pgfence"`)
	require.NoError(t, err)

	// One semaphore whose interest id is negative, one non-negative.
	var names []string
	for _, negative := range []bool{true, false} {
		for i := 0; ; i++ {
			n := fmt.Sprintf("sem%d", i)
			if id := key.InterestID(n + leasetable.PermitSeparator); (id < 0) == negative {
				names = append(names, n)
				break
			}
		}
	}
	session := func(db *pgtest.DB) *pgx.Conn {
		c, err := pgx.Connect(ctx, db.URL)
		require.NoError(t, err)
		t.Cleanup(func() { _ = c.Close(context.Background()) })
		return c
	}
	lock := func(c *pgx.Conn, sql string, args ...any) {
		t.Helper()
		_, err := c.Exec(ctx, sql, args...)
		require.NoError(t, err)
	}
	for _, n := range names {
		crashedPermit(t, db, n, 2, time.Minute)
		id := key.InterestID(n + leasetable.PermitSeparator)
		require.Equal(t, 0, semaphoreWaiting(t, list, n), n)

		// Not counted: an exclusive lock on the key, and a shared lock
		// requested behind it, not granted.
		excl, queued := session(db), session(db)
		lock(excl, "SELECT pg_advisory_lock($1, $2)", leasetable.InterestClassID, id)
		got := make(chan error, 1)
		go func() {
			_, err := queued.Exec(ctx, "SELECT pg_advisory_lock_shared($1, $2)", leasetable.InterestClassID, id)
			got <- err
		}()
		require.Eventually(t, func() bool {
			var n int
			require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_locks
				WHERE locktype = 'advisory' AND classid = $1 AND objid = $2 AND objsubid = 2 AND NOT granted`,
				uint32(leasetable.InterestClassID), uint32(id)).Scan(&n))
			return n == 1
		}, 30*time.Second, 5*time.Millisecond, "the shared request waits")
		require.Equal(t, 0, semaphoreWaiting(t, list, n), "exclusive, and shared not granted")

		// Not counted: the neighbouring key, the same 64 bits as one bigint
		// key, and the key itself in another database of the same install.
		other := pgtest.NewDB(t)
		otherKey, err := notifier.LoadKey(ctx, other.Pool, `"pgfence"`)
		require.NoError(t, err)
		require.Equal(t, key, otherKey, "both databases come from one template: same notify key, same interest ids")
		stranger, elsewhere := session(db), session(other)
		lock(stranger, "SELECT pg_advisory_lock_shared($1, $2)", leasetable.InterestClassID, id^1)
		lock(stranger, "SELECT pg_advisory_lock_shared($1)", int64(leasetable.InterestClassID)<<32|int64(uint32(id)))
		lock(elsewhere, "SELECT pg_advisory_lock_shared($1, $2)", leasetable.InterestClassID, id)
		require.Equal(t, 0, semaphoreWaiting(t, list, n), "other keys and other databases")

		// Counted: the exclusive holder leaves, the queued shared lock is
		// granted; then another session holds it shared too.
		lock(excl, "SELECT pg_advisory_unlock($1, $2)", leasetable.InterestClassID, id)
		require.NoError(t, <-got)
		require.Equal(t, 1, semaphoreWaiting(t, list, n), "the granted shared lock (id %d)", id)
		lock(session(db), "SELECT pg_advisory_lock_shared($1, $2)", leasetable.InterestClassID, id)
		lock(queued, "SELECT pg_advisory_lock_shared($1, $2)", leasetable.InterestClassID, id) // twice in one session
		require.Equal(t, 2, semaphoreWaiting(t, list, n), "sessions, not locks taken")
	}
}

// TestSemaphoresHostileSearchPath: Semaphores runs none of the look-alikes
// an attacker plants in public (hostileSQL, and those of the built-ins only
// its statement calls), with public first on the search_path, and still
// counts the waiter. Negative control: unqualified calls on the same pool
// run them.
func TestSemaphoresHostileSearchPath(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	db := pgtest.NewDB(t)
	planted := append(hostileSQL[:len(hostileSQL):len(hostileSQL)],
		`CREATE FUNCTION public.sha256(a bytea) RETURNS bytea LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp
			AS $f$ BEGIN INSERT INTO public.attacker_ran VALUES ('sha256'); RETURN pg_catalog.sha256(a); END $f$`,
		`CREATE FUNCTION public.get_byte(a bytea, n integer) RETURNS integer LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp
			AS $f$ BEGIN INSERT INTO public.attacker_ran VALUES ('get_byte'); RETURN pg_catalog.get_byte(a, n); END $f$`,
		`CREATE FUNCTION public.attacker_oideq(a oid, b oid) RETURNS boolean LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp
			AS $f$ BEGIN INSERT INTO public.attacker_ran VALUES ('oid = oid'); RETURN pg_catalog.oideq(a, b); END $f$`,
		`CREATE OPERATOR public.= (LEFTARG = oid, RIGHTARG = oid, FUNCTION = public.attacker_oideq)`,
	)
	for _, stmt := range planted {
		_, err := db.Pool.Exec(ctx, stmt)
		require.NoError(t, err, stmt)
	}
	hostile := db.NewPool(t, func(c *pgxpool.Config) { c.ConnConfig.RuntimeParams["search_path"] = "public, pg_catalog" })
	list := newLocker(t, hostile, &leasetable.Config{DisableListen: true})
	key, err := notifier.LoadKey(ctx, db.Pool, `"pgfence"`)
	require.NoError(t, err)
	crashedPermit(t, db, "jobs", 1, time.Minute)
	waiter, err := pgx.Connect(ctx, db.URL)
	require.NoError(t, err)
	t.Cleanup(func() { _ = waiter.Close(context.Background()) })
	_, err = waiter.Exec(ctx, "SELECT pg_advisory_lock_shared($1, $2)", leasetable.InterestClassID, key.InterestID("jobs"+leasetable.PermitSeparator))
	require.NoError(t, err)

	sems, err := list.Semaphores(ctx)
	require.NoError(t, err)
	require.Equal(t, []leasetable.SemaphoreInfo{{Name: "jobs", Permits: 1, InUse: 1, Waiting: 1}}, sems)
	ran := func() []string {
		var ran []string
		require.NoError(t, db.Pool.QueryRow(ctx,
			`SELECT coalesce(array_agg(DISTINCT fn ORDER BY fn), '{}') FROM public.attacker_ran`).Scan(&ran))
		return ran
	}
	require.Empty(t, ran(), "a planted look-alike ran")

	// The control: unqualified, the same calls reach the look-alikes.
	require.NoError(t, hostile.QueryRow(ctx, `SELECT get_byte(sha256('\x01'::bytea), 0), 1::oid = 1::oid, 'a' || 'b' = 'ab'`).
		Scan(new(int32), new(bool), new(bool)))
	require.Equal(t, []string{"get_byte", "oid = oid", "sha256", "text = text", "text || text"}, ran())
}
