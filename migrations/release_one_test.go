package migrations_test

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence/internal/pgtest"
)

// releaseTrace runs a fixed series of releases against db's pgfence_release
// and describes, step by step, everything a caller or a waiter can observe:
// the rows returned, the commit's synchronous_commit, whether the lease is
// still held afterwards, and the notifications sent. Tokens are shown
// relative to the lease's own token, so traces of different databases
// compare equal when the function behaves the same.
func releaseTrace(t *testing.T, db *pgtest.DB) []string {
	t.Helper()
	ctx := testCtx(t)
	listen, err := pgx.Connect(ctx, db.URL)
	require.NoError(t, err)
	defer func() { _ = listen.Close(context.WithoutCancel(ctx)) }()
	_, err = listen.Exec(ctx, "LISTEN pgfence_lease_released")
	require.NoError(t, err)

	var trace []string
	acquire := func(name string, ttl time.Duration) int64 {
		t.Helper()
		rows, err := callAcquire(ctx, db.Pool, name, "one", ttl)
		require.NoError(t, err)
		require.Len(t, rows, 1)
		require.True(t, rows[0].acquired, "acquire %s", name)
		return rows[0].token
	}
	// notified collects the notifications sent since the last call, up to
	// a marker of the test's own (so no wait depends on a timeout).
	marker := 0
	notified := func() string {
		t.Helper()
		marker++
		want := fmt.Sprintf("marker-%d", marker)
		_, err := db.Pool.Exec(ctx, `SELECT pg_notify('pgfence_lease_released', $1)`, want)
		require.NoError(t, err)
		var got []string
		for {
			n, err := listen.WaitForNotification(ctx)
			require.NoError(t, err)
			if n.Payload == want {
				return strings.Join(got, ",")
			}
			got = append(got, n.Payload)
		}
	}
	// release calls pgfence_release in a transaction and records what it
	// returned, the transaction's synchronous_commit before its commit,
	// whether each name is still held after it, and the notifications.
	release := func(step string, names []string, tokens []int64, base int64, atLeast []int64, owner string) {
		t.Helper()
		tx, err := db.Pool.Begin(ctx)
		require.NoError(t, err)
		defer func() { _ = tx.Rollback(ctx) }()
		rows, err := tx.Query(ctx, `SELECT fence, durability FROM pgfence.pgfence_release($1, $2, $3, $4)`, names, tokens, atLeast, owner)
		require.NoError(t, err)
		var out []string
		for rows.Next() {
			var tok int64
			var dur *string
			require.NoError(t, rows.Scan(&tok, &dur))
			d := "NULL"
			if dur != nil {
				d = *dur
			}
			out = append(out, fmt.Sprintf("%d/%s", tok-base, d))
		}
		require.NoError(t, rows.Err())
		var sync string
		require.NoError(t, tx.QueryRow(ctx, "SELECT current_setting('synchronous_commit')").Scan(&sync))
		require.NoError(t, tx.Commit(ctx))
		var held []string
		for _, n := range names {
			var h bool
			require.NoError(t, db.Pool.QueryRow(ctx,
				`SELECT coalesce((SELECT expires_at > clock_timestamp() FROM pgfence.pgfence_leases WHERE name = $1), false)`, n).Scan(&h))
			held = append(held, fmt.Sprintf("%s=%t", n, h))
		}
		trace = append(trace, fmt.Sprintf("%s: rows [%s] synchronous_commit=%s held %v notified [%s]",
			step, strings.Join(out, " "), sync, held, notified()))
	}

	a := acquire("a", time.Minute)
	release("wrong owner", []string{"a"}, []int64{a}, a, []int64{0}, "other")
	release("wrong token", []string{"a"}, []int64{a + 1}, a, []int64{0}, "one")
	release("freed", []string{"a"}, []int64{a}, a, []int64{0}, "one")
	release("again", []string{"a"}, []int64{a}, a, []int64{0}, "one")
	a = acquire("a", time.Minute)
	release("kept by at_least", []string{"a"}, []int64{a}, a, []int64{time.Hour.Microseconds()}, "one")
	release("missing", []string{"nobody"}, []int64{1}, 0, []int64{0}, "one")
	e := acquire("e", time.Millisecond)
	require.Eventually(t, func() bool {
		var expired bool
		err := db.Pool.QueryRow(ctx, `SELECT expires_at <= clock_timestamp() FROM pgfence.pgfence_leases WHERE name = 'e'`).Scan(&expired)
		return err == nil && expired
	}, 10*time.Second, time.Millisecond)
	release("expired", []string{"e"}, []int64{e}, e, []int64{0}, "one")
	b, c := acquire("b", time.Minute), acquire("c", time.Minute)
	release("batch of two", []string{"b", "c"}, []int64{b, c}, b, []int64{0, 0}, "one")
	d := acquire("d", time.Minute)
	release("unequal arrays", []string{"d"}, []int64{d}, d, []int64{0, 0}, "one")
	release("NULL names", nil, []int64{d}, d, []int64{0}, "one")
	return trace
}

// TestMigration000011: pgfence_release's one-lease path behaves exactly as
// 000003's statement, which version 10 runs for every release: the same
// rows, durability, lease state and notifications, for a wrong owner, a
// wrong token, a freed lease, a second release, a lease kept by at_least, a
// missing name, an expired lease, a batch of two, and malformed arrays.
// Negative controls: the same comparison fails for a one-lease path that
// sends no notification, and for one that leaves the commit durable.
// Reverting 000011 leaves exactly what 000010 left, and Up restores
// version 11.
func TestMigration000011(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	latest := dbAt(t, 11) // the last version whose functions take 000003's arguments
	at10 := dbAt(t, 10)

	want := releaseTrace(t, at10)
	require.Equal(t, want, releaseTrace(t, latest))

	up, err := os.ReadFile("000011_release_one.up.sql")
	require.NoError(t, err)
	// broken installs version 11 with one line of the one-lease path
	// dropped, and returns the trace of that install.
	broken := func(line string) []string {
		t.Helper()
		require.Contains(t, string(up), line)
		db := dbAt(t, 10)
		_, err := db.Pool.Exec(ctx, "SET search_path = pgfence; "+strings.Replace(string(up), line, "", 1))
		require.NoError(t, err)
		return releaseTrace(t, db)
	}
	require.NotEqual(t, want, broken("PERFORM pg_catalog.pg_notify('pgfence_lease_released', $1[1]);"),
		"negative control: a one-lease path without its notification")
	require.NotEqual(t, want, broken("durability := pg_catalog.set_config('synchronous_commit', 'off', true);"),
		"negative control: a one-lease path that leaves the commit durable")

	requireRevertsTo(t, pgtest.NewDB(t), 10)
}
