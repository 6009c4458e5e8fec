package fence_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence"
	"github.com/pgfence/pgfence/fence"
)

// requireDenied asserts err is PostgreSQL's insufficient_privilege (42501)
// on the object named object.
func requireDenied(t *testing.T, err error, object string) {
	t.Helper()
	var pgErr *pgconn.PgError
	require.ErrorAs(t, err, &pgErr)
	require.Equal(t, "42501", pgErr.Code, pgErr.Message)
	require.Contains(t, pgErr.Message, "permission denied for ")
	require.Contains(t, pgErr.Message, object)
}

// TestTriggerPrivileges checks what each role needs. The table owner needs
// EXECUTE on a trigger function to attach it (CREATE TRIGGER checks it);
// nobody needs it when the trigger fires, not even the owner. A writer needs
// nothing of pgfence for pgfence_guard, nor for pgfence_guard_strict while
// it presents the row's own token or an older one; presenting a newer one
// makes pgfence_guard_strict call pgfence_last_token, which the writer must
// be allowed to EXECUTE (with USAGE on pgfence's schema): without it, the
// write fails, it is not let through.
func TestTriggerPrivileges(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	owner, writer := b.newRole(t, "tblowner"), b.newRole(t, "writer")
	q := func(s string) string { return pgx.Identifier{s}.Sanitize() }
	// As the migrations do for every pgfence function.
	b.exec(t, "REVOKE EXECUTE ON FUNCTION "+b.fn("pgfence_guard")+"() FROM PUBLIC")
	b.exec(t, "GRANT CREATE ON SCHEMA public TO "+q(owner))
	b.exec(t, "SELECT pg_catalog.setval($1::regclass, $2)", b.fn("pgfence_leases_fence_seq"), lastValue)
	ownerPool, _ := b.poolAs(t, owner, "")
	ownerExec := func(sql string) error { _, err := ownerPool.Exec(ctx, sql); return err }
	require.NoError(t, ownerExec(`CREATE TABLE strict_t (id int PRIMARY KEY, v int NOT NULL, fence_token bigint NOT NULL);
		CREATE TABLE default_t (id int PRIMARY KEY, v int NOT NULL, fence_token bigint NOT NULL);
		INSERT INTO strict_t VALUES (1, 0, 50); INSERT INTO default_t VALUES (1, 0, 50);
		GRANT SELECT, INSERT, UPDATE, DELETE ON strict_t, default_t TO `+q(writer)))

	attach := map[string]string{
		"pgfence_guard_strict": "CREATE TRIGGER g BEFORE UPDATE OR DELETE ON strict_t FOR EACH ROW EXECUTE FUNCTION " +
			b.fn("pgfence_guard_strict") + "()",
		"pgfence_guard_truncate": "CREATE TRIGGER g_truncate BEFORE TRUNCATE ON strict_t FOR EACH STATEMENT EXECUTE FUNCTION " +
			b.fn("pgfence_guard_truncate") + "()",
		"pgfence_guard": "CREATE TRIGGER g BEFORE UPDATE OR DELETE ON default_t FOR EACH ROW EXECUTE FUNCTION " +
			b.fn("pgfence_guard") + "()",
	}
	for fn, ddl := range attach {
		requireDenied(t, ownerExec(ddl), fn)
		b.exec(t, "GRANT EXECUTE ON FUNCTION "+b.fn(fn)+"() TO "+q(owner))
		require.NoError(t, ownerExec(ddl), fn)
		b.exec(t, "REVOKE EXECUTE ON FUNCTION "+b.fn(fn)+"() FROM "+q(owner))
	}
	require.ErrorIs(t, fence.Classify(ownerExec("TRUNCATE strict_t")), pgfence.ErrFenced,
		"the trigger fires without EXECUTE on its function")

	writerPool, _ := b.poolAs(t, writer, "")
	write := func(sql string, args ...any) error {
		_, err := fence.Check(writerPool.Exec(ctx, sql, args...))
		return err
	}
	const withToken = `UPDATE %s SET v = v + 1 WHERE id = 1
		AND pg_catalog.set_config('pgfence.token', $1::pg_catalog.int8::pg_catalog.text, true) IS NOT NULL`
	for _, table := range []string{"default_t", "strict_t"} {
		require.ErrorIs(t, write("UPDATE "+table+" SET fence_token = 40 WHERE id = 1"), pgfence.ErrFenced, table)
		require.NoError(t, write(fmt.Sprintf(withToken, table), 50), table)
	}
	require.NoError(t, write("UPDATE default_t SET fence_token = 55 WHERE id = 1"))
	require.ErrorIs(t, write(fmt.Sprintf(withToken, "strict_t"), 40), pgfence.ErrFenced)

	// A newer token on the strict table: pgfence_last_token is needed.
	requireDenied(t, write("UPDATE strict_t SET fence_token = 55 WHERE id = 1"), "pgfence_last_token")
	requireDenied(t, write(fmt.Sprintf(withToken, "strict_t"), 55), "pgfence_last_token")
	b.exec(t, "GRANT EXECUTE ON FUNCTION "+b.fn("pgfence_last_token")+"() TO "+q(writer))
	require.NoError(t, write("UPDATE strict_t SET fence_token = 55 WHERE id = 1"))
	require.ErrorIs(t, write("UPDATE strict_t SET fence_token = 1061 WHERE id = 1"), pgfence.ErrFenced, "never issued")
}

// TestUnderLeasePrivileges checks that a lease-checked write needs EXECUTE
// on pgfence_lease_held and no privilege at all on pgfence_leases. The
// negative control shows why the check moved into that SECURITY DEFINER
// function: the row lock it takes (FOR SHARE) needs the UPDATE privilege,
// which an application role with SELECT on pgfence_leases lacks.
func TestUnderLeasePrivileges(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	app := b.newRole(t, "app")
	q := pgx.Identifier{app}.Sanitize()
	b.exec(t, "GRANT SELECT, UPDATE ON accounts TO "+q)
	b.account(t, 1, 100, 0)
	tok, sec := b.acquireLease(t, "ledger", "A")
	pool, _ := b.poolAs(t, app, "")
	stmt := addBalance.LeaseSchema(b.schema).UnderLease("ledger", sec)

	_, err := stmt.Exec(ctx, pool, tok, 5, 1)
	requireDenied(t, err, "pgfence_lease_held")
	require.NotErrorIs(t, err, pgfence.ErrFenced)
	b.exec(t, "GRANT EXECUTE ON FUNCTION "+b.fn("pgfence_lease_held")+"(text, bigint, text) TO "+q)
	_, err = stmt.Exec(ctx, pool, tok, 5, 1)
	require.NoError(t, err)
	bal, _ := b.row(t, 1)
	require.Equal(t, int64(105), bal)

	b.exec(t, "GRANT SELECT ON "+b.fn("pgfence_leases")+" TO "+q)
	_, err = pool.Exec(ctx, "SELECT FROM "+b.fn("pgfence_leases")+" WHERE name = 'ledger' FOR SHARE")
	requireDenied(t, err, "table pgfence_leases")
}
