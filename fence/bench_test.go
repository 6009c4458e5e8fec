package fence_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence"
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
			_, err := db.Pool.Exec(ctx, `INSERT INTO pgfence.pgfence_leases (name, owner, fence, expires_at, secret_hash)
				VALUES ('l', 'a', 5, now() + interval '1 hour', sha256(convert_to('s', 'UTF8')))`)
			require.NoError(b, err)
			schema, err := pgfenceSchema(ctx, db.Pool)
			require.NoError(b, err)
			stmt := fence.Update("accounts").Set("balance = balance + $1").Where("id = $2").UnderLease("l", pgfence.NewSecret("s")).LeaseSchema(schema)
			for b.Loop() {
				_, err := stmt.Exec(ctx, db.Pool, 5, 1, 1)
				require.NoError(b, err)
			}
		})
	}
}

// BenchmarkTriggerPerRow measures what the pgfence_guard trigger adds to
// each row an UPDATE changes, without the round trip and commit that
// dominate a single-row statement: each op updates benchRows rows in one
// statement. Forms: no trigger; the trigger on the default column; the
// trigger behind WHEN conditions that skip it for rows it would accept; and
// the trigger on another column (read through to_jsonb); and strict mode,
// with the UPDATE presenting the rows' own token in pgfence.token (the
// plain UPDATE with that setting is the reference for it).
func BenchmarkTriggerPerRow(b *testing.B) {
	const benchRows = 1000
	const presentToken = " WHERE pg_catalog.set_config('pgfence.token', '5', true) IS NOT NULL"
	forms := []struct{ name, triggers, where string }{
		{"plain", "", ""},
		{"trigger", `CREATE TRIGGER g BEFORE UPDATE OR DELETE ON t
			FOR EACH ROW EXECUTE FUNCTION pgfence.pgfence_guard('fence_token')`, ""},
		{"trigger-when", `CREATE TRIGGER g BEFORE UPDATE ON t FOR EACH ROW
			WHEN (NEW.fence_token IS NULL OR NEW.fence_token < OLD.fence_token)
			EXECUTE FUNCTION pgfence.pgfence_guard()`, ""},
		{"trigger-other-column", `ALTER TABLE t RENAME fence_token TO tok;
			CREATE TRIGGER g BEFORE UPDATE OR DELETE ON t
			FOR EACH ROW EXECUTE FUNCTION pgfence.pgfence_guard('tok')`, ""},
		{"plain-pgfence-token", "", presentToken},
		{"trigger-strict", `CREATE TRIGGER g BEFORE UPDATE OR DELETE ON t
			FOR EACH ROW EXECUTE FUNCTION pgfence.pgfence_guard_strict('fence_token')`, presentToken},
	}
	ctx := context.Background()
	db := pgtest.NewDB(b)
	for i, f := range forms {
		table := fmt.Sprintf("t%d", i)
		_, err := db.Pool.Exec(ctx, fmt.Sprintf(`CREATE TABLE t (id int PRIMARY KEY, balance bigint NOT NULL, fence_token bigint NOT NULL)
			WITH (fillfactor = 50);
			INSERT INTO t SELECT g, 0, 5 FROM generate_series(1, %d) AS g;
			%s;
			ALTER TABLE t RENAME TO %s`, benchRows, f.triggers, table))
		require.NoError(b, err)
		b.Run(f.name, func(b *testing.B) {
			update := "UPDATE " + table + " SET balance = balance + 1" + f.where
			for b.Loop() {
				tag, err := db.Pool.Exec(ctx, update)
				require.NoError(b, err)
				require.Equal(b, int64(benchRows), tag.RowsAffected())
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*benchRows), "ns/row")
		})
	}
}
