package schedule_test

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

	"github.com/pgfence/pgfence/leasetable"
	"github.com/pgfence/pgfence/migrations"
	"github.com/pgfence/pgfence/schedule"
)

// TestLeastPrivilegeRole: a role with only migrations.Grant's privileges
// runs slots, reads their history and prunes, but cannot write the slot
// table itself.
func TestLeastPrivilegeRole(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := faultDB(t)
	var rnd [6]byte
	_, _ = rand.Read(rnd[:])
	role := "pgfence_app_" + hex.EncodeToString(rnd[:])
	ident := pgx.Identifier{role}.Sanitize()
	_, err := db.Pool.Exec(ctx, "CREATE ROLE "+ident+" LOGIN")
	require.NoError(t, err)
	t.Cleanup(func() {
		_, _ = db.Pool.Exec(context.Background(), "DROP OWNED BY "+ident)
		_, _ = db.Pool.Exec(context.Background(), "DROP ROLE "+ident)
	})
	require.NoError(t, migrations.Grant(ctx, migrations.Target{Pool: db.Pool}, role, nil, nil))
	_, err = db.Pool.Exec(ctx, "GRANT INSERT ON effects TO "+ident)
	require.NoError(t, err)
	app := db.NewPool(t, func(c *pgxpool.Config) { c.ConnConfig.User = role })

	locker, err := leasetable.New(ctx, app, &leasetable.Config{Owner: "app"})
	require.NoError(t, err)
	defer locker.Close()
	r, err := schedule.New(app, &schedule.Config{Locker: locker})
	require.NoError(t, err)
	require.NoError(t, r.RunTx(ctx, "j", "s", nil, func(ctx context.Context, tx pgx.Tx, s *schedule.Slot) error {
		return insertEffect(ctx, tx, s, "app")
	}))
	require.ErrorIs(t, r.Run(ctx, "j", "s", nil, nil), schedule.ErrSlotDone)
	recs, err := r.History(ctx, "", 10)
	require.NoError(t, err)
	require.Len(t, recs, 1)
	n, err := r.Prune(ctx, 24*time.Hour)
	require.NoError(t, err)
	require.Zero(t, n)
	_, err = r.Prune(ctx, time.Hour)
	require.ErrorContains(t, err, "at least a day")

	for _, sql := range []string{
		`INSERT INTO pgfence.pgfence_slots (job, slot, state, owner, token, attempts, started_at) VALUES ('j', 't', 'done', 'x', 1, 1, now())`,
		`UPDATE pgfence.pgfence_slots SET state = 'running'`,
		`DELETE FROM pgfence.pgfence_slots`,
	} {
		_, err := app.Exec(ctx, sql)
		var pgErr *pgconn.PgError
		require.ErrorAs(t, err, &pgErr, sql)
		require.Equal(t, "42501", pgErr.Code, sql)
	}
}
