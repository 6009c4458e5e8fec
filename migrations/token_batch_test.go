package migrations_test

import (
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence/internal/install"
	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/migrations"
)

// tokenStep is the token sequence's increment from migration 000010: the
// size of the block of tokens one value covers.
const tokenStep = install.TokenStep

// TestNextTokens: pgfence_next_tokens draws a token for each true position
// of its argument, in order, after every token drawn before and before
// every token drawn after, and NULL elsewhere; an empty array gives an
// empty one and NULL gives NULL. More than 65536 positions are refused
// before anything is drawn.
func TestNextTokens(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	db := pgtest.NewDB(t)
	draw := func() int64 {
		t.Helper()
		var tok int64
		require.NoError(t, db.Pool.QueryRow(ctx, "SELECT pgfence.pgfence_next_token()").Scan(&tok))
		return tok
	}
	tokens := func(wanted []*bool) []*int64 {
		t.Helper()
		var got []*int64
		require.NoError(t, db.Pool.QueryRow(ctx, "SELECT pgfence.pgfence_next_tokens($1)", wanted).Scan(&got))
		return got
	}
	yes, no := true, false

	// The sequence steps by a block (tokenStep, migration 000010): a single
	// draw takes one value; a call hands out consecutive tokens from one
	// value per block.
	before := draw()
	got := tokens([]*bool{&yes, &no, nil, &yes, &yes})
	require.Len(t, got, 5)
	require.Nil(t, got[1])
	require.Nil(t, got[2])
	require.Equal(t, before+tokenStep, *got[0])
	require.Equal(t, before+tokenStep+1, *got[3])
	require.Equal(t, before+tokenStep+2, *got[4])
	require.Equal(t, before+2*tokenStep, draw())

	require.Equal(t, []*int64{nil, nil}, tokens([]*bool{&no, &no}))
	require.Equal(t, before+3*tokenStep, draw(), "no position wanted, no token drawn")
	require.Empty(t, tokens([]*bool{}))
	require.NotNil(t, tokens([]*bool{}), "an empty array, not NULL")
	var null []*int64
	require.NoError(t, db.Pool.QueryRow(ctx, "SELECT pgfence.pgfence_next_tokens(NULL)").Scan(&null))
	require.Nil(t, null)

	require.Len(t, tokens(make([]*bool, 65536)), 65536, "the limit itself is accepted")
	var tooMany []*int64
	err := db.Pool.QueryRow(ctx, "SELECT pgfence.pgfence_next_tokens(array_fill(true, ARRAY[65537]))").Scan(&tooMany)
	requireSQLState(t, err, "22023")
	require.ErrorContains(t, err, "at most 65536")
	require.Equal(t, before+4*tokenStep, draw(), "the refused call drew nothing")

	// More than a block: a new value for each block, the tokens consecutive
	// across them, every one at or below pgfence_last_token and below the
	// next draw.
	many := make([]*bool, 2500)
	for i := range many {
		many[i] = &yes
	}
	base := before + 5*tokenStep
	got = tokens(many)
	for i, tok := range got {
		require.Equal(t, base+int64(i), *tok, "position %d", i+1)
	}
	var last int64
	require.NoError(t, db.Pool.QueryRow(ctx, "SELECT pgfence.pgfence_last_token()").Scan(&last))
	require.Equal(t, base+3*tokenStep-1, last, "the top of the last value's block")
	require.Equal(t, base+3*tokenStep, draw(), "three values drawn for 2500 tokens")
}

// TestMigration000009GrantsWhoMayDraw: 000009 grants EXECUTE on
// pgfence_next_tokens to every role that may execute pgfence_next_token,
// so that an application role granted before it draws in batches without
// a new grant; a role that may not draw one token may not draw several
// (the negative control), and PUBLIC may not.
func TestMigration000009GrantsWhoMayDraw(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	roles := newRoles(t, "drawer", "other")
	drawer, other := roles[0], roles[1]
	db := dbAt(t, 8)
	exec(t, db, "GRANT USAGE ON SCHEMA pgfence TO "+pgx.Identifier{drawer}.Sanitize()+", "+pgx.Identifier{other}.Sanitize())
	exec(t, db, "GRANT EXECUTE ON FUNCTION pgfence.pgfence_next_token() TO "+pgx.Identifier{drawer}.Sanitize())
	require.NoError(t, migrations.Up(ctx, migrations.Target{URL: db.URL}, nil))

	may := func(role string) bool {
		t.Helper()
		var ok bool
		require.NoError(t, db.Pool.QueryRow(ctx,
			"SELECT has_function_privilege($1, 'pgfence.pgfence_next_tokens(boolean[])', 'EXECUTE')", role).Scan(&ok))
		return ok
	}
	require.True(t, may(drawer))
	require.False(t, may(other), "negative control: a role that may not draw one token")
	require.False(t, may("public"))

	var got []*int64
	require.NoError(t, connAs(t, db, drawer).QueryRow(ctx, "SELECT pgfence.pgfence_next_tokens('{t}')").Scan(&got))
	require.Len(t, got, 1)
	err := connAs(t, db, other).QueryRow(ctx, "SELECT pgfence.pgfence_next_tokens('{t}')").Scan(&got)
	requireSQLState(t, err, "42501")
}

// TestMigration000009: the new function has a pinned search_path and no
// EXECUTE for PUBLIC; reverting 000009 leaves exactly what 000008 left,
// compared with an install that stopped at version 8.
func TestMigration000009(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	db := pgtest.NewDB(t)
	var (
		config []string
		public bool
	)
	require.NoError(t, db.Pool.QueryRow(ctx, `
		SELECT p.proconfig, has_function_privilege('public', p.oid, 'EXECUTE')
		FROM pg_proc p WHERE p.oid = 'pgfence.pgfence_next_tokens(boolean[])'::regprocedure`).Scan(&config, &public))
	require.Equal(t, []string{"search_path=pg_catalog, pgfence, pg_temp"}, config)
	require.False(t, public)

	requireRevertsTo(t, db, 8)
}
