package leasetable_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence"
	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/leasetable"
	"github.com/pgfence/pgfence/migrations"
)

// newRolePool creates a login role with pgfence's grants on db
// (migrations.Grant; operator: the operator's grant too) and returns a pool
// connected as it. The role is dropped when the test ends; roles are per
// server, so its name is unique.
func newRolePool(t *testing.T, db *pgtest.DB, operator bool) (*pgxpool.Pool, string) {
	t.Helper()
	ctx := context.Background()
	var rnd [6]byte
	_, _ = rand.Read(rnd[:])
	role := "pgfence_app_" + hex.EncodeToString(rnd[:])
	ident := pgx.Identifier{role}.Sanitize()
	_, err := db.Pool.Exec(ctx, "CREATE ROLE "+ident+" LOGIN")
	require.NoError(t, err)
	t.Cleanup(func() {
		// After the role's pool closed (cleanups run last first).
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_, err := db.Pool.Exec(ctx, "DROP OWNED BY "+ident)
		require.NoError(t, err)
		_, err = db.Pool.Exec(ctx, "DROP ROLE "+ident)
		require.NoError(t, err)
	})
	// As the install's owner, exactly what pgfence grant [--operator] runs.
	require.NoError(t, migrations.Grant(ctx, migrations.Target{Pool: db.Pool}, role, nil,
		&migrations.GrantOpts{Operator: operator}))
	return db.NewPool(t, func(c *pgxpool.Config) { c.ConnConfig.User = role }), role
}

// requireDenied checks that err is PostgreSQL's insufficient_privilege.
func requireDenied(t *testing.T, err error, what string) {
	t.Helper()
	var pgErr *pgconn.PgError
	require.ErrorAs(t, err, &pgErr, what)
	require.Equal(t, "42501", pgErr.Code, "%s: %v", what, err)
}

// An application role with only pgfence's grants runs a Locker end to end,
// while it cannot write the lease table or draw from the sequence itself.
func TestLeastPrivilegeRole(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.NewDB(t)
	app, role := newRolePool(t, db, false)
	var user string
	require.NoError(t, app.QueryRow(ctx, "SELECT session_user::text").Scan(&user))
	require.Equal(t, role, user)

	kLogs := newLogWatch()
	k := newLocker(t, app, &leasetable.Config{TTL: 3 * time.Second, RenewInterval: 100 * time.Millisecond, Logger: kLogs.logger()})
	other := newLocker(t, db.Pool, nil)

	l, err := k.TryAcquire(ctx, "job", nil)
	require.NoError(t, err)
	_, err = other.TryAcquire(ctx, "job", nil)
	require.ErrorIs(t, err, pgfence.ErrNotAcquired)
	require.NoError(t, l.Renew(ctx))
	list, err := k.List(ctx)
	require.NoError(t, err)
	require.Len(t, list, 1)
	require.Equal(t, l.Token(), list[0].Token)
	info, ok, err := k.Get(ctx, "job")
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, k.Owner(), info.Owner)
	require.NoError(t, l.Release(ctx))

	// Waiting, woken by the release's notification.
	held, err := other.TryAcquire(ctx, "handover", &leasetable.AcquireOpts{TTL: time.Hour})
	require.NoError(t, err)
	logs := newLogWatch()
	waiter := newLocker(t, app, &leasetable.Config{Logger: logs.logger()})
	waiting := logs.next("waiting for lease")
	got := acquireAsync(waiter, "handover", time.Minute)
	waitFor(t, waiting, "the waiter to wait")
	require.NoError(t, held.Release(ctx))
	r := <-got
	require.NoError(t, r.err)
	require.NoError(t, r.l.Release(ctx))

	// Do, and the watchdog's renewals.
	err = k.Do(ctx, "renewed", nil, func(ctx context.Context, l pgfence.Lease) error {
		first := l.Expiry()
		waitFor(t, kLogs.next("lease renewed"), "the watchdog to renew the lease")
		require.True(t, l.Expiry().After(first))
		return l.Err()
	})
	require.NoError(t, err, "the watchdog renews as the application role")

	// Prune.
	tag, err := db.Pool.Exec(ctx, "UPDATE pgfence.pgfence_leases SET expires_at = now() - interval '2 hours'")
	require.NoError(t, err)
	require.Equal(t, int64(3), tag.RowsAffected())
	n, err := k.Prune(ctx, time.Hour)
	require.NoError(t, err)
	require.Equal(t, int64(3), n)

	// Negative controls: the role cannot write the table, touch the
	// sequence or force a release itself.
	_, err = app.Exec(ctx, "INSERT INTO pgfence.pgfence_leases (name, owner, expires_at) VALUES ('forged', 'x', now() + interval '1 hour')")
	requireDenied(t, err, "INSERT")
	l, err = k.TryAcquire(ctx, "job", nil)
	require.NoError(t, err)
	_, err = app.Exec(ctx, "UPDATE pgfence.pgfence_leases SET fence = 1")
	requireDenied(t, err, "UPDATE")
	_, err = app.Exec(ctx, "DELETE FROM pgfence.pgfence_leases")
	requireDenied(t, err, "DELETE")
	_, err = app.Exec(ctx, "SELECT setval('pgfence.pgfence_leases_fence_seq', 1)")
	requireDenied(t, err, "setval")
	_, err = app.Exec(ctx, "SELECT nextval('pgfence.pgfence_leases_fence_seq')")
	requireDenied(t, err, "nextval")
	_, err = k.ForceRelease(ctx, "job", "")
	requireDenied(t, err, "ForceRelease without the operator grant")
	_, err = k.ForcedReleases(ctx, 1)
	requireDenied(t, err, "ForcedReleases without the operator grant")
	info, ok, err = other.Get(ctx, "job")
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, l.Token(), info.Token, "the lease is untouched")
	require.NoError(t, l.Release(ctx))
}

// The operator's grant adds ForceRelease and its audit trail, recorded
// under the operator's own role.
func TestOperatorRole(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.NewDB(t)
	ops, role := newRolePool(t, db, true)
	holder := newLocker(t, db.Pool, nil)
	operator := newLocker(t, ops, nil)

	l, err := holder.TryAcquire(ctx, "stuck", nil)
	require.NoError(t, err)
	r, err := operator.ForceRelease(ctx, "stuck", "operator test")
	require.NoError(t, err)
	require.True(t, r.WasHeld)
	require.ErrorIs(t, l.Renew(ctx), pgfence.ErrLeaseLost)
	audit, err := operator.ForcedReleases(ctx, 1)
	require.NoError(t, err)
	require.Len(t, audit, 1)
	require.Equal(t, role, audit[0].ReleasedBy)

	// Still no direct write.
	_, err = ops.Exec(ctx, "UPDATE pgfence.pgfence_leases SET fence = 1")
	requireDenied(t, err, "UPDATE as the operator")
	_, err = ops.Exec(ctx, "DELETE FROM pgfence.pgfence_forced_releases")
	requireDenied(t, err, "DELETE from the audit trail")
}
