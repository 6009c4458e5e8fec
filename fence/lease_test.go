package fence_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence"
	"github.com/pgfence/pgfence/fence"
)

func TestUnderLeaseWritesWhileHeld(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	b.account(t, 1, 100, 0)
	tokA, secA := b.acquireLease(t, "ledger", "A")

	_, err := addBalance.LeaseSchema(b.schema).UnderLease("ledger", secA).Exec(ctx, b.pool, tokA, 5, 1)
	require.NoError(t, err)
	bal, tok := b.row(t, 1)
	require.Equal(t, int64(105), bal)
	require.Equal(t, tokA, tok)
}

func TestUnderLeaseRejectedAfterTakeover(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	b.account(t, 1, 100, 0)
	tokA, secA := b.acquireLease(t, "ledger", "A")
	tokB, secB := b.acquireLease(t, "ledger", "B") // A paused past its TTL; B took over

	// B has not written the row yet, so token fencing alone would let A's
	// write through; the lease check does not.
	_, err := addBalance.Exec(ctx, b.pool, tokA, 0, 1)
	require.NoError(t, err, "negative control: token fencing alone accepts A here")
	_, err = addBalance.LeaseSchema(b.schema).UnderLease("ledger", secA).Exec(ctx, b.pool, tokA, 5, 1)
	require.ErrorIs(t, err, pgfence.ErrLeaseLost)
	require.ErrorIs(t, err, pgfence.ErrFenced)
	var le *fence.LeaseLostError
	require.ErrorAs(t, err, &le)
	require.Equal(t, "ledger", le.Lease)
	require.Equal(t, tokA, le.Presented)

	_, err = addBalance.LeaseSchema(b.schema).UnderLease("ledger", secB).Exec(ctx, b.pool, tokB, 7, 1)
	require.NoError(t, err)
	bal, tok := b.row(t, 1)
	require.Equal(t, int64(107), bal)
	require.Equal(t, tokB, tok)
}

func TestUnderLeaseRejectedWhenExpiredOrReleasedOrMissing(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	b.account(t, 1, 100, 0)
	tok, sec := b.acquireLease(t, "ledger", "A")
	b.exec(t, "UPDATE "+b.fn("pgfence_leases")+" SET expires_at = now() WHERE name = 'ledger'") // released
	_, err := addBalance.LeaseSchema(b.schema).UnderLease("ledger", sec).Exec(ctx, b.pool, tok, 5, 1)
	require.ErrorIs(t, err, pgfence.ErrLeaseLost)

	_, err = addBalance.LeaseSchema(b.schema).UnderLease("other", sec).Exec(ctx, b.pool, tok, 5, 1)
	require.ErrorIs(t, err, pgfence.ErrLeaseLost)
	bal, _ := b.row(t, 1)
	require.Equal(t, int64(100), bal)
}

func TestUnderLeaseStaleRowStillFenced(t *testing.T) {
	t.Parallel()
	b := setup(t)
	tok, sec := b.acquireLease(t, "ledger", "A")
	b.account(t, 1, 100, b.nextToken(t)) // written by a newer holder of another lock
	_, err := addBalance.LeaseSchema(b.schema).UnderLease("ledger", sec).Exec(context.Background(), b.pool, tok, 5, 1)
	require.ErrorIs(t, err, pgfence.ErrFenced)
	require.NotErrorIs(t, err, pgfence.ErrLeaseLost)
}

func TestUnderLeaseBlockedWhileTakeoverInFlight(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	b.account(t, 1, 100, 0)
	tokA, secA := b.acquireLease(t, "ledger", "A")
	stmt := fence.Update("accounts").Set("balance = balance + $1").Where("id = $2 AND 'lease_a_blocked' <> ''").
		LeaseSchema(b.schema).UnderLease("ledger", secA)

	for _, commit := range []bool{true, false} {
		takeover, err := b.pool.Begin(ctx)
		require.NoError(t, err)
		t.Cleanup(func() { _ = takeover.Rollback(context.Background()) })
		_, err = takeover.Exec(ctx, b.acquireLeaseSQL(), "ledger", "B", "B-secret")
		require.NoError(t, err)
		err = blockedBehind(t, b, "lease_a_blocked",
			func() error { _, err := stmt.Exec(ctx, b.pool, tokA, 5, 1); return err },
			func() error {
				if commit {
					return takeover.Commit(ctx)
				}
				return takeover.Rollback(ctx)
			})
		if commit {
			require.ErrorIs(t, err, pgfence.ErrLeaseLost, "the takeover committed while A waited")
			bal, _ := b.row(t, 1)
			require.Equal(t, int64(100), bal)
			// Give the lease back to A for the rollback case.
			b.exec(t, "UPDATE "+b.fn("pgfence_leases")+" SET owner = 'A', fence = $1, secret_hash = sha256(convert_to($2, 'UTF8')) WHERE name = 'ledger'", tokA, secA.Reveal())
		} else {
			require.NoError(t, err, "the takeover rolled back, so A still holds the lease")
			bal, _ := b.row(t, 1)
			require.Equal(t, int64(105), bal)
		}
	}
}

func TestUnderLeaseHoldsOffTakeoverUntilCommit(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	b.account(t, 1, 100, 0)
	tokA, secA := b.acquireLease(t, "ledger", "A")

	tx, err := b.pool.Begin(ctx)
	require.NoError(t, err)
	t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
	_, err = addBalance.LeaseSchema(b.schema).UnderLease("ledger", secA).Exec(ctx, tx, tokA, 5, 1)
	require.NoError(t, err)

	// The lease row is locked FOR SHARE until A's transaction ends, so a
	// takeover cannot commit between A's check and A's commit.
	takeoverSQL := "/* takeover_waits */ " + b.acquireLeaseSQL()
	var tokB int64
	err = blockedBehind(t, b, "takeover_waits",
		func() error { return b.pool.QueryRow(ctx, takeoverSQL, "ledger", "B", "B-secret").Scan(&tokB) },
		func() error { return tx.Commit(ctx) })
	require.NoError(t, err)
	require.Greater(t, tokB, tokA)
	bal, tok := b.row(t, 1)
	require.Equal(t, int64(105), bal)
	require.Equal(t, tokA, tok)
}

// TestUnderLeaseNeedsTheSecret: the lease's token without its secret is not
// enough. Control: the same write with the secret passes.
func TestUnderLeaseNeedsTheSecret(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	b.account(t, 1, 100, 0)
	tok, sec := b.acquireLease(t, "ledger", "A")
	stmt := addBalance.LeaseSchema(b.schema)

	_, err := stmt.UnderLease("ledger", pgfence.Secret{}).SQL(2)
	require.ErrorContains(t, err, "zero Secret")
	_, err = stmt.UnderLease("ledger", pgfence.Secret{}).Exec(ctx, b.pool, tok, 5, 1)
	require.ErrorContains(t, err, "zero Secret")
	_, err = stmt.UnderLease("ledger", pgfence.NewSecret("guessed")).Exec(ctx, b.pool, tok, 5, 1)
	require.ErrorIs(t, err, pgfence.ErrLeaseLost, "the token alone, which every reader of pgfence_leases sees, proves nothing")
	_, err = stmt.UnderLease("ledger", sec).Exec(ctx, b.pool, tok, 5, 1)
	require.NoError(t, err, "control: with the lease's secret")
	bal, _ := b.row(t, 1)
	require.Equal(t, int64(105), bal)
}
