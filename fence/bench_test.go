package fence_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence/fence"
	"github.com/pgfence/pgfence/internal/pgtest"
)

// benchSetup creates accounts (with the trigger when trigger is true) and
// one row.
func benchSetup(b *testing.B, trigger bool) *pgtest.DB {
	db := pgtest.NewDB(b)
	ctx := context.Background()
	_, err := db.Pool.Exec(ctx, accountsDDL+"INSERT INTO accounts VALUES (1, 0, 0);")
	require.NoError(b, err)
	if !trigger {
		_, err = db.Pool.Exec(ctx, "DROP TRIGGER accounts_fence ON accounts")
		require.NoError(b, err)
	}
	return db
}

// BenchmarkUpdate compares a guarded Update with the plain UPDATE it
// protects, with and without the pgfence_guard trigger.
func BenchmarkUpdate(b *testing.B) {
	ctx := context.Background()
	for _, trigger := range []bool{false, true} {
		name := "no-trigger"
		if trigger {
			name = "trigger"
		}
		b.Run(name+"/plain", func(b *testing.B) {
			db := benchSetup(b, trigger)
			for b.Loop() {
				_, err := db.Pool.Exec(ctx, "UPDATE accounts SET balance = balance + $1, fence_token = $3 WHERE id = $2", 1, 1, int64(5))
				require.NoError(b, err)
			}
		})
		b.Run(name+"/fence", func(b *testing.B) {
			db := benchSetup(b, trigger)
			for b.Loop() {
				_, err := addBalance.Exec(ctx, db.Pool, 5, 1, 1)
				require.NoError(b, err)
			}
		})
		b.Run(name+"/fence-under-lease", func(b *testing.B) {
			db := benchSetup(b, trigger)
			_, err := db.Pool.Exec(ctx, `INSERT INTO pgfence_leases (name, owner, fence, expires_at)
				VALUES ('l', 'a', 5, now() + interval '1 hour')`)
			require.NoError(b, err)
			stmt := fence.Update("accounts").Set("balance = balance + $1").Where("id = $2").UnderLease("l")
			for b.Loop() {
				_, err := stmt.Exec(ctx, db.Pool, 5, 1, 1)
				require.NoError(b, err)
			}
		})
	}
}
