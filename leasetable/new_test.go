package leasetable_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence"
	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/leasetable"
	"github.com/pgfence/pgfence/migrations"
)

// requireNotInstalled checks that New on db with cfg fails with
// ErrNotInstalled and a message containing each of want.
func requireNotInstalled(t *testing.T, db *pgtest.DB, cfg *leasetable.Config, want ...string) {
	t.Helper()
	k, err := leasetable.New(t.Context(), db.Pool, cfg)
	require.ErrorIs(t, err, pgfence.ErrNotInstalled)
	require.Nil(t, k)
	for _, w := range want {
		require.ErrorContains(t, err, w)
	}
}

// New checks that pgfence is installed where Config.Schema says, at the
// version the code needs, with a sound token sequence.
func TestNewChecksTheInstall(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("default schema", func(t *testing.T) {
		t.Parallel()
		db := pgtest.NewDB(t)
		k, err := leasetable.New(ctx, db.Pool, nil)
		require.NoError(t, err, "negative control: the test template's install passes")
		require.Equal(t, pgfence.DefaultSchema, k.Schema())
		k.Close()
		k, err = leasetable.New(ctx, db.Pool, &leasetable.Config{Schema: pgfence.DefaultSchema})
		require.NoError(t, err)
		k.Close()
	})

	t.Run("missing schema", func(t *testing.T) {
		t.Parallel()
		db := pgtest.NewDB(t)
		requireNotInstalled(t, db, &leasetable.Config{Schema: "nope"},
			`schema "nope" does not exist`, "pgfence is installed in schema pgfence")
	})

	t.Run("schema without pgfence", func(t *testing.T) {
		t.Parallel()
		db := pgtest.NewDB(t)
		requireNotInstalled(t, db, &leasetable.Config{Schema: "public"},
			`schema "public" has no pgfence_leases table`, "pgfence is installed in schema pgfence")
	})

	t.Run("installed in another schema", func(t *testing.T) {
		t.Parallel()
		db := pgtest.NewDB(t)
		_, err := db.Pool.Exec(ctx, "ALTER SCHEMA pgfence RENAME TO elsewhere")
		require.NoError(t, err)
		requireNotInstalled(t, db, nil, `schema "pgfence" does not exist`, "pgfence is installed in schema elsewhere")
		// The message's advice passes the check.
		k, err := leasetable.New(ctx, db.Pool, &leasetable.Config{Schema: "elsewhere"})
		require.NoError(t, err)
		k.Close()
	})

	t.Run("cached sequence", func(t *testing.T) {
		t.Parallel()
		db := pgtest.NewDB(t)
		_, err := db.Pool.Exec(ctx, "ALTER SEQUENCE pgfence.pgfence_leases_fence_seq CACHE 50")
		require.NoError(t, err)
		requireNotInstalled(t, db, nil, `"pgfence".pgfence_leases_fence_seq has INCREMENT 1024 CACHE 50 NO CYCLE`,
			`ALTER SEQUENCE "pgfence".pgfence_leases_fence_seq INCREMENT 1024 CACHE 1 NO CYCLE`)
		// Negative control: the fix the message gives makes it pass.
		_, err = db.Pool.Exec(ctx, `ALTER SEQUENCE "pgfence".pgfence_leases_fence_seq INCREMENT 1024 CACHE 1 NO CYCLE`)
		require.NoError(t, err)
		k, err := leasetable.New(ctx, db.Pool, nil)
		require.NoError(t, err)
		k.Close()
	})

	// The sequence steps by 1024.
	t.Run("sequence step", func(t *testing.T) {
		t.Parallel()
		db := pgtest.NewDB(t)
		_, err := db.Pool.Exec(ctx, "ALTER SEQUENCE pgfence.pgfence_leases_fence_seq INCREMENT 1")
		require.NoError(t, err)
		requireNotInstalled(t, db, nil, "has INCREMENT 1 CACHE 1 NO CYCLE; tokens are only ordered with INCREMENT 1024",
			`INCREMENT 1024 CACHE 1 NO CYCLE (as its owner)`)
		// Negative control: the fix the message gives makes it pass.
		_, err = db.Pool.Exec(ctx, "ALTER SEQUENCE pgfence.pgfence_leases_fence_seq INCREMENT 1024")
		require.NoError(t, err)
		k, err := leasetable.New(ctx, db.Pool, nil)
		require.NoError(t, err)
		k.Close()
	})

	t.Run("older version", func(t *testing.T) {
		t.Parallel()
		db := pgtest.NewDB(t)
		older := migrations.Latest() - 1
		_, err := db.Pool.Exec(ctx, fmt.Sprintf("CREATE OR REPLACE FUNCTION pgfence.pgfence_schema_version() RETURNS integer LANGUAGE sql IMMUTABLE AS 'SELECT %d'", older))
		require.NoError(t, err)
		requireNotInstalled(t, db, nil, fmt.Sprintf("schema version %d", older), "migrate up")
	})

	t.Run("context", func(t *testing.T) {
		t.Parallel()
		db := pgtest.NewDB(t)
		cancelled, cancel := context.WithCancel(ctx)
		cancel()
		_, err := leasetable.New(cancelled, db.Pool, nil)
		require.ErrorIs(t, err, context.Canceled, "ctx bounds the check")
	})
}

// TestNewGate: New refuses a standby with ErrUnsafeServer, and accepts its
// primary, warning (a Warn and a ServerWarning) of that asynchronous
// standby.
func TestNewGate(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	c, srv := pgtest.NewCluster(t, nil)
	db := srv.NewDB(t)
	sb := pgtest.NewStandby(t, c, nil)

	standby := db.NewTCPPool(t, func(pc *pgxpool.Config) { pc.ConnConfig.Port = uint16(sb.Port) })
	_, err := leasetable.New(ctx, standby, nil)
	require.ErrorIs(t, err, pgfence.ErrUnsafeServer)
	require.ErrorContains(t, err, "standby in recovery")

	logs := newLogWatch()
	logs.count("no synchronous standby")
	warned := make(chan pgfence.ServerWarning, 1)
	newLocker(t, db.Pool, &leasetable.Config{Logger: logs.logger(), Observer: pgfence.ObserverFunc(func(_ context.Context, e pgfence.Event) {
		if w, ok := e.(pgfence.ServerWarning); ok {
			warned <- w
		}
	})})
	w := <-warned
	require.Equal(t, "async_standby", w.Reason)
	require.Equal(t, pgfence.StrategyLeaseTable, w.Kind)
	require.Equal(t, 1, logs.count("no synchronous standby"))
}
