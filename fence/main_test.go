package fence_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence"
	"github.com/pgfence/pgfence/internal/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// accountsDDL is a protected table as a user would create it: a guard
// column and the pgfence_guard trigger.
const accountsDDL = `
CREATE TABLE accounts (
    id          int    PRIMARY KEY,
    balance     bigint NOT NULL,
    fence_token bigint NOT NULL DEFAULT 0
);
CREATE TRIGGER accounts_fence
    BEFORE UPDATE OR DELETE ON accounts
    FOR EACH ROW EXECUTE FUNCTION pgfence.pgfence_guard('fence_token');`

type testBundle struct {
	db   *pgtest.DB
	pool *pgxpool.Pool
	// schema is the schema pgfence is installed in.
	schema string
}

// setup returns a fresh database with the accounts table.
func setup(t *testing.T) *testBundle {
	t.Helper()
	db := pgtest.NewDB(t)
	ctx := context.Background()
	_, err := db.Pool.Exec(ctx, accountsDDL)
	require.NoError(t, err)
	schema, err := pgfenceSchema(ctx, db.Pool)
	require.NoError(t, err)
	return &testBundle{db: db, pool: db.Pool, schema: schema}
}

// pgfenceSchema returns the schema pgfence is installed in: the test
// template installs it in pgfence.DefaultSchema.
func pgfenceSchema(context.Context, pgfence.DB) (string, error) {
	return pgfence.DefaultSchema, nil
}

// fn is the qualified name of pgfence's function name, for test SQL.
func (b *testBundle) fn(name string) string { return pgx.Identifier{b.schema, name}.Sanitize() }

// exec runs SQL that must succeed.
func (b *testBundle) exec(t *testing.T, sql string, args ...any) {
	t.Helper()
	_, err := b.pool.Exec(context.Background(), sql, args...)
	require.NoError(t, err)
}

// account inserts an account row carrying token.
func (b *testBundle) account(t *testing.T, id int, balance, token int64) {
	t.Helper()
	b.exec(t, "INSERT INTO accounts (id, balance, fence_token) VALUES ($1, $2, $3)", id, balance, token)
}

// row returns an account's balance and token.
func (b *testBundle) row(t *testing.T, id int) (balance, token int64) {
	t.Helper()
	require.NoError(t, b.pool.QueryRow(context.Background(),
		"SELECT balance, fence_token FROM accounts WHERE id = $1", id).Scan(&balance, &token))
	return balance, token
}

// nextToken draws a fencing token the way the lock strategies do.
func (b *testBundle) nextToken(t *testing.T) int64 {
	t.Helper()
	var tok int64
	require.NoError(t, b.pool.QueryRow(context.Background(), "SELECT "+b.fn("pgfence_next_token")+"()").Scan(&tok))
	return tok
}

// acquireLease writes the pgfence_leases row for name as the lease table
// strategy would on acquisition or takeover (a new token, and the SHA-256 of
// a new secret), and returns the holder's token and secret.
func (b *testBundle) acquireLease(t *testing.T, name, owner string) (int64, pgfence.Secret) {
	t.Helper()
	var tok int64
	sec := owner + "-secret-" + name
	require.NoError(t, b.pool.QueryRow(context.Background(), b.acquireLeaseSQL(), name, owner, sec).Scan(&tok))
	return tok, pgfence.NewSecret(sec)
}

// acquireLeaseSQL takes the lease for one minute, whoever held it, for
// name $1, owner $2 and secret $3.
func (b *testBundle) acquireLeaseSQL() string {
	return fmt.Sprintf(`
INSERT INTO %[1]s (name, owner, fence, expires_at, secret_hash)
VALUES ($1, $2, %[2]s(), now() + interval '1 minute', sha256(convert_to($3, 'UTF8')))
ON CONFLICT (name) DO UPDATE
SET owner = excluded.owner, fence = excluded.fence, acquired_at = now(), expires_at = excluded.expires_at,
    secret_hash = excluded.secret_hash
RETURNING fence`, b.fn("pgfence_leases"), b.fn("pgfence_next_token"))
}

// testSecret is a Secret for statements that are only rendered.
var testSecret = pgfence.NewSecret("test-secret")

// waitForLockWait returns once a backend running a query that contains
// marker waits for a lock. It polls pg_stat_activity: the only signal
// PostgreSQL gives that a statement is blocked.
func (b *testBundle) waitForLockWait(t *testing.T, marker string) {
	t.Helper()
	ctx := context.Background()
	for i := 0; ; i++ {
		var waiting bool
		require.NoError(t, b.pool.QueryRow(ctx, `SELECT EXISTS (
			SELECT FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock'
			  AND query LIKE '%' || $1 || '%' AND pid <> pg_backend_pid())`, marker).Scan(&waiting))
		if waiting {
			return
		}
		require.Less(t, i, 100000, fmt.Sprintf("no backend running %q started waiting for a lock", marker))
		_, err := b.pool.Exec(ctx, "SELECT pg_sleep(0.005)")
		require.NoError(t, err)
	}
}

// exampleDatabase gives an example a database of its own, with pgfence's
// migrations applied, as a URL (what a program gets from its
// configuration), and a function that drops it.
func exampleDatabase() (url string, drop func()) {
	db, drop := pgtest.ExampleDB()
	db.Pool.Close()
	return db.URL, drop
}
