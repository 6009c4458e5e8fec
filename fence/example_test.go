package fence_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence"
	"github.com/pgfence/pgfence/fence"
)

// must panics on err, to keep the Examples short.
func must(err error) {
	if err != nil {
		panic(err)
	}
}

// The stale-holder story: holder A's lock passes to B, which writes; A's
// late write is rejected and the row keeps B's value.
func Example() {
	databaseURL, drop := exampleDatabase() // a database with pgfence's migrations applied
	defer drop()
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, databaseURL)
	must(err)
	defer pool.Close()
	_, err = pool.Exec(ctx, `CREATE TABLE accounts (
		id int PRIMARY KEY, balance bigint NOT NULL, fence_token bigint NOT NULL DEFAULT 0);
		INSERT INTO accounts (id, balance) VALUES (42, 100)`)
	must(err)
	var tokenA, tokenB int64 // as the lock strategies hand them out
	must(pool.QueryRow(ctx, "SELECT pgfence.pgfence_next_token(), pgfence.pgfence_next_token()").Scan(&tokenA, &tokenB))

	addBalance := fence.Update("accounts").Set("balance = balance + $1").Where("id = $2")

	tag, err := addBalance.Exec(ctx, pool, tokenB, 10, 42) // B, the new holder
	fmt.Println("B:", tag, err)

	_, err = addBalance.Exec(ctx, pool, tokenA, 99, 42) // A, paused past its TTL, wakes up
	fmt.Println("A fenced:", errors.Is(err, pgfence.ErrFenced))
	var stale *fence.StaleTokenError
	if errors.As(err, &stale) {
		fmt.Println("A presented", stale.Presented, "but the row carries", stale.Current)
	}

	_, err = addBalance.Exec(ctx, pool, tokenB, 10, 7)
	fmt.Println("missing row:", errors.Is(err, pgx.ErrNoRows))

	var balance int64
	must(pool.QueryRow(ctx, "SELECT balance FROM accounts WHERE id = 42").Scan(&balance))
	fmt.Println("balance:", balance)
	// Output:
	// B: UPDATE 1 <nil>
	// A fenced: true
	// A presented 1 but the row carries 1025
	// missing row: true
	// balance: 110
}

func ExampleUpdateStmt_SQL() {
	stmt := fence.Update("accounts").Set("balance = balance + $1").Where("id = $2")
	sql, err := stmt.SQL(2)
	fmt.Println(sql, err)
	// Output:
	// WITH pgfence_locked AS (
	//     SELECT "fence_token" AS pgfence_token FROM "accounts"
	//     WHERE (id = $2)
	//     AND (SELECT pg_catalog.count(*) OPERATOR(pg_catalog.>) 1 FROM (SELECT FROM "accounts" WHERE (id = $2) LIMIT 2) AS pgfence_rows)
	//     FOR UPDATE
	// ), pgfence_write AS (
	//     UPDATE "accounts" SET balance = balance + $1, "fence_token" = $3
	//     WHERE (id = $2)
	//     AND "fence_token" OPERATOR(pg_catalog.<=) $3
	//     AND NOT EXISTS (SELECT FROM pgfence_locked WHERE (pgfence_token OPERATOR(pg_catalog.<=) $3) IS NOT TRUE)
	//     AND pg_catalog.set_config('pgfence.token', $3::pg_catalog.int8::pg_catalog.text, true) IS NOT NULL
	//     RETURNING 1
	// )
	// SELECT (SELECT pg_catalog.count(*) FROM pgfence_write), pg_catalog.count(*), pg_catalog.max(pgfence_token),
	//     pg_catalog.count(*) FILTER (WHERE pgfence_token IS NULL), true
	// FROM (
	//     SELECT "fence_token" AS pgfence_token FROM "accounts"
	//     WHERE (id = $2)
	//     AND NOT EXISTS (SELECT FROM pgfence_write)
	//     FOR UPDATE
	// ) AS pgfence_current <nil>
}

func ExampleUpdateStmt_SQL_badInput() {
	stmt := fence.Update("accounts").Set("note = 'costs $2'").Where("id = $1")
	_, err := stmt.SQL(2)
	fmt.Println(err)
	// Output:
	// fence: the fragments use placeholders up to $1 but 2 argument(s) were given; the fencing token takes $3
}

// A lease-checked write from holder A, after B took the lease over.
func ExampleUpdateStmt_UnderLease() {
	databaseURL, drop := exampleDatabase() // a database with pgfence's migrations applied
	defer drop()
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, databaseURL)
	must(err)
	defer pool.Close()
	_, err = pool.Exec(ctx, `CREATE TABLE jobs (id int PRIMARY KEY, state text NOT NULL,
		fence_token bigint NOT NULL DEFAULT 0);
		INSERT INTO jobs (id, state) VALUES (1, 'queued')`)
	must(err)
	// A holds the lease "scheduler", then B takes it over (as the lease
	// table strategy would, with a newer token).
	// Each holder knows its secret, which the row keeps only as a hash.
	const take = `INSERT INTO pgfence.pgfence_leases (name, owner, fence, expires_at, secret_hash)
		VALUES ('scheduler', $1, pgfence.pgfence_next_token(), now() + interval '30 seconds',
		    sha256(convert_to($2, 'UTF8')))
		ON CONFLICT (name) DO UPDATE SET owner = excluded.owner, fence = excluded.fence,
		    expires_at = excluded.expires_at, secret_hash = excluded.secret_hash
		RETURNING fence`
	secretA, secretB := pgfence.NewSecret("secret of A"), pgfence.NewSecret("secret of B")
	var tokenA, tokenB int64
	must(pool.QueryRow(ctx, take, "A", secretA.Reveal()).Scan(&tokenA))
	must(pool.QueryRow(ctx, take, "B", secretB.Reveal()).Scan(&tokenB))

	run := fence.Update("jobs").Set("state = $1").Where("id = $2")
	_, err = run.UnderLease("scheduler", secretA).Exec(ctx, pool, tokenA, "running on A", 1)
	fmt.Println("lease lost:", errors.Is(err, pgfence.ErrLeaseLost), "fenced:", errors.Is(err, pgfence.ErrFenced))
	_, err = run.UnderLease("scheduler", secretB).Exec(ctx, pool, tokenB, "running on B", 1)
	fmt.Println("B:", err)
	// Output:
	// lease lost: true fenced: true
	// B: <nil>
}

func ExampleUpsert() {
	stmt := fence.Upsert("accounts").Columns("id", "balance").Values("$1", "$2").OnConflict("id")
	sql, _ := stmt.SQL(2)
	fmt.Println(sql)
	// Output:
	// WITH pgfence_write AS (
	//     INSERT INTO "accounts" ("id", "balance", "fence_token")
	//     SELECT ($1), ($2), $3::pg_catalog.int8
	//     WHERE pg_catalog.set_config('pgfence.token', $3::pg_catalog.int8::pg_catalog.text, true) IS NOT NULL
	//     ON CONFLICT ("id") DO UPDATE SET "balance" = excluded."balance", "fence_token" = excluded."fence_token"
	//     WHERE "accounts"."fence_token" OPERATOR(pg_catalog.<=) excluded."fence_token"
	//     RETURNING 1
	// )
	// SELECT (SELECT pg_catalog.count(*) FROM pgfence_write), pg_catalog.count(*), pg_catalog.max(pgfence_token),
	//     pg_catalog.count(*) FILTER (WHERE pgfence_token IS NULL), true
	// FROM (
	//     SELECT "fence_token" AS pgfence_token FROM "accounts"
	//     WHERE "id" = ($1)
	//     AND NOT EXISTS (SELECT FROM pgfence_write)
	//     FOR UPDATE
	// ) AS pgfence_current
}

func ExamplePredicate() {
	const addBalance = `UPDATE accounts SET balance = balance + $1, fence_token = $3
WHERE id = $2 AND `
	fmt.Println(addBalance + fence.Predicate("fence_token", 3, false))
	fmt.Println(fence.Predicate("", 2, true))
	// Output:
	// UPDATE accounts SET balance = balance + $1, fence_token = $3
	// WHERE id = $2 AND "fence_token" <= $3
	// "fence_token" < $2
}

// Plain SQL on a table with the pgfence_guard trigger: Check tells a stale
// write from a missing row.
func ExampleCheck() {
	databaseURL, drop := exampleDatabase() // a database with pgfence's migrations applied
	defer drop()
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, databaseURL)
	must(err)
	defer pool.Close()
	_, err = pool.Exec(ctx, accountsDDL+`
		INSERT INTO accounts (id, balance, fence_token) VALUES (42, 100, 7)`)
	must(err)
	const addBalance = `UPDATE accounts SET balance = balance + $1, fence_token = $2 WHERE id = $3`

	_, err = fence.Check(pool.Exec(ctx, addBalance, 10, int64(6), 42))
	fmt.Println(err)
	_, err = fence.Check(pool.Exec(ctx, addBalance, 10, int64(8), 43))
	fmt.Println(errors.Is(err, pgx.ErrNoRows))
	tag, err := fence.Check(pool.Exec(ctx, addBalance, 10, int64(8), 42))
	fmt.Println(tag, err)
	// Output:
	// pgfence: write rejected: stale fencing token 6, row carries 7
	// true
	// UPDATE 1 <nil>
}

// A read-modify-write under a lock: claim the row and read it in one
// statement, compute, write, commit. A holder with an older token is
// rejected from the claim on.
func ExampleClaim() {
	databaseURL, drop := exampleDatabase()
	defer drop()
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, databaseURL)
	must(err)
	defer pool.Close()
	_, err = pool.Exec(ctx, `CREATE TABLE accounts (
		id int PRIMARY KEY, balance bigint NOT NULL, fence_token bigint NOT NULL DEFAULT 0);
		INSERT INTO accounts (id, balance) VALUES (42, 100)`)
	must(err)
	var oldToken, token int64 // as the lock strategies hand them out
	must(pool.QueryRow(ctx, "SELECT pgfence.pgfence_next_token(), pgfence.pgfence_next_token()").Scan(&oldToken, &token))

	claim := fence.Claim("accounts").Where("id = $1").Returning("balance")
	setBalance := fence.Update("accounts").Set("balance = $1").Where("id = $2").Returning("balance")

	tx, err := pool.Begin(ctx)
	must(err)
	var balance int64
	must(claim.QueryRow(ctx, tx, token, 42).Scan(&balance))
	must(setBalance.QueryRow(ctx, tx, token, balance*2, 42).Scan(&balance))
	must(tx.Commit(ctx))
	fmt.Println("balance:", balance)

	err = claim.QueryRow(ctx, pool, oldToken, 42).Scan(&balance)
	fmt.Println("older holder fenced:", errors.Is(err, pgfence.ErrFenced))
	err = claim.QueryRow(ctx, pool, token, 7).Scan(&balance)
	fmt.Println("missing row:", errors.Is(err, pgx.ErrNoRows))
	// Output:
	// balance: 200
	// older holder fenced: true
	// missing row: true
}

// The strict guard: pgfence_protect makes the table check every UPDATE and
// DELETE, whatever SQL sends it. A writer presents its token once per
// transaction; a stale holder's write is rejected, and so is a write that
// presents no token.
func ExamplePresent() {
	databaseURL, drop := exampleDatabase()
	defer drop()
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, databaseURL)
	must(err)
	defer pool.Close()
	var oldToken, token int64 // as the lock strategies hand them out
	must(pool.QueryRow(ctx, "SELECT pgfence.pgfence_next_token(), pgfence.pgfence_next_token()").Scan(&oldToken, &token))

	// In a migration of your own, as the table's owner:
	_, err = pool.Exec(ctx, `
		CREATE TABLE accounts (id int PRIMARY KEY, balance bigint NOT NULL, fence_token bigint NOT NULL DEFAULT 0);
		INSERT INTO accounts (id, balance) VALUES (42, 100);
		SELECT pgfence.pgfence_protect('accounts', 'fence_token', true)`)
	must(err)

	// deposit presents a token, then writes with plain SQL (or sqlc).
	deposit := func(token int64, present bool) error {
		tx, err := pool.Begin(ctx)
		must(err)
		defer tx.Rollback(ctx)
		if present {
			must(fence.Present(ctx, tx, token)) // SQL: SELECT pgfence.pgfence_present($1)
		}
		if _, err := fence.Check(tx.Exec(ctx, `UPDATE accounts SET balance = balance + 10 WHERE id = 42`)); err != nil {
			return err
		}
		return tx.Commit(ctx)
	}
	fmt.Println(deposit(token, true))
	fmt.Println(errors.Is(deposit(oldToken, true), pgfence.ErrFenced))
	fmt.Println(errors.Is(deposit(token, false), pgfence.ErrNoToken))
	// Output:
	// <nil>
	// true
	// true
}
