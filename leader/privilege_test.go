package leader_test

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

	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/leader"
	"github.com/pgfence/pgfence/migrations"
)

// An application role with only pgfence's grants (migrations.Grant) runs
// an election end to end, and cannot write pgfence_leaders itself, nor
// proclaim for a term it does not hold.
func TestLeastPrivilegeRole(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	db := pgtest.NewDB(t)
	var rnd [6]byte
	_, _ = rand.Read(rnd[:])
	role := "pgfence_leader_app_" + hex.EncodeToString(rnd[:])
	ident := pgx.Identifier{role}.Sanitize()
	_, err := db.Pool.Exec(ctx, "CREATE ROLE "+ident+" LOGIN")
	require.NoError(t, err)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_, err := db.Pool.Exec(ctx, "DROP OWNED BY "+ident)
		require.NoError(t, err)
		_, err = db.Pool.Exec(ctx, "DROP ROLE "+ident)
		require.NoError(t, err)
	})
	require.NoError(t, migrations.Grant(ctx, migrations.Target{Pool: db.Pool}, role, nil, nil))
	app := db.NewPool(t, func(c *pgxpool.Config) { c.ConnConfig.User = role })

	a := newCandidate(t, app, "least", "a", nil, nil)
	o := newCandidate(t, app, "least", "observer", nil, nil)
	octx, stop := context.WithCancel(ctx)
	defer stop()
	ch := o.e.Observe(octx)
	require.False(t, next(t, ch).Leading)
	term, err := a.e.Campaign(ctx)
	require.NoError(t, err)
	info, err := o.e.Leader(ctx)
	require.NoError(t, err)
	require.Equal(t, "a", info.Value)
	list, err := leader.List(ctx, app, "")
	require.NoError(t, err)
	require.Len(t, list, 1)
	terms, err := leader.Terms(ctx, app, "")
	require.NoError(t, err)
	require.Len(t, terms, 1)

	denied := func(sql string, args ...any) {
		t.Helper()
		_, err := app.Exec(ctx, sql, args...)
		var pgErr *pgconn.PgError
		require.ErrorAs(t, err, &pgErr, sql)
		require.Equal(t, "42501", pgErr.Code, "%s: %v", sql, err)
	}
	denied("INSERT INTO pgfence.pgfence_leaders VALUES ('least', $1, 'x', 'forged', now(), now())", term.Token()+1)
	denied("UPDATE pgfence.pgfence_leaders SET value = 'forged'")
	denied("DELETE FROM pgfence.pgfence_leaders")
	// The function proclaims only for the held term with its secret: a
	// wrong token, or the owner (readable by every granted role) where the
	// secret goes, writes nothing.
	var held bool
	secret := term.Lease().Secret()
	require.NoError(t, app.QueryRow(ctx, "SELECT pgfence.pgfence_leader_proclaim('least', $1, $2, 'forged')",
		term.Token()+1, secret).Scan(&held))
	require.False(t, held)
	require.NoError(t, app.QueryRow(ctx, "SELECT pgfence.pgfence_leader_proclaim('least', $1, $2, 'forged')",
		term.Token(), a.locker.Owner()).Scan(&held))
	require.False(t, held)
	// Control: the holder's own proclamation passes.
	require.NoError(t, app.QueryRow(ctx, "SELECT pgfence.pgfence_leader_proclaim('least', $1, $2, 'a2')",
		term.Token(), secret).Scan(&held))
	require.True(t, held)
	info, err = o.e.Leader(ctx)
	require.NoError(t, err)
	require.Equal(t, "a2", info.Value)
	require.NoError(t, term.Resign(ctx))
}
