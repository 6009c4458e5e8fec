package leasetable_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/leasetable"
)

// TestPermissionErrorsNameTheGrant: a role missing part of pgfence's grant
// gets errors that say to run pgfence grant and what is missing, with
// PostgreSQL's error still reachable. Control: with the whole grant the
// same calls succeed.
func TestPermissionErrorsNameTheGrant(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.NewDB(t)
	app, role := newRolePool(t, db, false)
	k, err := leasetable.New(ctx, app, nil) // control: the whole grant
	require.NoError(t, err)
	l, err := k.TryAcquire(ctx, "granted", nil)
	require.NoError(t, err)
	require.NoError(t, l.Release(ctx))
	k.Close()

	requireHint := func(err error, missing string) {
		t.Helper()
		var pgErr *pgconn.PgError
		require.ErrorAs(t, err, &pgErr)
		require.Equal(t, "42501", pgErr.Code)
		require.ErrorContains(t, err, "run `pgfence grant ")
		require.ErrorContains(t, err, missing)
	}
	id := pgx.Identifier{role}.Sanitize()
	_, err = db.Pool.Exec(ctx, "REVOKE EXECUTE ON FUNCTION pgfence.pgfence_acquire(text[], text, bigint[]) FROM "+id)
	require.NoError(t, err)
	k, err = leasetable.New(ctx, app, nil)
	require.NoError(t, err)
	_, err = k.TryAcquire(ctx, "denied", nil)
	requireHint(err, "pgfence_acquire")
	k.Close()

	_, err = db.Pool.Exec(ctx, "REVOKE SELECT ON pgfence.pgfence_notify_key FROM "+id)
	require.NoError(t, err)
	_, err = leasetable.New(ctx, app, nil)
	requireHint(err, "pgfence_notify_key")
}
