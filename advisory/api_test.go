package advisory_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence"
	"github.com/pgfence/pgfence/advisory"
	"github.com/pgfence/pgfence/internal/pgtest"
)

// The Locker and its handle are the strategy-neutral types of package
// pgfence.
var (
	_ pgfence.Locker = (*advisory.Locker)(nil)
	_ pgfence.Lease  = (*advisory.Lease)(nil)
)

// returns runs f in a goroutine and returns its error; the bound only
// guards against hanging (a call that should return at once but waits
// would otherwise block the test until the global timeout).
func returns(t *testing.T, what string, f func() error) error {
	t.Helper()
	ch := make(chan error, 1)
	go func() { ch <- f() }()
	select {
	case err := <-ch:
		return err
	case <-time.After(30 * time.Second):
		t.Fatalf("%s did not return", what)
		return nil
	}
}

func TestNewChecksSchema(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.NewDB(t)

	// Negative control: the migrated schema passes, named or by default.
	newLocker(t, db.Pool, nil)
	k := newLocker(t, db.Pool, &advisory.Config{Schema: pgfence.DefaultSchema})
	require.Equal(t, pgfence.DefaultSchema, k.Schema())

	_, err := advisory.New(ctx, db.Pool, &advisory.Config{Schema: "nope"})
	require.ErrorIs(t, err, pgfence.ErrNotInstalled)
	require.ErrorContains(t, err, `schema "nope" does not exist`)
	_, err = db.Pool.Exec(ctx, `CREATE SCHEMA "Empty one"`)
	require.NoError(t, err)
	_, err = advisory.New(ctx, db.Pool, &advisory.Config{Schema: "Empty one"})
	require.ErrorIs(t, err, pgfence.ErrNotInstalled)
	require.ErrorContains(t, err, `schema "Empty one" has no pgfence_leases table; pgfence is installed in schema pgfence`)

	// A cached sequence hands out tokens out of order across sessions.
	_, err = db.Pool.Exec(ctx, "ALTER SEQUENCE pgfence.pgfence_leases_fence_seq CACHE 50")
	require.NoError(t, err)
	_, err = advisory.New(ctx, db.Pool, nil)
	require.ErrorIs(t, err, pgfence.ErrNotInstalled)
	require.ErrorContains(t, err, "CACHE 50")

	_, err = db.Pool.Exec(ctx, "ALTER SEQUENCE pgfence.pgfence_leases_fence_seq CACHE 1")
	require.NoError(t, err)
	newLocker(t, db.Pool, nil)

	// A ctx that ended is not a missing schema.
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	_, err = advisory.New(cctx, db.Pool, nil)
	require.ErrorIs(t, err, context.Canceled)
	require.NotErrorIs(t, err, pgfence.ErrNotInstalled)
	require.Zero(t, sessionCount(t, db.Pool, advisory.DefaultApplicationName), "New opens no lock session")
}

// reentrantAttempts are the ways to ask again for the lock on Name(name)
// (or the same key as an ID), under ctx.
func reentrantAttempts(t *testing.T, k *advisory.Locker, ctx context.Context, name string) map[string]func() error {
	fn := func(context.Context, pgfence.Lease) error {
		t.Errorf("fn of a nested Do of %q ran", name)
		return nil
	}
	asID := advisory.ID(advisory.Name(name).Int64())
	leaseErr := func(l pgfence.Lease, err error) error {
		if err == nil {
			_ = l.Release(context.Background())
		}
		return err
	}
	keyErr := func(l *advisory.Lease, err error) error {
		if err == nil {
			_ = l.Release(context.Background())
		}
		return err
	}
	shared := &advisory.AcquireOpts{Shared: true}
	return map[string]func() error{
		"TryAcquire":        func() error { return leaseErr(k.TryAcquire(ctx, name, nil)) },
		"Acquire":           func() error { return leaseErr(k.Acquire(ctx, name, nil)) },
		"Acquire shared":    func() error { return leaseErr(k.Acquire(ctx, name, shared)) },
		"Do":                func() error { return k.Do(ctx, name, nil, fn) },
		"TryAcquireKey":     func() error { return keyErr(k.TryAcquireKey(ctx, advisory.Name(name), nil)) },
		"AcquireKey":        func() error { return keyErr(k.AcquireKey(ctx, advisory.Name(name), nil)) },
		"DoKey":             func() error { return k.DoKey(ctx, advisory.Name(name), nil, fn) },
		"TryAcquireKey(ID)": func() error { return keyErr(k.TryAcquireKey(ctx, asID, nil)) },
		"AcquireKey(ID)":    func() error { return keyErr(k.AcquireKey(ctx, asID, nil)) },
		"DoKey(ID)":         func() error { return k.DoKey(ctx, asID, nil, fn) },
	}
}

// requireAlreadyHeld checks that every attempt returns at once with
// ErrAlreadyHeld, which also matches ErrNotAcquired.
func requireAlreadyHeld(t *testing.T, attempts map[string]func() error) {
	t.Helper()
	for what, f := range attempts {
		err := returns(t, what, f)
		require.ErrorIs(t, err, pgfence.ErrAlreadyHeld, what)
		require.ErrorIs(t, err, pgfence.ErrNotAcquired, what)
	}
}

func TestReentrantAcquireRefused(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.NewDB(t)
	k := newLocker(t, db.Pool, nil)
	other := newLocker(t, db.NewPool(t, nil), nil)

	held, err := k.TryAcquire(ctx, "reentrant", nil)
	require.NoError(t, err)
	type ctxKey struct{}
	for _, c := range []context.Context{held.Context(), context.WithValue(held.Context(), ctxKey{}, 1)} {
		requireAlreadyHeld(t, reentrantAttempts(t, k, c, "reentrant"))
	}
	require.NoError(t, held.Err(), "the refusals cost the lease nothing")
	require.Equal(t, 1, heldAdvisoryLocks(t, db.Pool))

	// Negative controls: under the lease's context, another name is
	// granted; the same name asked of another Locker is held by another
	// session, which is not the caller.
	l2, err := k.TryAcquire(held.Context(), "another name", nil)
	require.NoError(t, err)
	require.NoError(t, l2.Release(ctx))
	_, err = other.TryAcquire(held.Context(), "reentrant", nil)
	require.ErrorIs(t, err, pgfence.ErrNotAcquired)
	require.NotErrorIs(t, err, pgfence.ErrAlreadyHeld)

	// Inside Do's fn, for the Do's own name.
	require.NoError(t, k.Do(ctx, "in do", nil, func(ctx context.Context, l pgfence.Lease) error {
		requireAlreadyHeld(t, reentrantAttempts(t, k, ctx, "in do"))
		require.NoError(t, l.Err())
		return nil
	}))

	// Another goroutine, whose ctx does not descend from the lease, waits
	// for it: it times out as a waiter, and gets it once released.
	err = returns(t, "bounded Acquire", func() error {
		_, err := k.Acquire(ctx, "reentrant", &advisory.AcquireOpts{WaitTimeout: 50 * time.Millisecond})
		return err
	})
	require.ErrorIs(t, err, pgfence.ErrNotAcquired)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.NotErrorIs(t, err, pgfence.ErrAlreadyHeld)
	got := make(chan lockResult, 1)
	go func() {
		l, err := k.AcquireKey(ctx, advisory.Name("reentrant"), nil)
		got <- lockResult{l, err}
	}()
	require.NoError(t, held.Release(ctx))
	r := result(t, got)
	require.NoError(t, r.err)
	require.Greater(t, r.lk.Token(), held.Token())
	require.NoError(t, r.lk.Release(ctx))
	require.Zero(t, heldAdvisoryLocks(t, db.Pool))
}

func TestLeaseReleaseExpiryRenew(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.NewDB(t)
	// A watchdog too slow to notice during the test, so that Renew is
	// what finds the loss.
	k := newLocker(t, db.Pool, &advisory.Config{
		SessionCheckInterval: time.Hour,
		TCPKeepalivesIdle:    3 * time.Hour,
		TCPUserTimeout:       3 * time.Hour,
	})
	advisory.SetNoPeek(k) // nor by looking at the idle socket

	require.NoError(t, (*advisory.Lease)(nil).Release(ctx))

	lease, err := k.TryAcquire(ctx, "renew", nil)
	require.NoError(t, err)
	require.True(t, lease.Expiry().IsZero(), "a session lock has no deadline")
	require.NoError(t, lease.Renew(ctx))
	require.NoError(t, lease.Err())

	var pid int32
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT pid FROM pg_stat_activity
		WHERE datname = current_database() AND application_name = $1`, advisory.DefaultApplicationName).Scan(&pid))
	require.Equal(t, []int32{pid}, holderPIDs(t, db.Pool, advisory.Name("renew")))
	var ok bool
	require.NoError(t, db.Pool.QueryRow(ctx, "SELECT pg_terminate_backend($1, 5000)", pid).Scan(&ok))
	require.True(t, ok)
	require.NoError(t, lease.Err(), "not noticed yet")

	err = lease.Renew(ctx)
	require.ErrorIs(t, err, pgfence.ErrLeaseLost)
	waitDone(t, lease)
	require.ErrorIs(t, lease.Err(), pgfence.ErrLeaseLost)
	require.ErrorIs(t, lease.Renew(ctx), pgfence.ErrLeaseLost, "Renew after the loss repeats it")
	require.ErrorIs(t, lease.Release(ctx), pgfence.ErrNotHeld)

	// Renew after Release: not held, and not lost.
	lease, err = k.TryAcquire(ctx, "renew", nil)
	require.NoError(t, err, "a new session replaces the dead one")
	require.NoError(t, lease.Renew(ctx))
	require.NoError(t, lease.Release(ctx))
	err = lease.Renew(ctx)
	require.ErrorIs(t, err, pgfence.ErrNotHeld)
	require.NotErrorIs(t, err, pgfence.ErrLeaseLost)
	require.NoError(t, lease.Release(ctx), "a second Release is a no-op")
	require.Zero(t, heldAdvisoryLocks(t, db.Pool))
}

// requireWaitTimedOut checks the error of a wait that ran out of its
// WaitTimeout.
func requireWaitTimedOut(t *testing.T, err error, what string) {
	t.Helper()
	require.ErrorIs(t, err, pgfence.ErrNotAcquired, what)
	require.ErrorIs(t, err, context.DeadlineExceeded, what)
	require.NotErrorIs(t, err, pgfence.ErrAlreadyHeld, what)
}

func TestWaitTimeoutMatchesDeadlineExceeded(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.NewDB(t)
	a := newLocker(t, db.Pool, nil)
	b := newLocker(t, db.NewPool(t, nil), nil)
	const name = "busy"
	held, err := a.TryAcquire(ctx, name, nil)
	require.NoError(t, err)

	opts := &advisory.AcquireOpts{WaitTimeout: 50 * time.Millisecond}
	fn := func(context.Context, pgfence.Lease) error {
		t.Error("fn ran without the lock")
		return nil
	}
	// WaitTimeout bounds the wait only: neither the Lease nor Do's fn
	// inherits its deadline. (A WaitTimeout long enough for b's first
	// acquire, which dials its session: 50ms was not, now and then, on a
	// loaded machine.)
	freeOpts := &advisory.AcquireOpts{WaitTimeout: 30 * time.Second}
	l, err := b.Acquire(ctx, "free", freeOpts)
	require.NoError(t, err)
	_, hasDeadline := l.Context().Deadline()
	require.False(t, hasDeadline)
	require.NoError(t, l.Release(ctx))
	require.NoError(t, b.Do(ctx, "free", freeOpts, func(ctx context.Context, l pgfence.Lease) error {
		_, hasDeadline := ctx.Deadline()
		require.False(t, hasDeadline, "fn's context has no deadline of WaitTimeout")
		return nil
	}))

	// Held by another session (b) and by another caller of this Locker (a).
	for _, k := range map[string]*advisory.Locker{"other Locker": b, "same Locker": a} {
		l, err := k.Acquire(ctx, name, opts)
		requireWaitTimedOut(t, err, "Acquire")
		require.True(t, l == nil, "no Lease, not a Lease holding a nil *advisory.Lease")
		l, err = k.TryAcquire(ctx, name, nil)
		require.ErrorIs(t, err, pgfence.ErrNotAcquired)
		require.True(t, l == nil, "no Lease, not a Lease holding a nil *advisory.Lease")
		_, err = k.AcquireKey(ctx, advisory.Name(name), &advisory.AcquireOpts{WaitTimeout: opts.WaitTimeout, Shared: true})
		requireWaitTimedOut(t, err, "AcquireKey shared")
		requireWaitTimedOut(t, k.Do(ctx, name, opts, fn), "Do")
		requireWaitTimedOut(t, k.DoKey(ctx, advisory.Name(name), opts, fn), "DoKey")
	}

	// In a transaction, against the session lock and against another
	// transaction's lock; the transaction stays usable.
	tx1 := begin(t, db)
	_, err = a.TryAcquireTx(ctx, tx1, advisory.ID(5), nil)
	require.NoError(t, err)
	tx2 := begin(t, db)
	for _, key := range []advisory.Key{advisory.Name(name), advisory.ID(5)} {
		_, err = b.AcquireTx(ctx, tx2, key, opts)
		requireWaitTimedOut(t, err, "AcquireTx "+key.String())
		_, err = b.AcquireTx(ctx, tx2, key, &advisory.AcquireOpts{WaitTimeout: opts.WaitTimeout, Shared: true})
		requireWaitTimedOut(t, err, "AcquireTx shared "+key.String())
	}
	var one int
	require.NoError(t, tx2.QueryRow(ctx, "SELECT 1").Scan(&one))
	require.NoError(t, tx1.Rollback(ctx))
	tok, err := b.AcquireTx(ctx, tx2, advisory.ID(5), opts)
	require.NoError(t, err)
	require.Positive(t, tok)
	require.NoError(t, tx2.Rollback(ctx))
	require.NoError(t, held.Release(ctx))
	require.Zero(t, heldAdvisoryLocks(t, db.Pool))
}

func TestAcquireOptsTTLAndAtLeastRejected(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.NewDB(t)
	const app = "pgfence-opts"
	k := newLocker(t, db.Pool, &advisory.Config{ApplicationName: app})
	tx := begin(t, db)

	fn := func(context.Context, pgfence.Lease) error {
		t.Error("fn ran with rejected options")
		return nil
	}
	key := advisory.Name("opts")
	for _, tc := range []struct {
		opts  *advisory.AcquireOpts
		field string
	}{
		{&advisory.AcquireOpts{TTL: time.Minute}, "AcquireOpts.TTL"},
		{&advisory.AcquireOpts{TTL: time.Minute, Shared: true, WaitTimeout: time.Second}, "AcquireOpts.TTL"},
		{&advisory.AcquireOpts{AtLeast: time.Second}, "AcquireOpts.AtLeast"},
		{&advisory.AcquireOpts{AtLeast: time.Second, Shared: true, WaitTimeout: time.Second}, "AcquireOpts.AtLeast"},
	} {
		for what, f := range map[string]func() error{
			"TryAcquire":    func() error { _, err := k.TryAcquire(ctx, "opts", tc.opts); return err },
			"Acquire":       func() error { _, err := k.Acquire(ctx, "opts", tc.opts); return err },
			"Do":            func() error { return k.Do(ctx, "opts", tc.opts, fn) },
			"TryAcquireKey": func() error { _, err := k.TryAcquireKey(ctx, key, tc.opts); return err },
			"AcquireKey":    func() error { _, err := k.AcquireKey(ctx, key, tc.opts); return err },
			"DoKey":         func() error { return k.DoKey(ctx, key, tc.opts, fn) },
			"TryAcquireTx":  func() error { _, err := k.TryAcquireTx(ctx, tx, key, tc.opts); return err },
			"AcquireTx":     func() error { _, err := k.AcquireTx(ctx, tx, key, tc.opts); return err },
		} {
			desc := fmt.Sprintf("%s(%+v)", what, *tc.opts)
			err := returns(t, desc, f)
			require.ErrorContains(t, err, "pgfence: advisory: "+tc.field+" is set", desc)
			require.NotErrorIs(t, err, pgfence.ErrNotAcquired, desc)
		}
	}
	require.Zero(t, sessionCount(t, db.Pool, app), "no lock session was opened")
	require.Zero(t, heldAdvisoryLocks(t, db.Pool))
	var one int
	require.NoError(t, tx.QueryRow(ctx, "SELECT 1").Scan(&one), "the transaction is untouched")

	// Negative control: the fields advisory honours open a session.
	l, err := k.TryAcquire(ctx, "opts", &advisory.AcquireOpts{Shared: true, WaitTimeout: time.Second})
	require.NoError(t, err)
	require.Equal(t, 1, sessionCount(t, db.Pool, app))
	require.NoError(t, l.Release(ctx))
	_, err = k.TryAcquireTx(ctx, tx, key, &advisory.AcquireOpts{Shared: true})
	require.NoError(t, err)
}
