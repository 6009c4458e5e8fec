package fence_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence"
	"github.com/pgfence/pgfence/fence"
)

// protect calls pgfence_protect on pool.
func (b *testBundle) protect(ctx context.Context, db pgfence.DB, table, column string, strict bool) error {
	_, err := db.Exec(ctx, "SELECT "+b.fn("pgfence_protect")+"($1, $2, $3)", table, column, strict)
	return err
}

// inTxOn runs fn in a transaction on db, returns its error classified, and
// rolls back.
func inTxOn(t *testing.T, db *pgxpool.Pool, fn func(tx pgx.Tx) error) error {
	t.Helper()
	ctx := context.Background()
	tx, err := db.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	return fence.Classify(fn(tx))
}

// execIn returns fn for inTxOn running sql.
func execIn(sql string, args ...any) func(pgx.Tx) error {
	return func(tx pgx.Tx) error { _, err := tx.Exec(context.Background(), sql, args...); return err }
}

// TestProtectInheritance: a strict trigger on an inheritance parent alone
// lets a tokenless write through the parent land on a child's row (the
// negative control); pgfence_protect guards the children too.
func TestProtectInheritance(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	b.exec(t, `CREATE TABLE inh (id int, v int NOT NULL DEFAULT 0, fence_token bigint NOT NULL DEFAULT 0);
		CREATE TABLE inh_child () INHERITS (inh);
		INSERT INTO inh_child (id, fence_token) VALUES (1, 5);`)
	b.exec(t, "CREATE TRIGGER by_hand BEFORE UPDATE OR DELETE ON inh FOR EACH ROW EXECUTE FUNCTION "+b.fn("pgfence_guard_strict")+"('fence_token')")
	update := "UPDATE inh SET v = v + 1 WHERE id = 1"
	require.NoError(t, inTxOn(t, b.pool, execIn(update)), "negative control: the child's row is unguarded")
	b.exec(t, "DROP TRIGGER by_hand ON inh")

	require.NoError(t, b.protect(ctx, b.pool, "inh", "fence_token", true))
	require.ErrorIs(t, inTxOn(t, b.pool, execIn(update)), pgfence.ErrNoToken)
	stale := func(tx pgx.Tx) error {
		require.NoError(t, fence.Present(ctx, tx, 4))
		_, err := tx.Exec(ctx, update)
		return err
	}
	require.ErrorIs(t, inTxOn(t, b.pool, stale), pgfence.ErrFenced)
	require.ErrorIs(t, inTxOn(t, b.pool, execIn("TRUNCATE inh_child")), pgfence.ErrFenced)
}

// TestProtectRefusesPlacement checks what pgfence_protect refuses (PF005):
// a BEFORE trigger sorting before its own that writes the guard column, a
// column that is not bigint, a view. Controls: a trigger that does not
// touch the column, and the same writer renamed to fire after.
func TestProtectRefusesPlacement(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	b.exec(t, `CREATE TABLE st (id int PRIMARY KEY, v int NOT NULL DEFAULT 0, fence_token bigint NOT NULL DEFAULT 0, t text);
		CREATE VIEW st_view AS SELECT * FROM st;
		CREATE FUNCTION stamp() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN NEW.fence_token := 999; RETURN NEW; END $$;
		CREATE FUNCTION bump() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN NEW.v := NEW.v + 1; RETURN NEW; END $$;
		CREATE TRIGGER a_bump BEFORE UPDATE ON st FOR EACH ROW EXECUTE FUNCTION bump();`)
	refused := func(err error, what string) {
		t.Helper()
		var pgErr *pgconn.PgError
		require.ErrorAs(t, err, &pgErr, what)
		require.Equal(t, "PF005", pgErr.Code, what)
	}
	require.NoError(t, b.protect(ctx, b.pool, "st", "fence_token", true), "control: a_bump does not write the column")
	b.exec(t, "CREATE TRIGGER a_stamp BEFORE UPDATE ON st FOR EACH ROW EXECUTE FUNCTION stamp()")
	err := b.protect(ctx, b.pool, "st", "fence_token", true)
	refused(err, "a_stamp fires first and writes the column")
	require.ErrorContains(t, err, "a_stamp")
	b.exec(t, "ALTER TRIGGER a_stamp ON st RENAME TO z_stamp")
	require.NoError(t, b.protect(ctx, b.pool, "st", "fence_token", true), "control: z_stamp fires after the guard")
	refused(b.protect(ctx, b.pool, "st", "t", true), "a text column")
	refused(b.protect(ctx, b.pool, "st_view", "fence_token", true), "a view")
}

// TestProtectPartitionMove: on a strict partitioned table an UPDATE moving
// a row to another partition (a DELETE and an INSERT underneath) is
// accepted when it presents its token, by Present or by raising the
// column; control: one presenting none is refused, and a stale one is
// fenced. Forging the DELETE half's note presents a token like Present
// does, no more.
func TestProtectPartitionMove(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	b.exec(t, `CREATE TABLE parted (id int, region int, v int NOT NULL DEFAULT 0, fence_token bigint NOT NULL DEFAULT 0,
			PRIMARY KEY (id, region)) PARTITION BY LIST (region);
		CREATE TABLE parted_1 PARTITION OF parted FOR VALUES IN (1);
		CREATE TABLE parted_2 PARTITION OF parted FOR VALUES IN (2);`)
	require.NoError(t, b.protect(ctx, b.pool, "parted", "fence_token", true))
	stale, old, tok := b.nextToken(t), b.nextToken(t), b.nextToken(t)
	b.exec(t, "INSERT INTO parted (id, region, fence_token) VALUES (1, 1, $1)", old)
	move := "UPDATE parted SET region = 2 WHERE id = 1"
	where := func(tx pgx.Tx) (region int, token int64) {
		require.NoError(t, tx.QueryRow(ctx, "SELECT region, fence_token FROM parted WHERE id = 1").Scan(&region, &token))
		return region, token
	}
	presenting := func(token int64, sql string, args ...any) func(pgx.Tx) error {
		return func(tx pgx.Tx) error {
			require.NoError(t, fence.Present(ctx, tx, token))
			if _, err := tx.Exec(ctx, sql, args...); err != nil {
				return err
			}
			region, got := where(tx)
			require.Equal(t, 2, region)
			require.Equal(t, token, got)
			return nil
		}
	}
	require.NoError(t, inTxOn(t, b.pool, presenting(tok, move)))
	require.NoError(t, inTxOn(t, b.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "UPDATE parted SET region = 2, fence_token = $1 WHERE id = 1", tok); err != nil {
			return err
		}
		region, got := where(tx)
		require.Equal(t, 2, region)
		require.Equal(t, tok, got)
		return nil
	}), "the token presented by raising the column")
	require.ErrorIs(t, inTxOn(t, b.pool, execIn(move)), pgfence.ErrNoToken, "control: no token")
	require.ErrorIs(t, inTxOn(t, b.pool, func(tx pgx.Tx) error {
		require.NoError(t, fence.Present(ctx, tx, stale))
		_, err := tx.Exec(ctx, move)
		return err
	}), pgfence.ErrFenced, "control: a stale token")
	require.ErrorIs(t, inTxOn(t, b.pool, execIn("TRUNCATE parted_1")), pgfence.ErrFenced, "each partition refuses TRUNCATE")

	forged := `DELETE FROM parted_1 WHERE id = 1 AND set_config('pgfence.moving', format('%s/%s/%s/%s',
		'parted_1'::regclass::oid, statement_timestamp(), md5(parted_1::text), $1::bigint), true) IS NOT NULL`
	require.ErrorIs(t, inTxOn(t, b.pool, execIn(forged, stale)), pgfence.ErrFenced, "a forged note presents a stale token")
	require.NoError(t, inTxOn(t, b.pool, execIn(forged, old)), "control: the forged note is read, as a presented token")
}

// TestMaintenanceOwnerOnly: pgfence_maintenance lets the table's owner, in
// one transaction, write without tokens (backwards too) and truncate. The
// application role is refused, and setting pgfence.maintenance by hand
// gives it nothing; controls: the owner without it, and after its
// transaction, is guarded as anyone.
func TestMaintenanceOwnerOnly(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	owner, app := b.newRole(t, "owner"), b.newRole(t, "app")
	b.exec(t, `CREATE TABLE kept (id int PRIMARY KEY, v int NOT NULL DEFAULT 0, fence_token bigint NOT NULL DEFAULT 0);
		INSERT INTO kept (id, fence_token) VALUES (1, 5);`)
	require.NoError(t, b.protect(ctx, b.pool, "kept", "fence_token", true))
	b.exec(t, "ALTER TABLE kept OWNER TO "+pgx.Identifier{owner}.Sanitize())
	b.exec(t, "GRANT SELECT, UPDATE, DELETE, TRUNCATE ON kept TO "+pgx.Identifier{app}.Sanitize())
	for _, r := range []string{owner, app} {
		b.exec(t, "GRANT EXECUTE ON FUNCTION "+b.fn("pgfence_maintenance")+"(regclass) TO "+pgx.Identifier{r}.Sanitize())
	}
	ownerPool, _ := b.poolAs(t, owner, "")
	appPool, _ := b.poolAs(t, app, "")
	maintenance := "SELECT " + b.fn("pgfence_maintenance") + "('public.kept')"
	backfill := "UPDATE kept SET v = 7, fence_token = 0"

	require.ErrorIs(t, inTxOn(t, ownerPool, execIn("UPDATE kept SET v = 7")), pgfence.ErrNoToken, "control: the owner is guarded")
	require.NoError(t, inTxOn(t, ownerPool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, maintenance); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, backfill); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, "TRUNCATE kept")
		return err
	}))
	tx, err := ownerPool.Begin(ctx)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, maintenance)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, backfill)
	require.NoError(t, err)
	require.NoError(t, tx.Commit(ctx))
	require.ErrorIs(t, inTxOn(t, ownerPool, execIn("UPDATE kept SET v = 8")), pgfence.ErrNoToken, "control: only for its transaction")

	var pgErr *pgconn.PgError
	require.ErrorAs(t, inTxOn(t, appPool, execIn(maintenance)), &pgErr)
	require.Equal(t, "42501", pgErr.Code, "the application role may not start maintenance")
	require.ErrorIs(t, inTxOn(t, appPool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "SELECT set_config('pgfence.maintenance', 'public.kept'::regclass::oid::text, true)"); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, "UPDATE kept SET v = 9")
		return err
	}), pgfence.ErrNoToken, "a forged pgfence.maintenance gives the application role nothing")
	require.ErrorIs(t, inTxOn(t, appPool, execIn("TRUNCATE kept")), pgfence.ErrFenced)
}
