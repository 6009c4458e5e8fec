package pgfence_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence"
	"github.com/pgfence/pgfence/internal/migrator"
	"github.com/pgfence/pgfence/internal/pgtest"
)

// emptyDB returns a fresh database without pgfence's migrations.
func emptyDB(t *testing.T) *pgtest.DB {
	t.Helper()
	db := pgtest.NewDB(t)
	require.NoError(t, migrator.Down(context.Background(), db.URL))
	return db
}

func tableExists(t *testing.T, db *pgtest.DB, name string) bool {
	t.Helper()
	var ok bool
	require.NoError(t, db.Pool.QueryRow(context.Background(),
		"SELECT to_regclass($1) IS NOT NULL", name).Scan(&ok))
	return ok
}

func TestMigrateTwiceIsNoOp(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := emptyDB(t)
	require.False(t, tableExists(t, db, "pgfence_leases"))

	require.NoError(t, pgfence.Migrate(ctx, db.URL))
	require.True(t, tableExists(t, db, "pgfence_leases"))
	require.NoError(t, pgfence.Migrate(ctx, db.URL))

	latest, err := migrator.Latest()
	require.NoError(t, err)
	v, dirty, err := migrator.Version(ctx, db.URL)
	require.NoError(t, err)
	require.False(t, dirty)
	require.Equal(t, latest, v)
}

func TestMigrateUsesOwnTableAndLeavesAppTableAlone(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := emptyDB(t)
	// The application's own golang-migrate table, at its own version.
	_, err := db.Pool.Exec(ctx, `CREATE TABLE schema_migrations (version bigint NOT NULL PRIMARY KEY, dirty boolean NOT NULL);
		INSERT INTO schema_migrations VALUES (42, false)`)
	require.NoError(t, err)

	require.NoError(t, pgfence.Migrate(ctx, db.URL))

	var appVersion int64
	require.NoError(t, db.Pool.QueryRow(ctx, "SELECT version FROM schema_migrations").Scan(&appVersion))
	require.Equal(t, int64(42), appVersion)
	require.True(t, tableExists(t, db, "pgfence_schema_migrations"))
}

func TestMigrateConcurrentCallers(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := emptyDB(t)
	var wg sync.WaitGroup
	errs := make([]error, 4)
	for i := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = pgfence.Migrate(ctx, db.URL)
		}()
	}
	wg.Wait()
	for _, err := range errs {
		require.NoError(t, err)
	}
	require.True(t, tableExists(t, db, "pgfence_leases"))
}

func TestMigrateDownRemovesEverything(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.NewDB(t)
	require.NoError(t, migrator.Down(ctx, db.URL))
	var objects []string
	rows, err := db.Pool.Query(ctx, `
		SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
		WHERE n.nspname = 'public' AND c.relname LIKE 'pgfence%' AND c.relname NOT LIKE 'pgfence_schema_migrations%'
		UNION ALL
		SELECT p.proname FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
		WHERE n.nspname = 'public' AND p.proname LIKE 'pgfence%'`)
	require.NoError(t, err)
	objects, err = pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.Empty(t, objects)
	v, _, err := migrator.Version(ctx, db.URL)
	require.NoError(t, err)
	require.Zero(t, v)
}

func TestMigrateBadInput(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	require.ErrorContains(t, pgfence.Migrate(ctx, ""), "empty database URL")
	require.Error(t, pgfence.Migrate(ctx, "postgres://%zz"))

	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	require.ErrorIs(t, pgfence.Migrate(cancelled, "postgres://127.0.0.1:1/x"), context.Canceled)

	short, cancel2 := context.WithTimeout(ctx, 5*time.Second)
	defer cancel2()
	require.Error(t, pgfence.Migrate(short, "postgres://postgres@127.0.0.1:1/none?sslmode=disable&connect_timeout=1"))
}

func TestNextTokenIncreases(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.NewDB(t)
	var a, b int64
	require.NoError(t, db.Pool.QueryRow(ctx, "SELECT pgfence_next_token()").Scan(&a))
	require.NoError(t, db.Pool.QueryRow(ctx, "SELECT pgfence_next_token()").Scan(&b))
	require.Greater(t, a, int64(0))
	require.Greater(t, b, a)
	var cycles bool
	require.NoError(t, db.Pool.QueryRow(ctx,
		"SELECT seqcycle FROM pg_sequence WHERE seqrelid = 'pgfence_leases_fence_seq'::regclass").Scan(&cycles))
	require.False(t, cycles, "the token sequence must never wrap")
}
