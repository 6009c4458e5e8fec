package fence_test

import (
	"context"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence"
	"github.com/pgfence/pgfence/fence"
)

// newRole creates a LOGIN role with no privileges, unique to the test's
// database (roles are cluster-wide), and drops it and everything it owns
// there when the test ends.
func (b *testBundle) newRole(t *testing.T, what string) string {
	t.Helper()
	name := what + "_" + b.db.Name[len(b.db.Name)-8:]
	b.exec(t, "CREATE ROLE "+pgx.Identifier{name}.Sanitize()+" LOGIN")
	// USAGE on pgfence's schema only lets the role name what is in it
	// (migrations.Grant gives it too); each test grants what it is about.
	b.exec(t, "GRANT USAGE ON SCHEMA "+pgx.Identifier{b.schema}.Sanitize()+" TO "+pgx.Identifier{name}.Sanitize())
	t.Cleanup(func() {
		ctx := context.Background()
		q := pgx.Identifier{name}.Sanitize()
		_, err := b.pool.Exec(ctx, "DROP OWNED BY "+q+"; DROP ROLE "+q)
		require.NoError(t, err)
	})
	return name
}

// notices collects the NOTICE messages a pool's connections receive.
type notices struct {
	mu   sync.Mutex
	msgs []string
}

func (n *notices) add(_ *pgconn.PgConn, notice *pgconn.Notice) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.msgs = append(n.msgs, notice.Message)
}

// take returns the messages received so far and forgets them.
func (n *notices) take() []string {
	n.mu.Lock()
	defer n.mu.Unlock()
	m := n.msgs
	n.msgs = nil
	return m
}

// poolAs opens a pool on the test database that logs in as role, with the
// given search_path (empty: the server's default), and collects notices.
func (b *testBundle) poolAs(t *testing.T, role, searchPath string) (*pgxpool.Pool, *notices) {
	t.Helper()
	n := &notices{}
	pool := b.db.NewPool(t, func(c *pgxpool.Config) {
		c.ConnConfig.User = role
		if searchPath != "" {
			c.ConnConfig.RuntimeParams["search_path"] = searchPath
		}
		c.ConnConfig.OnNotice = n.add
	})
	return pool, n
}

// hostileSQL is what a role with CREATE on public plants there: functions,
// aggregates and operators with exactly the signatures of the built-ins the
// builders' statements use, each raising a NOTICE "hostile: ..." when it
// runs and answering so that a stale write would pass (set_config sets
// nothing, <= and < are always true, count and max report nothing,
// clock_timestamp is in the distant past so every lease looks unexpired).
//
// Where resolution can pick them: PostgreSQL chooses among overloads by
// argument types first and uses the search_path only to break ties between
// identical signatures. fence's arguments are exact matches for pg_catalog's
// signatures (bigint, text and boolean, with its casts), so under a path that
// searches pg_catalog first, implicitly or explicitly, no overload can win;
// and SQL functions cannot take the type unknown of a quoted literal, which
// is how the classic overloads beat pg_catalog. They win as soon as a role's
// search_path lists a schema others can write before pg_catalog, as
// "public, pg_catalog" does: then an unqualified set_config, count, max,
// clock_timestamp or <= in a statement runs them. The builders' SQL names
// pg_catalog for every one of these, and calls pgfence's functions by their
// schema, so it runs none of them under any path.
const hostileSQL = `
CREATE FUNCTION public.set_config(text, text, boolean) RETURNS text LANGUAGE plpgsql AS $$
BEGIN RAISE NOTICE 'hostile: set_config'; RETURN $2; END $$;
CREATE FUNCTION public.clock_timestamp() RETURNS timestamptz LANGUAGE plpgsql AS $$
BEGIN RAISE NOTICE 'hostile: clock_timestamp'; RETURN '-infinity'; END $$;
CREATE FUNCTION public.hostile_true(bigint, bigint) RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN RAISE NOTICE 'hostile: comparison'; RETURN true; END $$;
CREATE OPERATOR public.<= (LEFTARG = bigint, RIGHTARG = bigint, FUNCTION = public.hostile_true);
CREATE OPERATOR public.< (LEFTARG = bigint, RIGHTARG = bigint, FUNCTION = public.hostile_true);
CREATE FUNCTION public.hostile_gt(bigint, integer) RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN RAISE NOTICE 'hostile: >'; RETURN false; END $$;
CREATE OPERATOR public.> (LEFTARG = bigint, RIGHTARG = integer, FUNCTION = public.hostile_gt);
CREATE FUNCTION public.hostile_count(bigint) RETURNS bigint LANGUAGE plpgsql AS $$
BEGIN RAISE NOTICE 'hostile: count'; RETURN 0; END $$;
CREATE AGGREGATE public.count(*) (SFUNC = public.hostile_count, STYPE = bigint, INITCOND = '0');
CREATE FUNCTION public.hostile_max(bigint, bigint) RETURNS bigint LANGUAGE plpgsql AS $$
BEGIN RAISE NOTICE 'hostile: max'; RETURN NULL; END $$;
CREATE AGGREGATE public.max(bigint) (SFUNC = public.hostile_max, STYPE = bigint);`

// TestBuildersIgnoreHostileSearchPath runs every builder as an application
// role whose search_path puts public, where a hostile role planted
// overloads of the built-ins the statements use, before pg_catalog. None of
// the overloads runs, and stale writes and expired leases are still
// rejected. The negative control runs the same calls unqualified, as the
// statements did before, and the overloads run: they accept a stale write
// and an expired lease.
func TestBuildersIgnoreHostileSearchPath(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	hostile, app := b.newRole(t, "hostile"), b.newRole(t, "app")
	q := func(role string) string { return pgx.Identifier{role}.Sanitize() }
	b.exec(t, `CREATE TABLE ledger (id int PRIMARY KEY, balance bigint NOT NULL, fence_token bigint NOT NULL DEFAULT 0);
		GRANT CREATE ON SCHEMA public TO `+q(hostile)+`;
		GRANT SELECT, INSERT, UPDATE, DELETE ON ledger TO `+q(app)+`;
		GRANT SELECT ON `+b.fn("pgfence_leases")+` TO `+q(app)+`;
		GRANT EXECUTE ON FUNCTION `+b.fn("pgfence_lease_held")+`(text, bigint, text) TO `+q(app))
	hostilePool, _ := b.poolAs(t, hostile, "")
	_, err := hostilePool.Exec(ctx, hostileSQL)
	require.NoError(t, err)
	appPool, heard := b.poolAs(t, app, "public, pg_catalog")

	stale, mid, tok := b.nextToken(t), b.nextToken(t), b.nextToken(t)
	lease, leaseSec := b.acquireLease(t, "ledger", "A")
	expired, expiredSec := b.acquireLease(t, "expired", "A")
	secrets := map[string]pgfence.Secret{"ledger": leaseSec, "expired": expiredSec}
	b.exec(t, "UPDATE "+b.fn("pgfence_leases")+" SET expires_at = now() - interval '1 second' WHERE name = 'expired'")
	// ledger has no trigger: the rejections below are the builders' own.
	b.exec(t, "INSERT INTO ledger (id, balance, fence_token) SELECT g, 0, $1 FROM generate_series(1, 4) AS g", mid)

	update := fence.Update("ledger").Set("balance = balance + $1").Where("id = $2")
	several := fence.Update("ledger").Set("balance = balance + $1").Where("id = ANY($2)")
	del := fence.Delete("ledger").Where("id = $1")
	upsert := fence.Upsert("ledger").Columns("id", "balance").Values("$1", "$2").OnConflict("id")
	forms := []struct {
		name   string
		leased bool
		write  func(lease string, token int64) error
	}{
		{"update", false, func(_ string, tk int64) error { _, err := update.Exec(ctx, appPool, tk, 1, 1); return err }},
		{"update strict", false, func(_ string, tk int64) error {
			_, err := update.Strict().Exec(ctx, appPool, tk, 1, 2)
			return err
		}},
		{"update several", false, func(_ string, tk int64) error {
			_, err := several.Exec(ctx, appPool, tk, 1, []int32{3, 4})
			return err
		}},
		{"upsert", false, func(_ string, tk int64) error { _, err := upsert.Exec(ctx, appPool, tk, 1, 7); return err }},
		{"update under lease", true, func(l string, tk int64) error {
			_, err := update.LeaseSchema(b.schema).UnderLease(l, secrets[l]).Exec(ctx, appPool, tk, 1, 1)
			return err
		}},
		{"upsert under lease", true, func(l string, tk int64) error {
			_, err := upsert.LeaseSchema(b.schema).UnderLease(l, secrets[l]).Exec(ctx, appPool, tk, 1, 7)
			return err
		}},
		{"delete under lease", true, func(l string, tk int64) error {
			_, err := del.LeaseSchema(b.schema).UnderLease(l, secrets[l]).Exec(ctx, appPool, tk, 4)
			return err
		}},
		{"delete", false, func(_ string, tk int64) error { _, err := del.Exec(ctx, appPool, tk, 2); return err }},
	}
	for _, f := range forms {
		require.ErrorIs(t, f.write("ledger", stale), pgfence.ErrFenced, "%s: a stale write is rejected", f.name)
		if f.leased {
			require.ErrorIs(t, f.write("expired", expired), pgfence.ErrLeaseLost, "%s: an expired lease is not held", f.name)
			require.NoError(t, f.write("ledger", lease), f.name)
		} else {
			require.NoError(t, f.write("", tok), f.name)
		}
		require.Empty(t, heard.take(), "%s ran a planted overload", f.name)
	}
	var rows int
	require.NoError(t, b.pool.QueryRow(ctx, "SELECT count(*) FROM ledger").Scan(&rows))
	require.Equal(t, 2, rows, "rows 2 and 4 were deleted")

	// Negative control: the same built-ins called unqualified, as the
	// statements did before, run the planted overloads.
	for _, c := range []struct{ sql, heard string }{
		{"SELECT set_config('pgfence.token', $1::bigint::text, true)", "hostile: set_config"},
		{"SELECT count(*) > 1 FROM (SELECT $1::bigint) AS r", "hostile: count"},
		{"SELECT max(x) FROM (SELECT $1::bigint AS x) AS r", "hostile: max"},
	} {
		_, err := appPool.Exec(ctx, c.sql, stale)
		require.NoError(t, err, c.sql)
		require.Contains(t, heard.take(), c.heard, c.sql)
	}
	// The old lease check, unqualified, finds the expired lease held.
	var held bool
	require.NoError(t, appPool.QueryRow(ctx, `SELECT EXISTS (SELECT FROM `+b.fn("pgfence_leases")+`
		WHERE name = $1 AND fence = $2::bigint AND expires_at > clock_timestamp())`, "expired", expired).Scan(&held))
	require.True(t, held, "negative control: the planted clock_timestamp revived an expired lease")
	require.Contains(t, heard.take(), "hostile: clock_timestamp")
	// The old guard predicate, unqualified, lets a stale holder write.
	tag, err := appPool.Exec(ctx, `UPDATE ledger SET balance = -1, fence_token = $2
		WHERE id = $1 AND fence_token <= $2`, 1, stale)
	require.NoError(t, err)
	require.Equal(t, int64(1), tag.RowsAffected(), "negative control: the planted <= accepted a stale write")
	require.Contains(t, heard.take(), "hostile: comparison")
}
