package migrations_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence/internal/pgtest"
)

// acquireRow is one row of pgfence_acquire's result; owner is empty when
// the name is busy.
type acquireRow struct {
	acquired bool
	owner    string
	token    int64
	secret   string
}

// querier is what acquireOne needs of a pool or a transaction.
type querier interface {
	Query(context.Context, string, ...any) (pgx.Rows, error)
}

// callAcquire calls pgfence_acquire for one name with the TTL ttl and
// returns its rows.
func callAcquire(ctx context.Context, q querier, name, owner string, ttl time.Duration) ([]acquireRow, error) {
	rows, err := q.Query(ctx, `SELECT acquired, coalesce(owner, ''), coalesce(fence, 0), coalesce(secret, '')
		FROM pgfence.pgfence_acquire($1, $2, $3)`, []string{name}, owner, []int64{ttl.Microseconds()})
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (acquireRow, error) {
		var a acquireRow
		err := r.Scan(&a.acquired, &a.owner, &a.token, &a.secret)
		return a, err
	})
}

// acquireOne is callAcquire with a one-minute TTL that fails t on an
// error.
func acquireOne(t *testing.T, ctx context.Context, q querier, name, owner string) []acquireRow {
	t.Helper()
	out, err := callAcquire(ctx, q, name, owner, time.Minute)
	require.NoError(t, err)
	return out
}

// TestAcquireOne: taking over a freed lease draws exactly one token, a
// refusal draws none and reports the holder, and a name another transaction
// is taking answers busy at once (no holder) instead of waiting for it.
func TestAcquireOne(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	db := pgtest.NewDB(t)
	lastValue := func() int64 {
		t.Helper()
		var v int64
		require.NoError(t, db.Pool.QueryRow(ctx, "SELECT last_value FROM pgfence.pgfence_leases_fence_seq").Scan(&v))
		return v
	}
	release := func(name string, a acquireRow) {
		t.Helper()
		var n int
		require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM pgfence.pgfence_release($1, $2, $3, '{0}')`,
			[]string{name}, []int64{a.token}, []string{a.secret}).Scan(&n))
		require.Equal(t, 1, n)
	}

	first := acquireOne(t, ctx, db.Pool, "a", "one")
	require.Len(t, first, 1)
	require.Equal(t, acquireRow{true, "one", first[0].token, first[0].secret}, first[0])
	release("a", first[0])
	before := lastValue()
	second := acquireOne(t, ctx, db.Pool, "a", "two")
	require.Len(t, second, 1)
	require.True(t, second[0].acquired)
	require.Equal(t, lastValue(), second[0].token)
	require.Equal(t, before+tokenStep, second[0].token, "the take-over drew exactly one token")

	refused := acquireOne(t, ctx, db.Pool, "a", "three")
	require.Equal(t, []acquireRow{{false, "two", second[0].token, ""}}, refused)
	require.Equal(t, second[0].token, lastValue(), "a refused attempt drew a token")

	// A taker whose transaction is still open: the late acquire is busy.
	first = acquireOne(t, ctx, db.Pool, "b", "one")
	release("b", first[0])
	taker, err := db.Pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = taker.Rollback(ctx) }()
	require.True(t, acquireOne(t, ctx, taker, "b", "taker")[0].acquired)
	late, err := db.Pool.Acquire(ctx)
	require.NoError(t, err)
	defer late.Release()
	_, err = late.Exec(ctx, "SET lock_timeout = '10s'")
	require.NoError(t, err)
	require.Equal(t, []acquireRow{{false, "", 0, ""}}, acquireOne(t, ctx, late, "b", "late"))
	_, err = late.Exec(ctx, "RESET lock_timeout")
	require.NoError(t, err)
	require.NoError(t, taker.Commit(ctx))
	require.Equal(t, "taker", acquireOne(t, ctx, db.Pool, "b", "late")[0].owner, "once committed, the taker is the holder")
}

// releaseTrace runs a fixed series of releases against db's pgfence_release
// and describes, step by step, everything a caller or a waiter can observe:
// the rows returned, the commit's synchronous_commit, whether the lease is
// still held afterwards, and the notifications sent. Tokens are shown
// relative to the lease's own token, and a notification as the name and
// token its payload announces, so traces of different databases compare
// equal when the function behaves the same.
func releaseTrace(t *testing.T, db *pgtest.DB) []string {
	t.Helper()
	ctx := testCtx(t)
	listen, err := pgx.Connect(ctx, db.URL)
	require.NoError(t, err)
	defer func() { _ = listen.Close(context.WithoutCancel(ctx)) }()
	_, err = listen.Exec(ctx, "LISTEN pgfence_lease_released")
	require.NoError(t, err)
	holdInterest(t, db, "a", "b", "c", "d", "e", "nobody") // every release is waited for

	var trace []string
	acquire := func(name string, ttl time.Duration) (int64, string) {
		t.Helper()
		rows, err := callAcquire(ctx, db.Pool, name, "one", ttl)
		require.NoError(t, err)
		require.Len(t, rows, 1)
		require.True(t, rows[0].acquired, "acquire %s", name)
		return rows[0].token, rows[0].secret
	}
	// notified collects the notifications sent since the last call, up to
	// a marker of the test's own (so no wait depends on a timeout), each
	// shown as the step's name and token whose payload it is.
	marker := 0
	notified := func(names []string, tokens []int64, base int64) string {
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
			var which string
			require.NoError(t, db.Pool.QueryRow(ctx, `SELECT coalesce((SELECT n || '@' || (k - $4)
				FROM unnest($2::text[]) AS n, unnest($3::bigint[]) AS k
				WHERE pgfence.pgfence_notify_payload(n, k) = $1 LIMIT 1), 'unknown')`,
				n.Payload, names, tokens, base).Scan(&which))
			got = append(got, which)
		}
	}
	// release calls pgfence_release in a transaction and records what it
	// returned, the transaction's synchronous_commit before its commit,
	// whether each name is still held after it, and the notifications.
	release := func(step string, names []string, tokens []int64, base int64, secrets []string, atLeast []int64) {
		t.Helper()
		tx, err := db.Pool.Begin(ctx)
		require.NoError(t, err)
		defer func() { _ = tx.Rollback(ctx) }()
		rows, err := tx.Query(ctx, `SELECT fence, durability FROM pgfence.pgfence_release($1, $2, $3, $4)`, names, tokens, secrets, atLeast)
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
			step, strings.Join(out, " "), sync, held, notified(names, tokens, base)))
	}

	a, as := acquire("a", time.Minute)
	release("wrong secret", []string{"a"}, []int64{a}, a, []string{"other"}, []int64{0})
	release("wrong token", []string{"a"}, []int64{a + 1}, a, []string{as}, []int64{0})
	release("freed", []string{"a"}, []int64{a}, a, []string{as}, []int64{0})
	release("again", []string{"a"}, []int64{a}, a, []string{as}, []int64{0})
	a, as = acquire("a", time.Minute)
	release("kept by at_least", []string{"a"}, []int64{a}, a, []string{as}, []int64{time.Hour.Microseconds()})
	release("missing", []string{"nobody"}, []int64{1}, 0, []string{"x"}, []int64{0})
	e, es := acquire("e", time.Millisecond)
	require.Eventually(t, func() bool {
		var expired bool
		err := db.Pool.QueryRow(ctx, `SELECT expires_at <= clock_timestamp() FROM pgfence.pgfence_leases WHERE name = 'e'`).Scan(&expired)
		return err == nil && expired
	}, 10*time.Second, time.Millisecond)
	release("expired", []string{"e"}, []int64{e}, e, []string{es}, []int64{0})
	b, bs := acquire("b", time.Minute)
	c, cs := acquire("c", time.Minute)
	release("batch of two", []string{"b", "c"}, []int64{b, c}, b, []string{bs, cs}, []int64{0, 0})
	d, ds := acquire("d", time.Minute)
	release("unequal arrays", []string{"d"}, []int64{d}, d, []string{ds}, []int64{0, 0})
	release("NULL names", nil, []int64{d}, d, []string{ds}, []int64{0})
	return trace
}

// releaseFn is pgfence_release's signature.
const releaseFn = "pgfence_release(text[], bigint[], text[], bigint[])"

// TestReleaseOne: pgfence_release's one-lease path behaves exactly as its
// batch statement: the same rows, durability, lease state and
// notifications, for a wrong secret, a wrong token, a freed lease, a second
// release, a lease kept by at_least, a missing name, an expired lease, a
// batch of two, and malformed arrays. The batch statement's trace comes
// from an install whose one-lease path is switched off. Negative controls:
// the comparison fails for a one-lease path that sends no notification, and
// for one that leaves the commit durable.
func TestReleaseOne(t *testing.T) {
	t.Parallel()
	batchOnly := pgtest.NewDB(t)
	weaken(t, batchOnly, edit{releaseFn, "IF pg_catalog.cardinality($1) = 1 AND", "IF false AND"})
	want := releaseTrace(t, batchOnly)
	require.Equal(t, want, releaseTrace(t, pgtest.NewDB(t)))

	broken := func(line string) []string {
		t.Helper()
		db := pgtest.NewDB(t)
		weaken(t, db, edit{releaseFn, line, ""})
		return releaseTrace(t, db)
	}
	require.NotEqual(t, want, broken("PERFORM pgfence_notify_waiters($1[1], $2[1]);"),
		"negative control: a one-lease path without its notification")
	require.NotEqual(t, want, broken("durability := pg_catalog.set_config('synchronous_commit', 'off', true);"),
		"negative control: a one-lease path that leaves the commit durable")
}
