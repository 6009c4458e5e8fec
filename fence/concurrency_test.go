package fence_test

import (
	"context"
	"errors"
	"math/rand/v2"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence"
	"github.com/pgfence/pgfence/fence"
)

// historyDDL records every write that lands on accounts, so the test can
// check that no stale write landed and that every reported success did.
const historyDDL = `
CREATE TABLE history (id int NOT NULL, old_token bigint NOT NULL, new_token bigint NOT NULL);
CREATE FUNCTION record_history() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO history VALUES (NEW.id, OLD.fence_token, NEW.fence_token);
    RETURN NEW;
END $$;
CREATE TRIGGER accounts_history AFTER UPDATE ON accounts
    FOR EACH ROW EXECUTE FUNCTION record_history();`

func TestConcurrentHoldersNoStaleWriteLands(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	b.exec(t, historyDDL)
	// Without the trigger: the builder alone must fence.
	b.exec(t, "DROP TRIGGER accounts_fence ON accounts")
	const accounts, holders, writes = 4, 8, 15
	for id := 1; id <= accounts; id++ {
		b.account(t, id, 0, 0)
	}
	type result struct {
		id    int
		token int64
		err   error
	}
	results := make(chan result, holders*writes)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for h := 0; h < holders; h++ {
		wg.Add(1)
		go func(seed uint64) {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(seed, 1))
			<-start
			for i := 0; i < writes; i++ {
				var tok int64
				if err := b.pool.QueryRow(ctx, "SELECT "+b.fn("pgfence_next_token")+"()").Scan(&tok); err != nil {
					results <- result{err: err}
					return
				}
				id := 1 + rng.IntN(accounts)
				_, err := fence.Update("accounts").Set("balance = balance + 1").Where("id = $1").
					Exec(ctx, b.pool, tok, id)
				results <- result{id: id, token: tok, err: err}
			}
		}(uint64(h))
	}
	close(start)
	wg.Wait()
	close(results)

	ok := map[int]map[int64]bool{}
	maxTried := map[int]int64{}
	var wins, fenced int
	for r := range results {
		if r.err != nil && !errors.Is(r.err, pgfence.ErrFenced) {
			require.NoError(t, r.err)
		}
		maxTried[r.id] = max(maxTried[r.id], r.token)
		if ok[r.id] == nil {
			ok[r.id] = map[int64]bool{}
		}
		if r.err == nil {
			wins++
			ok[r.id][r.token] = true
			continue
		}
		fenced++
		var se *fence.StaleTokenError
		require.ErrorAs(t, r.err, &se)
		require.Greater(t, se.Current, r.token, "a stale report must name a newer token")
	}
	t.Logf("%d writes landed, %d fenced", wins, fenced)

	rows, err := b.pool.Query(ctx, "SELECT id, old_token, new_token FROM history")
	require.NoError(t, err)
	landed, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) ([3]int64, error) {
		var v [3]int64
		return v, r.Scan(&v[0], &v[1], &v[2])
	})
	require.NoError(t, err)
	require.Len(t, landed, wins, "every reported success landed, and nothing else")
	for _, h := range landed {
		require.LessOrEqual(t, h[1], h[2], "a write moved account %d's token backwards", h[0])
		require.True(t, ok[int(h[0])][h[2]], "write with token %d landed on %d but was not reported", h[2], h[0])
	}
	for id := 1; id <= accounts; id++ {
		bal, tok := b.row(t, id)
		require.Equal(t, int64(len(ok[id])), bal)
		require.Equal(t, maxTried[id], tok, "account %d must carry the newest token tried on it", id)
	}
}

// blockedBehind starts stmt in a goroutine while tx holds the row, waits
// until it is blocked on tx's lock, then runs finish (commit or rollback)
// and returns the blocked statement's error.
func blockedBehind(t *testing.T, b *testBundle, marker string, run func() error, finish func() error) error {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- run() }()
	b.waitForLockWait(t, marker)
	require.NoError(t, finish())
	return <-done
}

func TestConcurrentNewerWriteCommittedWhileWaiting(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	first, a, newer := b.nextToken(t), b.nextToken(t), b.nextToken(t)
	b.account(t, 1, 100, first)

	tx, err := b.pool.Begin(ctx)
	require.NoError(t, err)
	t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
	_, err = addBalance.Exec(ctx, tx, newer, 1000, 1)
	require.NoError(t, err)

	// A's snapshot still shows the row with the old token; the statement
	// must report the newer one it finds after waiting, not success.
	stmt := fence.Update("accounts").Set("balance = balance + $1").Where("id = $2 AND 'holder_a_update' <> ''")
	err = blockedBehind(t, b, "holder_a_update",
		func() error { _, err := stmt.Exec(ctx, b.pool, a, 5, 1); return err },
		func() error { return tx.Commit(ctx) })
	var se *fence.StaleTokenError
	require.ErrorAs(t, err, &se)
	require.Equal(t, newer, se.Current)
	bal, tok := b.row(t, 1)
	require.Equal(t, int64(1100), bal)
	require.Equal(t, newer, tok)
}

func TestConcurrentOlderWriteCommittedWhileWaiting(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	older, newer := b.nextToken(t), b.nextToken(t)
	b.account(t, 1, 100, 0)

	tx, err := b.pool.Begin(ctx)
	require.NoError(t, err)
	t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
	_, err = addBalance.Exec(ctx, tx, older, 1000, 1)
	require.NoError(t, err)

	stmt := fence.Update("accounts").Set("balance = balance + $1").Where("id = $2 AND 'holder_b_update' <> ''")
	err = blockedBehind(t, b, "holder_b_update",
		func() error { _, err := stmt.Exec(ctx, b.pool, newer, 5, 1); return err },
		func() error { return tx.Commit(ctx) })
	require.NoError(t, err)
	bal, tok := b.row(t, 1)
	require.Equal(t, int64(1105), bal, "the newer write applies on top of the committed one")
	require.Equal(t, newer, tok)
}

func TestConcurrentDeleteWhileWaitingIsNoRows(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	first, a := b.nextToken(t), b.nextToken(t)
	b.account(t, 1, 100, first)

	tx, err := b.pool.Begin(ctx)
	require.NoError(t, err)
	t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
	_, err = tx.Exec(ctx, "DELETE FROM accounts WHERE id = 1")
	require.NoError(t, err)

	stmt := fence.Update("accounts").Set("balance = balance + $1").Where("id = $2 AND 'holder_a_gone' <> ''")
	err = blockedBehind(t, b, "holder_a_gone",
		func() error { _, err := stmt.Exec(ctx, b.pool, a, 5, 1); return err },
		func() error { return tx.Commit(ctx) })
	require.ErrorIs(t, err, pgx.ErrNoRows)
}

func TestConcurrentRollbackWhileWaitingWrites(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	a, newer := b.nextToken(t), b.nextToken(t)
	b.account(t, 1, 100, 0)

	tx, err := b.pool.Begin(ctx)
	require.NoError(t, err)
	t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
	_, err = addBalance.Exec(ctx, tx, newer, 1000, 1)
	require.NoError(t, err)

	stmt := fence.Update("accounts").Set("balance = balance + $1").Where("id = $2 AND 'holder_a_rb' <> ''")
	err = blockedBehind(t, b, "holder_a_rb",
		func() error { _, err := stmt.Exec(ctx, b.pool, a, 5, 1); return err },
		func() error { return tx.Rollback(ctx) })
	require.NoError(t, err)
	bal, tok := b.row(t, 1)
	require.Equal(t, int64(105), bal)
	require.Equal(t, a, tok)
}

func TestRepeatableReadReportsSerializationFailure(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	a, newer := b.nextToken(t), b.nextToken(t)
	b.account(t, 1, 100, 0)

	tx, err := b.pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead})
	require.NoError(t, err)
	t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
	var n int
	require.NoError(t, tx.QueryRow(ctx, "SELECT count(*) FROM accounts").Scan(&n)) // takes the snapshot

	_, err = addBalance.Exec(ctx, b.pool, newer, 1000, 1)
	require.NoError(t, err)

	_, err = addBalance.Exec(ctx, tx, a, 5, 1)
	var pgErr *pgconn.PgError
	require.ErrorAs(t, err, &pgErr)
	require.Equal(t, "40001", pgErr.Code)
	require.NotErrorIs(t, err, pgfence.ErrFenced)
}

// The race a write-first statement would lose: several rows match, a newer
// holder has written the last of them (not yet committed) when the stale
// holder's statement starts, and commits while it waits. The statement must
// write none of the rows, not the ones the newer holder did not touch.
func TestConcurrentNewerWriteOnOneOfSeveralRowsIsAllOrNothing(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	first, a, newer := b.nextToken(t), b.nextToken(t), b.nextToken(t)
	for id := 1; id <= 3; id++ {
		b.account(t, id, 100, first)
	}

	tx, err := b.pool.Begin(ctx)
	require.NoError(t, err)
	t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
	_, err = addBalance.Exec(ctx, tx, newer, 1000, 3)
	require.NoError(t, err)

	stmt := fence.Update("accounts").Set("balance = balance + $1").Where("id = ANY($2) AND 'holder_a_several' <> ''")
	err = blockedBehind(t, b, "holder_a_several",
		func() error { _, err := stmt.Exec(ctx, b.pool, a, 5, []int32{1, 2, 3}); return err },
		func() error { return tx.Commit(ctx) })
	var se *fence.StaleTokenError
	require.ErrorAs(t, err, &se)
	require.Equal(t, newer, se.Current)
	for id := 1; id <= 2; id++ {
		bal, tok := b.row(t, id)
		require.Equal(t, int64(100), bal, "row %d must be unchanged", id)
		require.Equal(t, first, tok)
	}
	bal, tok := b.row(t, 3)
	require.Equal(t, int64(1100), bal)
	require.Equal(t, newer, tok)
}

// A guarded write of a single row locks nothing before writing it, so on
// success its only row-level lock is the UPDATE's own: a concurrent
// FOR KEY SHARE lock of the row (which conflicts with FOR UPDATE, not with a
// non-key UPDATE) is not blocked. The negative control shows that a row
// locked FOR UPDATE, as the rows of a statement matching several rows are,
// does block it.
func TestSingleRowWriteTakesNoRowLockFirst(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	tok := b.nextToken(t)
	b.account(t, 1, 100, 0)
	b.account(t, 2, 100, 0)

	keyShare := func(t *testing.T, where string) error {
		t.Helper()
		conn, err := b.pool.Acquire(ctx)
		require.NoError(t, err)
		defer conn.Release()
		_, err = conn.Exec(ctx, "SET lock_timeout = '50ms'")
		require.NoError(t, err)
		_, err = conn.Exec(ctx, "SELECT FROM accounts WHERE "+where+" FOR KEY SHARE")
		_, rerr := conn.Exec(ctx, "RESET lock_timeout")
		require.NoError(t, rerr)
		return err
	}

	tx, err := b.pool.Begin(ctx)
	require.NoError(t, err)
	t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
	_, err = addBalance.Exec(ctx, tx, tok, 1, 1)
	require.NoError(t, err)
	require.NoError(t, keyShare(t, "id = 1"), "the single-row write must not hold a FOR UPDATE lock")

	_, err = fence.Update("accounts").Set("balance = balance + $1").Where("id = ANY($2)").
		Exec(ctx, tx, tok, 1, []int32{1, 2})
	require.NoError(t, err)
	err = keyShare(t, "id = 2")
	var pgErr *pgconn.PgError
	require.ErrorAs(t, err, &pgErr, "rows of a several-row write are locked FOR UPDATE")
	require.Equal(t, "55P03", pgErr.Code)
}
