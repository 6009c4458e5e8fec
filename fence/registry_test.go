package fence_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence"
	"github.com/pgfence/pgfence/fence"
	"github.com/pgfence/pgfence/internal/install"
	"github.com/pgfence/pgfence/migrations"
)

// highest reads the registry's highest token for resource (0: none).
func (b *testBundle) highest(t *testing.T, resource string) int64 {
	t.Helper()
	var tok int64
	err := b.pool.QueryRow(context.Background(),
		"SELECT token FROM "+b.fn("pgfence_fence_registry")+" WHERE resource = $1", resource).Scan(&tok)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0
	}
	require.NoError(t, err)
	return tok
}

// checkCommit runs CheckResource in a transaction of its own and commits.
func (b *testBundle) checkCommit(t *testing.T, resource string, token int64) error {
	t.Helper()
	return pgx.BeginFunc(context.Background(), b.pool, func(tx pgx.Tx) error {
		return fence.CheckResource(context.Background(), tx, resource, token, nil)
	})
}

func TestCheckResource(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)

	require.NoError(t, b.checkCommit(t, "orders", 5), "a first token is accepted")
	require.NoError(t, b.checkCommit(t, "orders", 5), "and again: a holder checks many times")
	require.NoError(t, b.checkCommit(t, "orders", 9))
	require.Equal(t, int64(9), b.highest(t, "orders"))
	require.NoError(t, b.checkCommit(t, "invoices", 2), "resources are independent")

	err := b.checkCommit(t, "orders", 5)
	require.ErrorIs(t, err, pgfence.ErrFenced)
	var stale *fence.StaleTokenError
	require.ErrorAs(t, err, &stale)
	require.Equal(t, fence.StaleTokenError{Resource: "orders", Presented: 5, Current: 9, Err: stale.Err}, *stale)
	require.Equal(t, `pgfence: write rejected: stale fencing token 5 for resource "orders", which has seen 9`, err.Error())
	require.Equal(t, int64(9), b.highest(t, "orders"), "a rejection leaves the highest")

	// The same rejection from SQL, through Classify.
	_, err = b.pool.Exec(ctx, "SELECT "+b.fn("pgfence_fence_check")+"('orders', 3)")
	err = fence.Classify(err)
	require.ErrorAs(t, err, &stale)
	require.Equal(t, [2]int64{3, 9}, [2]int64{stale.Presented, stale.Current})
	require.Equal(t, `pgfence: write rejected: stale fencing token 3 for resource 'orders' (highest seen 9)`, err.Error())

	// A rollback undoes the raise.
	tx, err := b.pool.Begin(ctx)
	require.NoError(t, err)
	require.NoError(t, fence.CheckResource(ctx, tx, "orders", 20, nil))
	require.NoError(t, tx.Rollback(ctx))
	require.Equal(t, int64(9), b.highest(t, "orders"))

	// Input the registry refuses is refused before a round trip.
	for _, tc := range []struct {
		resource string
		token    int64
		msg      string
	}{
		{"", 1, "empty resource name"},
		{strings.Repeat("r", fence.MaxResourceName+1), 1, "513 bytes long"},
		{"orders", 0, "fencing token 0 is not positive"},
		{"orders", -1, "fencing token -1 is not positive"},
	} {
		err := b.checkCommit(t, tc.resource, tc.token)
		require.ErrorContains(t, err, tc.msg)
		require.NotErrorIs(t, err, pgfence.ErrFenced)
	}
	require.ErrorContains(t, fence.CheckResource(ctx, b.pool, "orders", 9, nil), "not a pool")
	require.ErrorContains(t, fence.CheckResource(ctx, nil, "orders", 9, nil), "nil transaction")
	err = pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
		return fence.CheckResource(ctx, tx, "orders", 9, &fence.ResourceOpts{Schema: "no_such_schema"})
	})
	require.ErrorContains(t, err, "no_such_schema")
	require.NoError(t, b.checkCommit(t, strings.Repeat("r", fence.MaxResourceName), 1))
}

// TestCheckResourcePrivileges: a role without the registry's grant is
// denied the check with PostgreSQL's error and a hint naming the check-only
// grant and what is missing (EXECUTE on pgfence_fence_check; USAGE on the
// schema, with --schema for another schema than pgfence). Control: after
// the grant the hint names (GrantOpts.CheckOnly), the same check passes.
func TestCheckResourcePrivileges(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	svc := b.newRole(t, "svc") // USAGE on pgfence's schema, nothing else
	pool, _ := b.poolAs(t, svc, "")
	check := func(opts *fence.ResourceOpts) error {
		return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			return fence.CheckResource(ctx, tx, "orders", 5, opts)
		})
	}
	requireHint := func(err error, cmd, missing string) {
		t.Helper()
		var pgErr *pgconn.PgError
		require.ErrorAs(t, err, &pgErr, "PostgreSQL's error stays reachable")
		var pe *install.PermissionError
		require.ErrorAs(t, err, &pe, "the library's one permission error")
		require.True(t, pe.CheckOnly)
		require.Equal(t, "42501", pgErr.Code)
		require.NotErrorIs(t, err, pgfence.ErrFenced)
		require.ErrorContains(t, err, "fence: CheckResource: ERROR: permission denied for ")
		require.ErrorContains(t, err, "hint: as pgfence's owner, run `"+cmd+"` (what a service that only checks tokens needs")
		require.ErrorContains(t, err, "(missing: "+missing+")")
	}

	requireHint(check(nil), "pgfence grant ROLE --check-only",
		`EXECUTE on function "pgfence".pgfence_fence_check(text, bigint)`)
	b.exec(t, `CREATE SCHEMA "Other Fence"`)
	requireHint(check(&fence.ResourceOpts{Schema: "Other Fence"}), "pgfence grant ROLE --check-only --schema 'Other Fence'",
		`USAGE on schema "Other Fence"`)
	b.exec(t, "REVOKE USAGE ON SCHEMA "+pgx.Identifier{b.schema}.Sanitize()+" FROM "+pgx.Identifier{svc}.Sanitize())
	requireHint(check(nil), "pgfence grant ROLE --check-only", `USAGE on schema "pgfence"`)

	for _, stmt := range migrations.GrantSQL(b.schema, svc, &migrations.GrantOpts{CheckOnly: true}) {
		b.exec(t, stmt)
	}
	require.NoError(t, check(nil), "control: the check-only grant is enough")
	require.Equal(t, int64(5), b.highest(t, "orders"))
}

// TestCheckResourceOrdersCommits: an accepted check holds the resource until
// its transaction ends. A newer token waits for an older holder's
// transaction and is accepted after it; an older token waiting on a newer
// one is rejected once the newer commits, and accepted if it rolls back.
// The control checks in a transaction of its own before writing: the newer
// holder's check and write then commit while the older holder's write is
// still open, and the older one lands last.
func TestCheckResourceOrdersCommits(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	b.account(t, 1, 0, 0)
	b.exec(t, "DROP TRIGGER accounts_fence ON accounts")

	// run checks token in a transaction of its own in a goroutine, then
	// adds token to account 1's balance and commits.
	run := func(token int64) <-chan error {
		done := make(chan error, 1)
		go func() {
			done <- pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
				if err := fence.CheckResource(ctx, tx, "accounts", token, nil); err != nil {
					return err
				}
				_, err := tx.Exec(ctx, "UPDATE accounts SET balance = balance * 100 + $1 WHERE id = 1", token)
				return err
			})
		}()
		return done
	}
	hold := func(token int64) pgx.Tx {
		tx, err := b.pool.Begin(ctx)
		require.NoError(t, err)
		t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
		require.NoError(t, fence.CheckResource(ctx, tx, "accounts", token, nil))
		_, err = tx.Exec(ctx, "UPDATE accounts SET balance = balance * 100 + $1 WHERE id = 1", token)
		require.NoError(t, err)
		return tx
	}

	older := hold(5)
	newer := run(7)
	b.waitForLockWait(t, "pgfence_fence_check")
	require.NoError(t, older.Commit(ctx))
	require.NoError(t, <-newer)
	balance, _ := b.row(t, 1)
	require.Equal(t, int64(507), balance, "5's write, then 7's")

	newerTx := hold(9)
	stale := run(8)
	b.waitForLockWait(t, "pgfence_fence_check")
	require.NoError(t, newerTx.Commit(ctx))
	require.ErrorIs(t, <-stale, pgfence.ErrFenced)
	balance, _ = b.row(t, 1)
	require.Equal(t, int64(50709), balance, "8 wrote nothing")

	rolledBack := hold(12)
	after := run(10)
	b.waitForLockWait(t, "pgfence_fence_check")
	require.NoError(t, rolledBack.Rollback(ctx))
	require.NoError(t, <-after, "12 rolled back: 10 is the highest presented")
	balance, _ = b.row(t, 1)
	require.Equal(t, int64(5070910), balance)
	require.Equal(t, int64(10), b.highest(t, "accounts"))

	// Control.
	b.exec(t, "CREATE TABLE writes (token bigint NOT NULL)")
	require.NoError(t, b.checkCommit(t, "control", 5))
	olderTx, err := b.pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = olderTx.Rollback(context.Background()) }()
	_, err = olderTx.Exec(ctx, "INSERT INTO writes VALUES (5)")
	require.NoError(t, err)
	newerDone := make(chan error, 1)
	go func() {
		if err := b.checkCommit(t, "control", 7); err != nil {
			newerDone <- err
			return
		}
		_, err := b.pool.Exec(ctx, "INSERT INTO writes VALUES (7)")
		newerDone <- err
	}()
	select {
	case err := <-newerDone:
		require.NoError(t, err, "control: the newer holder checks and writes while the older one's write is open")
	case <-time.After(time.Minute):
		t.Fatal("control: the newer holder waited for the older one")
	}
	require.NoError(t, olderTx.Commit(ctx), "control: the older holder's write commits after the newer one's")
}

// A service checks the token a lock holder sent with its request in the
// transaction that makes the request's writes: a holder whose lock passed to
// a newer one is refused.
func ExampleCheckResource() {
	databaseURL, drop := exampleDatabase() // a database with pgfence's migrations applied
	defer drop()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, databaseURL)
	must(err)
	defer conn.Close(ctx)

	write := func(token int64) error {
		return pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
			if err := fence.CheckResource(ctx, tx, "inventory", token, nil); err != nil {
				return err
			}
			// ... the request's writes, committed with the check
			return nil
		})
	}
	fmt.Println("holder 2048:", write(2048))
	err = write(1024) // an older holder, paused past its TTL, wakes up
	fmt.Println("holder 1024 fenced:", errors.Is(err, pgfence.ErrFenced))
	fmt.Println(err)
	// Output:
	// holder 2048: <nil>
	// holder 1024 fenced: true
	// pgfence: write rejected: stale fencing token 1024 for resource "inventory", which has seen 2048
}
