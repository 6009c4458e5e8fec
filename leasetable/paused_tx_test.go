package leasetable_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence/fence"
	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/leasetable"
)

// TestPausedHolderInTransaction: a holder that made a lease-checked write
// in a transaction and then paused keeps the lease's row locked FOR SHARE,
// so nobody can take the lease over until that transaction ends, however
// long ago the lease expired. With idle_in_transaction_session_timeout set
// to the TTL (the recipe's setting), the server ends the paused
// transaction and another worker takes the lease while the holder is
// still paused. Negative control: without the setting the other worker is
// still waiting at three TTLs and takes the lease only once the pause ends.
func TestPausedHolderInTransaction(t *testing.T) {
	t.Parallel()
	const ttl = time.Second
	for _, tc := range []struct {
		name    string
		timeout bool
	}{{"idle_in_transaction_session_timeout", true}, {"control-no-timeout", false}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			db := pgtest.NewDB(t)
			_, err := db.Pool.Exec(ctx, `CREATE TABLE accounts (id int PRIMARY KEY, balance bigint NOT NULL, fence_token bigint NOT NULL DEFAULT 0);
				INSERT INTO accounts VALUES (42, 100, 0)`)
			require.NoError(t, err)
			holderPool := db.NewPool(t, nil)
			a := newLocker(t, holderPool, &leasetable.Config{TTL: ttl})
			b := newLocker(t, db.NewPool(t, nil), &leasetable.Config{TTL: ttl})

			la, err := a.TryAcquire(ctx, "account:42", nil)
			require.NoError(t, err)
			tx, err := holderPool.Begin(ctx)
			require.NoError(t, err)
			defer func() { _ = tx.Rollback(context.Background()) }()
			if tc.timeout {
				_, err = tx.Exec(ctx, "SET LOCAL idle_in_transaction_session_timeout = '1s'")
				require.NoError(t, err)
			}
			_, err = fence.Update("accounts").Set("balance = balance + 10").Where("id = 42").
				UnderLease("account:42", la.(*leasetable.Lease).Secret()).Exec(ctx, tx, la.Token())
			require.NoError(t, err)
			paused := time.Now() // the holder pauses here, its transaction open

			got := make(chan time.Duration, 1)
			go func() {
				if lb, err := b.Acquire(ctx, "account:42", nil); err == nil {
					got <- time.Since(paused)
					_ = lb.Release(context.Background())
				}
			}()
			if tc.timeout {
				select {
				case d := <-got:
					t.Logf("taken over %v after the holder paused (TTL %v)", d.Round(time.Millisecond), ttl)
				case <-ctx.Done():
					t.Fatal("the lease was not taken over while the holder stayed paused")
				}
				require.Error(t, tx.Commit(ctx), "the server ended the paused transaction: its write never commits")
				return
			}
			select {
			case d := <-got:
				t.Fatalf("taken over %v after the pause began, while the paused transaction held the row", d)
			case <-time.After(3 * ttl):
			}
			resumed := time.Now()
			require.NoError(t, tx.Rollback(ctx)) // the pause ends
			d := <-got
			t.Logf("control: taken over %v after the pause began, %v after it ended", d.Round(time.Millisecond), time.Since(resumed).Round(time.Millisecond))
		})
	}
}
