package advisory_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence"
	"github.com/pgfence/pgfence/advisory"
	"github.com/pgfence/pgfence/internal/pgtest"
)

// plantedFunc is a function an attacker plants in schema public under the
// name of one that advisory's statements call. It records that it ran in
// public.attacker_ran, then does what the real one does, so that a
// statement that calls it still works and only the record tells.
type plantedFunc struct {
	name, params, args, returns string
	call                        string // the real function it stands for
}

var plantedFuncs = []plantedFunc{
	// Better matches than the built-ins even with pg_catalog searched
	// first: bigint[] is an exact match where pg_catalog.unnest takes
	// anyarray, and text wins for a parameter of unknown type ($1 without
	// a cast) over the built-ins' bigint.
	{"unnest", "a bigint[]", "a", "SETOF bigint", "pg_catalog.unnest"},
	{"pg_try_advisory_lock", "a text", "a::pg_catalog.int8", "boolean", "pg_catalog.pg_try_advisory_lock"},
	{"pg_try_advisory_lock_shared", "a text", "a::pg_catalog.int8", "boolean", "pg_catalog.pg_try_advisory_lock_shared"},
	{"pg_advisory_unlock", "a text", "a::pg_catalog.int8", "boolean", "pg_catalog.pg_advisory_unlock"},
	{"pg_advisory_unlock_shared", "a text", "a::pg_catalog.int8", "boolean", "pg_catalog.pg_advisory_unlock_shared"},
	{"pg_try_advisory_xact_lock", "a text", "a::pg_catalog.int8", "boolean", "pg_catalog.pg_try_advisory_xact_lock"},
	{"pg_try_advisory_xact_lock_shared", "a text", "a::pg_catalog.int8", "boolean", "pg_catalog.pg_try_advisory_xact_lock_shared"},
	{"pg_advisory_xact_lock", "a text", "a::pg_catalog.int8", "void", "pg_catalog.pg_advisory_xact_lock"},
	{"pg_advisory_xact_lock_shared", "a text", "a::pg_catalog.int8", "void", "pg_catalog.pg_advisory_xact_lock_shared"},
	// The same signatures as the built-ins: these win when the caller's
	// search_path puts public before pg_catalog.
	{"pg_try_advisory_lock", "a bigint", "a", "boolean", "pg_catalog.pg_try_advisory_lock"},
	{"pg_try_advisory_lock_shared", "a bigint", "a", "boolean", "pg_catalog.pg_try_advisory_lock_shared"},
	{"pg_try_advisory_lock_shared", "a integer, b integer", "a, b", "boolean", "pg_catalog.pg_try_advisory_lock_shared"},
	{"pg_advisory_unlock", "a bigint", "a", "boolean", "pg_catalog.pg_advisory_unlock"},
	{"pg_advisory_unlock_shared", "a bigint", "a", "boolean", "pg_catalog.pg_advisory_unlock_shared"},
	{"pg_advisory_unlock_shared", "a integer, b integer", "a, b", "boolean", "pg_catalog.pg_advisory_unlock_shared"},
	{"pg_advisory_unlock_all", "", "", "void", "pg_catalog.pg_advisory_unlock_all"},
	{"pg_try_advisory_xact_lock", "a bigint", "a", "boolean", "pg_catalog.pg_try_advisory_xact_lock"},
	{"pg_try_advisory_xact_lock", "a integer, b integer", "a, b", "boolean", "pg_catalog.pg_try_advisory_xact_lock"},
	{"pg_try_advisory_xact_lock_shared", "a bigint", "a", "boolean", "pg_catalog.pg_try_advisory_xact_lock_shared"},
	{"pg_advisory_xact_lock", "a bigint", "a", "void", "pg_catalog.pg_advisory_xact_lock"},
	{"pg_advisory_xact_lock_shared", "a bigint", "a", "void", "pg_catalog.pg_advisory_xact_lock_shared"},
	{"pg_backend_pid", "", "", "integer", "pg_catalog.pg_backend_pid"},
	{"pg_notify", "a text, b text", "a, b", "void", "pg_catalog.pg_notify"},
	{"set_config", "a text, b text, c boolean", "a, b, c", "text", "pg_catalog.set_config"},
	{"current_setting", "a text", "a", "text", "pg_catalog.current_setting"},
	{"pgfence_next_token", "", "", "bigint", "pgfence.pgfence_next_token"},
	{"pgfence_next_tokens", "a boolean[]", "a", "bigint[]", "pgfence.pgfence_next_tokens"},
	// boolean[] is an exact match where pg_catalog.unnest takes anyarray.
	{"unnest", "a boolean[]", "a", "SETOF boolean", "pg_catalog.unnest"},
	// The transition function of the array_agg(boolean) aggregate below.
	{"attacker_append", "a boolean[], b boolean", "a, b", "boolean[]", "pg_catalog.array_append"},
	// Functions behind the operators below.
	{"attacker_xor", "a bigint, b bigint", "a, b", "bigint", "pg_catalog.int8xor"},
	{"attacker_shr", "a bigint, b integer", "a, b", "bigint", "pg_catalog.int8shr"},
	{"attacker_and", "a bigint, b bigint", "a, b", "bigint", "pg_catalog.int8and"},
	{"attacker_minus", "a bigint, b bigint", "a, b", "bigint", "pg_catalog.int8mi"},
	{"attacker_eq", "a bigint, b bigint", "a, b", "boolean", "pg_catalog.int8eq"},
	{"attacker_eq84", "a bigint, b integer", "a, b", "boolean", "pg_catalog.int84eq"},
	{"attacker_or", "a bigint, b bigint", "a, b", "bigint", "pg_catalog.int8or"},
	{"attacker_cat", "a text, b text", "a, b", "text", "pg_catalog.textcat"},
	// The transition function of the count(*) aggregate below.
	{"attacker_count", "a bigint", "a, 1", "bigint", "pg_catalog.int8pl"},
}

// plantedOperators shadow the built-in operators on the types advisory's
// statements apply them to (they win when public comes before pg_catalog).
var plantedOperators = []struct{ op, left, right, fn string }{
	{"#", "bigint", "bigint", "attacker_xor"},
	{">>", "bigint", "integer", "attacker_shr"},
	{"&", "bigint", "bigint", "attacker_and"},
	{"-", "bigint", "bigint", "attacker_minus"},
	{"=", "bigint", "bigint", "attacker_eq"},
	{"=", "bigint", "integer", "attacker_eq84"},
	{"|", "bigint", "bigint", "attacker_or"},
	{"||", "text", "text", "attacker_cat"},
}

// plantSQL is what the attacker runs: a table writable by all where the
// planted functions record that they ran, and the functions and operators.
func plantSQL() []string {
	stmts := []string{
		`CREATE TABLE public.attacker_ran (fn text NOT NULL)`,
		`GRANT SELECT, INSERT ON public.attacker_ran TO PUBLIC`,
	}
	for _, f := range plantedFuncs {
		record := fmt.Sprintf("INSERT INTO public.attacker_ran VALUES ('%s(%s)');", f.name, f.params)
		var body string
		switch {
		case strings.HasPrefix(f.returns, "SETOF"):
			body = fmt.Sprintf("RETURN QUERY SELECT %s(%s);", f.call, f.args)
		case f.returns == "void":
			body = fmt.Sprintf("PERFORM %s(%s);", f.call, f.args)
		default:
			body = fmt.Sprintf("RETURN %s(%s);", f.call, f.args)
		}
		// The planted function runs with the caller's privileges (as
		// app); its own path is pinned so that its body cannot call itself.
		stmts = append(stmts, fmt.Sprintf(`CREATE FUNCTION public.%s(%s) RETURNS %s LANGUAGE plpgsql
			SET search_path = pg_catalog, pg_temp AS $f$ BEGIN %s %s END $f$`, f.name, f.params, f.returns, record, body))
	}
	for _, o := range plantedOperators {
		stmts = append(stmts, fmt.Sprintf(`CREATE OPERATOR public.%s (LEFTARG = %s, RIGHTARG = %s, FUNCTION = public.%s)`,
			o.op, o.left, o.right, o.fn))
	}
	// count(*) has no better match, but wins when public comes first;
	// array_agg(boolean) is an exact match where pg_catalog.array_agg
	// takes anynonarray, and wins wherever public is on the path.
	return append(stmts,
		`CREATE AGGREGATE public.count(*) (SFUNC = public.attacker_count, STYPE = bigint, INITCOND = '0')`,
		`CREATE AGGREGATE public.array_agg(boolean) (SFUNC = public.attacker_append, STYPE = boolean[], INITCOND = '{}')`)
}

// attackerRan returns what the planted functions recorded.
func attackerRan(t *testing.T, pool *pgxpool.Pool) []string {
	t.Helper()
	var ran []string
	require.NoError(t, pool.QueryRow(context.Background(),
		`SELECT coalesce(array_agg(fn ORDER BY fn), '{}') FROM public.attacker_ran`).Scan(&ran))
	return ran
}

// TestHostileSearchPath runs advisory's statements (and NameKeySQL) as a role whose
// search_path includes public, where another role with CREATE on public
// planted functions and operators named like the ones those statements
// call (CVE-2018-1058): none of them may run, and tokens still increase.
// The negative controls show that the planted objects do run for
// unqualified SQL through the same connections.
func TestHostileSearchPath(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		searchPath string
		// operatorsWin: pg_catalog comes after public, so an operator
		// of the same signature in public wins.
		operatorsWin bool
	}{
		{`"$user", public`, false},
		{"public, pg_catalog", true},
	} {
		t.Run(tc.searchPath, func(t *testing.T) {
			t.Parallel()
			testHostileSearchPath(t, tc.searchPath, tc.operatorsWin)
		})
	}
}

func testHostileSearchPath(t *testing.T, searchPath string, operatorsWin bool) {
	ctx := context.Background()
	db := pgtest.NewDB(t)
	// What an application role needs for advisory locks (package
	// migrations' Grant gives these and more); PUBLIC keeps USAGE on public.
	attacker := newRole(t, db, "attacker", "GRANT CREATE ON SCHEMA public TO %s")
	app := newRole(t, db, "app",
		"GRANT USAGE ON SCHEMA pgfence TO %s",
		"GRANT SELECT ON pgfence.pgfence_leases TO %s",
		"GRANT EXECUTE ON FUNCTION pgfence.pgfence_next_token(), pgfence.pgfence_next_tokens(boolean[]), pgfence.pgfence_schema_version() TO %s")

	attackerPool := db.NewPool(t, func(c *pgxpool.Config) { c.ConnConfig.User = attacker })
	for _, stmt := range plantSQL() {
		_, err := attackerPool.Exec(ctx, stmt)
		require.NoError(t, err, stmt)
	}
	attackerPool.Close()

	appPool := db.NewPool(t, func(c *pgxpool.Config) {
		c.ConnConfig.User = app
		c.ConnConfig.RuntimeParams["search_path"] = searchPath
	})
	var sp string
	require.NoError(t, appPool.QueryRow(ctx, "SHOW search_path").Scan(&sp))
	require.Equal(t, searchPath, sp)

	// The holder's every Release looks for waiters (unlockNotifySQL); the
	// waiter's never does (unlockSQL).
	holder := newLocker(t, appPool, &advisory.Config{ApplicationName: "hostile-holder"})
	advisory.SetNotifyAfterHeld(holder, 0)
	waiter := newLocker(t, appPool, &advisory.Config{ApplicationName: "hostile-waiter"})
	advisory.SetNotifyAfterHeld(waiter, time.Hour)
	// Both wait through the LISTEN connection here (interest locks); the
	// parked wait's statement is checked at the end.
	advisory.SetNoPark(holder)
	advisory.SetNoPark(waiter)

	var tokens []int64
	key := advisory.Name("hostile")
	lk, err := holder.TryAcquireKey(ctx, key, nil)
	require.NoError(t, err)
	tokens = append(tokens, lk.Token())
	require.NoError(t, lk.Renew(ctx))

	// A shared waiter on another Locker waits long enough to register
	// interest (its LISTEN connection takes the interest lock), and the
	// holder's Release notifies it.
	res := lockAsync(ctx, waiter, key, &advisory.AcquireOpts{Shared: true})
	waitInterest(t, db.Pool, key, 1)
	require.NoError(t, lk.Release(ctx))
	r := result(t, res)
	require.NoError(t, r.err)
	tokens = append(tokens, r.lk.Token())
	waitInterest(t, db.Pool, key, 0) // the waiter's interest lock was dropped

	// And the other way round: an exclusive waiter (the holder) on the
	// shared lock, which is released without a notification.
	res = lockAsync(ctx, holder, key, nil)
	waitInterest(t, db.Pool, key, 1)
	require.NoError(t, r.lk.Release(ctx))
	r = result(t, res)
	require.NoError(t, r.err)
	tokens = append(tokens, r.lk.Token())
	require.NoError(t, r.lk.Release(ctx))
	waitInterest(t, db.Pool, key, 0)

	// The remaining release statements: shared with notification,
	// exclusive without.
	lk, err = holder.TryAcquireKey(ctx, advisory.ID(8), &advisory.AcquireOpts{Shared: true})
	require.NoError(t, err)
	tokens = append(tokens, lk.Token())
	require.NoError(t, lk.Release(ctx))
	lk, err = waiter.TryAcquireKey(ctx, advisory.ID(9), nil)
	require.NoError(t, err)
	tokens = append(tokens, lk.Token())
	require.NoError(t, lk.Release(ctx))

	// The combined statements: three lock requests queued on the
	// holder's session while the test holds its turn (tryLockBatchSQL),
	// then their three releases (unlockBatchSQL).
	giveBack := advisory.HoldTurn(holder)
	bs := &batchSetup{db: db, k: holder}
	outs := []<-chan batchResult{
		bs.queue(t, advisory.ID(21), false), bs.queue(t, advisory.ID(22), true), bs.queue(t, advisory.ID(23), false),
	}
	giveBack()
	var combined []*advisory.Lease
	for _, o := range outs {
		r := <-o
		require.NoError(t, r.err)
		tokens = append(tokens, r.l.Token())
		combined = append(combined, r.l)
	}
	giveBack = advisory.HoldTurn(holder)
	released := make(chan error, len(combined))
	for _, l := range combined {
		go func() { released <- l.Release(ctx) }()
	}
	require.Eventually(t, func() bool { return advisory.Pending(holder) == len(combined) }, 10*time.Second, time.Millisecond)
	giveBack()
	for range combined {
		require.NoError(t, <-released)
	}

	// Transaction locks, including a wait that runs out of its
	// WaitTimeout (the savepoint and lock_timeout path).
	busy, err := waiter.TryAcquireKey(ctx, advisory.ID(10), nil)
	require.NoError(t, err)
	tokens = append(tokens, busy.Token())
	tx, err := appPool.Begin(ctx)
	require.NoError(t, err)
	t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
	for _, step := range []func() (int64, error){
		func() (int64, error) { return holder.TryAcquireTx(ctx, tx, advisory.ID(100), nil) },
		func() (int64, error) {
			return holder.TryAcquireTx(ctx, tx, advisory.ID(101), &advisory.AcquireOpts{Shared: true})
		},
		func() (int64, error) { return holder.AcquireTx(ctx, tx, advisory.ID(102), nil) },
		func() (int64, error) {
			return holder.AcquireTx(ctx, tx, advisory.ID(103), &advisory.AcquireOpts{Shared: true})
		},
		func() (int64, error) {
			return holder.AcquireTx(ctx, tx, advisory.ID(104), &advisory.AcquireOpts{WaitTimeout: time.Second})
		},
	} {
		tok, err := step()
		require.NoError(t, err)
		tokens = append(tokens, tok)
	}
	_, err = holder.AcquireTx(ctx, tx, advisory.ID(10), &advisory.AcquireOpts{WaitTimeout: 50 * time.Millisecond})
	requireWaitTimedOut(t, err, "AcquireTx of a busy key")
	require.NoError(t, tx.Commit(ctx))

	// A parked wait (parkLockSQL): one that runs out of its WaitTimeout
	// (cancelled in the server), then one granted at the holder's Release.
	parker := newLocker(t, appPool, &advisory.Config{ApplicationName: "hostile-parker"})
	held, err := waiter.TryAcquireKey(ctx, advisory.ID(11), nil)
	require.NoError(t, err)
	tokens = append(tokens, held.Token())
	_, err = parker.AcquireKey(ctx, advisory.ID(11), &advisory.AcquireOpts{WaitTimeout: 200 * time.Millisecond})
	requireWaitTimedOut(t, err, "a parked AcquireKey of a busy key")
	res = lockAsync(ctx, parker, advisory.ID(11), nil)
	waitParked(t, db.Pool, "hostile-parker", 1)
	require.NoError(t, held.Release(ctx))
	r = result(t, res)
	require.NoError(t, r.err)
	tokens = append(tokens, r.lk.Token())
	require.NoError(t, r.lk.Release(ctx))

	// Close with a lock held (pg_advisory_unlock_all).
	require.NoError(t, busy.Err())
	waiter.Close()
	require.ErrorIs(t, busy.Err(), pgfence.ErrLeaseLost)

	for i := 1; i < len(tokens); i++ {
		require.Greater(t, tokens[i], tokens[i-1], "tokens %v", tokens)
	}
	var roles []string
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT array_agg(DISTINCT usename::text) FROM pg_stat_activity
		WHERE datname = current_database() AND application_name LIKE 'hostile-%'`).Scan(&roles))
	require.Equal(t, []string{app}, roles, "the lock sessions and LISTEN connections ran as app")
	// NameKeySQL, which other clients run with their own search_path.
	var nameKey int64
	require.NoError(t, appPool.QueryRow(ctx, advisory.NameKeySQL, "account:42").Scan(&nameKey))
	require.Equal(t, advisory.Name("account:42").Int64(), nameKey)
	require.Empty(t, attackerRan(t, db.Pool), "no planted function or operator ran")

	// Negative controls: the same pool's unqualified SQL runs the planted
	// unnest and array_agg; with public before pg_catalog, the planted
	// operators too.
	rows, err := appPool.Query(ctx, "SELECT unnest($1::bigint[])", []int64{1, 2})
	require.NoError(t, err)
	got, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	require.NoError(t, err)
	require.Equal(t, []int64{1, 2}, got)
	var agg []bool
	require.NoError(t, appPool.QueryRow(ctx, "SELECT array_agg(b) FROM (VALUES (true), (false)) AS v(b)").Scan(&agg))
	require.Equal(t, []bool{true, false}, agg)
	want := []string{"attacker_append(a boolean[], b boolean)", "attacker_append(a boolean[], b boolean)", "unnest(a bigint[])"}
	if operatorsWin {
		var x int64
		require.NoError(t, appPool.QueryRow(ctx, "SELECT $1::bigint # 1::bigint", int64(3)).Scan(&x))
		require.Equal(t, int64(2), x)
		want = append(want, "attacker_xor(a bigint, b bigint)")
	}
	require.ElementsMatch(t, want, attackerRan(t, db.Pool))
}

// newRole creates a login role for db's tests, named after prefix and the
// database (roles belong to the cluster), runs each grant with %s standing
// for the role, and drops what the role owns and the role at cleanup:
// before the database is dropped and after pools on it as the role
// (registered later) are closed.
func newRole(t *testing.T, db *pgtest.DB, prefix string, grants ...string) string {
	t.Helper()
	ctx := context.Background()
	role := prefix + "_" + db.Name[len(db.Name)-8:]
	_, err := db.Pool.Exec(ctx, "CREATE ROLE "+role+" LOGIN")
	require.NoError(t, err)
	t.Cleanup(func() {
		for _, stmt := range []string{"DROP OWNED BY " + role, "DROP ROLE " + role} {
			_, err := db.Pool.Exec(context.Background(), stmt)
			require.NoError(t, err)
		}
	})
	for _, g := range grants {
		_, err := db.Pool.Exec(ctx, fmt.Sprintf(g, role))
		require.NoError(t, err)
	}
	return role
}
