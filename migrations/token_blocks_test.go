package migrations_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/migrations"
)

// TestMigration000010: the sequence steps by tokenStep; every token handed
// out before the upgrade is below every token drawn after it, and every
// token handed out before the revert (anywhere in the last value's block)
// is below every token drawn after it; the functions keep their pinned
// search_path; reverting leaves exactly what 000009 left, compared with an
// install that stopped at version 9. The negative control steps the
// sequence back to 1 without moving it to the top of its block, as a
// revert that forgot the blocks would: the next token is one already
// handed out.
func TestMigration000010(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	target := func(db *pgtest.DB) migrations.Target { return migrations.Target{URL: db.URL} }
	one := func(db *pgtest.DB) int64 {
		t.Helper()
		var tok int64
		require.NoError(t, db.Pool.QueryRow(ctx, "SELECT pgfence.pgfence_next_token()").Scan(&tok))
		return tok
	}
	// five draws five tokens in one call and returns the greatest.
	five := func(db *pgtest.DB) int64 {
		t.Helper()
		var top int64
		require.NoError(t, db.Pool.QueryRow(ctx,
			"SELECT max(t) FROM pg_catalog.unnest(pgfence.pgfence_next_tokens('{t,t,t,t,t}')) AS t").Scan(&top))
		return top
	}
	lastToken := func(db *pgtest.DB) int64 {
		t.Helper()
		var v int64
		require.NoError(t, db.Pool.QueryRow(ctx, "SELECT pgfence.pgfence_last_token()").Scan(&v))
		return v
	}

	// Upgrade: from version 9, with tokens drawn one by one and in a call.
	db := emptyDB(t)
	require.NoError(t, migrations.UpTo(ctx, target(db), nil, 9))
	one(db)
	before := five(db)
	require.Equal(t, before, lastToken(db))
	require.NoError(t, migrations.Up(ctx, target(db), nil))
	after := one(db)
	require.Greater(t, after, before)
	require.Equal(t, before+tokenStep, after, "one step of the new increment")
	top := five(db)
	require.Equal(t, after+tokenStep+4, top, "a call's tokens are consecutive from its value")
	require.GreaterOrEqual(t, lastToken(db), top, "the strict guard's bound covers every token handed out")

	// Each function it replaced keeps exactly the pinned search_path (a
	// function left without one would count as not pinned).
	for _, fn := range []string{"pgfence_next_token()", "pgfence_next_tokens(boolean[])", "pgfence_last_token()", "pgfence_schema_version()"} {
		var config []string
		require.NoError(t, db.Pool.QueryRow(ctx, "SELECT proconfig FROM pg_proc WHERE oid = $1::regprocedure", "pgfence."+fn).Scan(&config))
		require.Equal(t, []string{"search_path=pg_catalog, pgfence, pg_temp"}, config, fn)
	}

	// Revert: the next token is above the whole block of the last value.
	require.NoError(t, migrations.DownTo(ctx, target(db), nil, 9))
	reverted := one(db)
	require.Greater(t, reverted, top)
	require.Equal(t, top-4+tokenStep, reverted, "one above the top of the last value's block")

	// Negative control: stepping back to 1 in place hands out a token of
	// the last block again.
	ctl := pgtest.NewDB(t)
	ctlTop := five(ctl)
	_, err := ctl.Pool.Exec(ctx, "ALTER SEQUENCE pgfence.pgfence_leases_fence_seq INCREMENT 1")
	require.NoError(t, err)
	var bare int64
	require.NoError(t, ctl.Pool.QueryRow(ctx, "SELECT pg_catalog.nextval('pgfence.pgfence_leases_fence_seq')").Scan(&bare))
	require.LessOrEqual(t, bare, ctlTop, "the control must reissue a token")

	requireRevertsTo(t, pgtest.NewDB(t), 9)
}
