package leasetable_test

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence"
	"github.com/pgfence/pgfence/fence"
	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/leasetable"
)

// ageLeases moves the expiry of the named rows to age before the database's
// now(), as if their leases had ended that long ago.
func ageLeases(t *testing.T, db *pgtest.DB, age string, names ...string) {
	t.Helper()
	tag, err := db.Pool.Exec(context.Background(),
		"UPDATE pgfence.pgfence_leases SET expires_at = now() - $1::interval WHERE name = ANY($2)", age, names)
	require.NoError(t, err)
	require.Equal(t, int64(len(names)), tag.RowsAffected())
}

// leaseNames returns the names of every row in the table, in order.
func leaseNames(t *testing.T, db *pgtest.DB) []string {
	t.Helper()
	var names []string
	require.NoError(t, db.Pool.QueryRow(context.Background(),
		"SELECT coalesce(array_agg(name ORDER BY name), '{}') FROM pgfence.pgfence_leases").Scan(&names))
	return names
}

// rowToken returns the token in the row of name, and whether there is one.
func rowToken(t *testing.T, db *pgtest.DB, name string) (int64, bool) {
	t.Helper()
	var token int64
	err := db.Pool.QueryRow(context.Background(), "SELECT fence FROM pgfence.pgfence_leases WHERE name = $1", name).Scan(&token)
	if err != nil {
		require.ErrorContains(t, err, "no rows")
		return 0, false
	}
	return token, true
}

// insertOldRows inserts n rows named p:00001... whose leases ended two hours
// ago, except every thousandth, which is held for an hour. It returns how
// many are old.
func insertOldRows(t *testing.T, db *pgtest.DB, n int) int {
	t.Helper()
	_, err := db.Pool.Exec(context.Background(), `
		INSERT INTO pgfence.pgfence_leases (name, owner, expires_at)
		SELECT format('p:%s', lpad(i::text, 5, '0')), 'bulk',
		       CASE WHEN i % 1000 = 0 THEN now() + interval '1 hour' ELSE now() - interval '2 hours' END
		FROM generate_series(1, $1::int) AS i`, n)
	require.NoError(t, err)
	return n - n/1000
}

// onLog is a slog handler that calls fn for every record.
type onLog func(slog.Record)

func (h onLog) Enabled(context.Context, slog.Level) bool      { return true }
func (h onLog) WithAttrs([]slog.Attr) slog.Handler            { return h }
func (h onLog) WithGroup(string) slog.Handler                 { return h }
func (h onLog) Handle(_ context.Context, r slog.Record) error { h(r); return nil }

func TestPruneDeletesOnlyLongExpiredRows(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.NewDB(t)
	k := newLocker(t, db.Pool, nil)
	take := func(name string, opts *leasetable.AcquireOpts) pgfence.Lease {
		t.Helper()
		l, err := k.TryAcquire(ctx, name, opts)
		require.NoError(t, err)
		return l
	}
	held := take("held", nil)
	require.NoError(t, take("released-now", nil).Release(ctx))
	require.NoError(t, take("released-recently", nil).Release(ctx))
	ageLeases(t, db, "30 minutes", "released-recently")
	require.NoError(t, take("at-least", &leasetable.AcquireOpts{AtLeast: 2 * time.Hour}).Release(ctx)) // still held after release
	for _, name := range []string{"released-long-ago", "released-a-month-ago", "holder-crashed"} {
		require.NoError(t, take(name, nil).Release(ctx))
	}
	ageLeases(t, db, "61 minutes", "released-long-ago")
	ageLeases(t, db, "30 days", "released-a-month-ago")
	ageLeases(t, db, "2 hours", "holder-crashed")

	n, err := k.Prune(ctx, time.Hour)
	require.NoError(t, err)
	require.Equal(t, int64(3), n)
	require.Equal(t, []string{"at-least", "held", "released-now", "released-recently"}, leaseNames(t, db))

	n, err = k.Prune(ctx, time.Hour)
	require.NoError(t, err)
	require.Zero(t, n, "nothing left to prune")

	// The held lease is untouched: it is still renewed and released normally.
	info, ok, err := k.Get(ctx, "held")
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, held.Token(), info.Token)
	require.NoError(t, held.Err())
	require.NoError(t, held.Release(ctx))

	// A shorter age reaches the rows the longer one spared.
	n, err = k.Prune(ctx, 20*time.Minute)
	require.NoError(t, err)
	require.Equal(t, int64(1), n)
	require.Equal(t, []string{"at-least", "held", "released-now"}, leaseNames(t, db))
}

func TestPruneWorksInBatches(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.NewDB(t)
	old := insertOldRows(t, db, 12345)
	batches := 0
	k := newLocker(t, db.Pool, &leasetable.Config{Logger: slog.New(onLog(func(r slog.Record) {
		if strings.Contains(r.Message, "pruned a batch") {
			batches++ // Prune logs from its own goroutine: no race
		}
	}))})

	n, err := k.Prune(ctx, time.Hour)
	require.NoError(t, err)
	require.Equal(t, int64(old), n)
	require.Greater(t, batches, 1, "12345 rows are pruned in several statements")
	require.Equal(t, 12345-old, countRows(t, db))
	var expired int
	require.NoError(t, db.Pool.QueryRow(ctx, "SELECT count(*) FROM pgfence.pgfence_leases WHERE expires_at <= now()").Scan(&expired))
	require.Zero(t, expired, "only held rows are left")
}

func TestPruneStopsWhenContextEnds(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDB(t)
	old := insertOldRows(t, db, 12345)

	// Ended before the call: nothing is deleted.
	k := newLocker(t, db.Pool, nil)
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	n, err := k.Prune(cancelled, time.Hour)
	require.ErrorIs(t, err, context.Canceled)
	require.Zero(t, n)
	require.Equal(t, 12345, countRows(t, db))

	// Ended after the first batch: Prune stops before the next one and
	// reports what the first one deleted.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	k = newLocker(t, db.Pool, &leasetable.Config{Logger: slog.New(onLog(func(r slog.Record) {
		if strings.Contains(r.Message, "pruned a batch") {
			cancel()
		}
	}))})
	n, err = k.Prune(ctx, time.Hour)
	require.ErrorIs(t, err, context.Canceled)
	require.ErrorContains(t, err, "stopped after deleting")
	require.Positive(t, n)
	require.Less(t, n, int64(old), "negative control: a whole run deletes more")
	require.Equal(t, 12345-int(n), countRows(t, db))

	// A later call finishes the job.
	k = newLocker(t, db.Pool, nil)
	m, err := k.Prune(context.Background(), time.Hour)
	require.NoError(t, err)
	require.Equal(t, int64(old), n+m)
}

func TestPruneBadInputAndClosed(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.NewDB(t)
	k := newLocker(t, db.Pool, nil)
	l, err := k.TryAcquire(ctx, "old", nil)
	require.NoError(t, err)
	require.NoError(t, l.Release(ctx))
	ageLeases(t, db, "2 hours", "old")

	for _, age := range []time.Duration{0, -time.Hour, time.Second, leasetable.MinPruneAge - 1} {
		n, err := k.Prune(ctx, age)
		require.ErrorContains(t, err, "at least MinPruneAge (1m0s)", "age %v", age)
		require.Zero(t, n)
	}
	require.Equal(t, 1, countRows(t, db), "a rejected call deletes nothing")

	k.Close()
	n, err := k.Prune(ctx, time.Hour)
	require.ErrorIs(t, err, pgfence.ErrClosed)
	require.Zero(t, n)
	require.Equal(t, 1, countRows(t, db))

	n, err = newLocker(t, db.Pool, nil).Prune(ctx, leasetable.MinPruneAge)
	require.NoError(t, err)
	require.Equal(t, int64(1), n, "MinPruneAge itself is accepted")
}

// TestPruneWaitsForTransactionsWritingTheTable plays the race that deleting
// rows opens: an acquirer draws its token, another acquires and releases the
// name with a newer token, the row is deleted, and the first acquirer
// inserts its older token. Deleting by hand lets that happen (the negative
// control); Prune waits for the acquirer first.
func TestPruneWaitsForTransactionsWritingTheTable(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.NewDB(t)
	logs := newLogWatch()
	k := newLocker(t, db.Pool, &leasetable.Config{Logger: logs.logger()})

	// The slow acquirer: like an acquire statement, it holds the table's
	// write lock from before it draws its token until it commits.
	slow, err := db.Pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = slow.Rollback(ctx) }()
	_, err = slow.Exec(ctx, "LOCK TABLE pgfence.pgfence_leases IN ROW EXCLUSIVE MODE")
	require.NoError(t, err)
	var slowToken int64
	require.NoError(t, slow.QueryRow(ctx, "SELECT pgfence.pgfence_next_token()").Scan(&slowToken))

	tokens := map[string]int64{}
	for _, name := range []string{"by-hand", "pruned"} {
		l, err := k.TryAcquire(ctx, name, nil)
		require.NoError(t, err)
		require.Greater(t, l.Token(), slowToken)
		tokens[name] = l.Token()
		require.NoError(t, l.Release(ctx))
	}
	ageLeases(t, db, "2 hours", "by-hand", "pruned")
	_, err = db.Pool.Exec(ctx, "DELETE FROM pgfence.pgfence_leases WHERE name = 'by-hand'")
	require.NoError(t, err)

	waiting := logs.next("prune waiting")
	type result struct {
		n   int64
		err error
	}
	done := make(chan result, 1)
	go func() {
		n, err := k.Prune(ctx, time.Hour)
		done <- result{n, err}
	}()
	waitFor(t, waiting, "Prune to wait for the slow acquirer")
	_, ok := rowToken(t, db, "pruned")
	require.True(t, ok, "Prune must not delete while the slow acquirer runs")

	// The slow acquirer now inserts the names it drew its token for.
	insert := `INSERT INTO pgfence.pgfence_leases (name, owner, fence, expires_at) VALUES ($1, 'slow', $2, now() + interval '1 minute')
		ON CONFLICT (name) DO NOTHING`
	tag, err := slow.Exec(ctx, insert, "by-hand", slowToken)
	require.NoError(t, err)
	require.Equal(t, int64(1), tag.RowsAffected(), "negative control: after the delete by hand, the older token gets in")
	tag, err = slow.Exec(ctx, insert, "pruned", slowToken)
	require.NoError(t, err)
	require.Zero(t, tag.RowsAffected(), "the row Prune waited with is still there")
	require.NoError(t, slow.Commit(ctx))

	var r result
	select {
	case r = <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("Prune did not finish after the slow acquirer committed")
	}
	require.NoError(t, r.err)
	require.Equal(t, int64(1), r.n)
	token, ok := rowToken(t, db, "by-hand")
	require.True(t, ok)
	require.Less(t, token, tokens["by-hand"], "negative control: the name's token went backwards")
	_, ok = rowToken(t, db, "pruned")
	require.False(t, ok)

	l, err := k.TryAcquire(ctx, "pruned", nil)
	require.NoError(t, err)
	require.Greater(t, l.Token(), tokens["pruned"])
	require.NoError(t, l.Release(ctx))
}

func TestPruneWaitEndsWithContextOrClose(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.NewDB(t)
	insertOldRows(t, db, 10)
	writer, err := db.Pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = writer.Rollback(ctx) }()
	_, err = writer.Exec(ctx, "LOCK TABLE pgfence.pgfence_leases IN ROW EXCLUSIVE MODE")
	require.NoError(t, err)

	for _, how := range []string{"context", "close"} {
		logs := newLogWatch()
		k := newLocker(t, db.Pool, &leasetable.Config{Logger: logs.logger()})
		pctx, cancel := context.WithCancel(ctx)
		waiting := logs.next("prune waiting")
		done := make(chan error, 1)
		go func() {
			_, err := k.Prune(pctx, time.Hour)
			done <- err
		}()
		waitFor(t, waiting, "Prune to wait for the writer")
		if how == "context" {
			cancel()
		} else {
			k.Close()
		}
		select {
		case err = <-done:
		case <-time.After(30 * time.Second):
			t.Fatalf("%s: Prune kept waiting", how)
		}
		cancel()
		if how == "context" {
			require.ErrorIs(t, err, context.Canceled)
		} else {
			require.ErrorIs(t, err, pgfence.ErrClosed)
		}
		require.Equal(t, 10, countRows(t, db), "%s: nothing deleted", how)
	}
}

// TestPruneKeepsFencing: after a lost holder's row is pruned, the name is
// acquired again with a larger token, and the old holder's writes are still
// rejected, whether checked against the lease row or by token.
func TestPruneKeepsFencing(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.NewDB(t)
	_, err := db.Pool.Exec(ctx, `CREATE TABLE accounts (id int PRIMARY KEY, balance bigint NOT NULL, fence_token bigint NOT NULL DEFAULT 0);
		INSERT INTO accounts (id, balance) VALUES (42, 100)`)
	require.NoError(t, err)
	addBalance := fence.Update("accounts").Set("balance = balance + $1").Where("id = $2")
	a := newLocker(t, db.Pool, &leasetable.Config{Owner: "a"})
	b := newLocker(t, db.NewPool(t, nil), &leasetable.Config{Owner: "b"})

	la, err := a.TryAcquire(ctx, "account:42", nil)
	require.NoError(t, err)
	_, err = addBalance.UnderLease("account:42", la.(*leasetable.Lease).Secret()).Exec(ctx, db.Pool, la.Token(), 10, 42)
	require.NoError(t, err)

	// A is paused; its lease ended long ago and its row is pruned.
	ageLeases(t, db, "2 hours", "account:42")
	n, err := b.Prune(ctx, time.Hour)
	require.NoError(t, err)
	require.Equal(t, int64(1), n)

	_, err = addBalance.UnderLease("account:42", la.(*leasetable.Lease).Secret()).Exec(ctx, db.Pool, la.Token(), 1, 42)
	require.ErrorIs(t, err, pgfence.ErrLeaseLost, "no row: the lease check fails")
	_, err = addBalance.Exec(ctx, db.Pool, la.Token(), 0, 42)
	require.NoError(t, err, "negative control: token fencing alone accepts A until a newer holder writes")

	lb, err := b.TryAcquire(ctx, "account:42", nil)
	require.NoError(t, err)
	require.Greater(t, lb.Token(), la.Token())
	_, err = addBalance.UnderLease("account:42", lb.(*leasetable.Lease).Secret()).Exec(ctx, db.Pool, lb.Token(), 5, 42)
	require.NoError(t, err)

	_, err = addBalance.Exec(ctx, db.Pool, la.Token(), 1, 42)
	require.ErrorIs(t, err, pgfence.ErrFenced)
	_, err = addBalance.UnderLease("account:42", la.(*leasetable.Lease).Secret()).Exec(ctx, db.Pool, la.Token(), 1, 42)
	require.ErrorIs(t, err, pgfence.ErrLeaseLost)
	require.ErrorIs(t, la.Release(ctx), pgfence.ErrNotHeld, "A finds its lease gone")

	var balance, token int64
	require.NoError(t, db.Pool.QueryRow(ctx, "SELECT balance, fence_token FROM accounts WHERE id = 42").Scan(&balance, &token))
	require.Equal(t, int64(115), balance)
	require.Equal(t, lb.Token(), token)
	require.NoError(t, lb.Release(ctx))
}
