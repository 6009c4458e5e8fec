package advisory_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence"
	"github.com/pgfence/pgfence/advisory"
)

// A Locker holds session locks on its own connections; TryLock returns at
// once, with a fencing token for guarded writes.
func Example() {
	databaseURL, drop := exampleDatabase()
	defer drop()
	ctx := context.Background()

	pool, err := pgxpool.New(ctx, databaseURL)
	if err != nil {
		panic(err)
	}
	defer pool.Close()
	locker, err := advisory.New(pool, nil)
	if err != nil {
		panic(err)
	}
	defer locker.Close()

	lk, err := locker.TryLock(ctx, advisory.Name("account:42"), nil)
	if err != nil {
		panic(err)
	}
	fmt.Println("holding", lk.Key(), "token > 0:", lk.Token() > 0)

	_, err = locker.TryLock(ctx, advisory.Name("account:42"), nil)
	fmt.Println("second TryLock not acquired:", errors.Is(err, pgfence.ErrNotAcquired))

	if err := lk.Unlock(ctx); err != nil {
		panic(err)
	}
	fmt.Println("after Unlock:", errors.Is(lk.Err(), pgfence.ErrNotHeld))
	// Output:
	// holding "account:42" (4097093253131737194) token > 0: true
	// second TryLock not acquired: true
	// after Unlock: true
}

// Do holds the lock while fn runs; fn's context is cancelled if the lock is
// lost, so the work stops.
func ExampleLocker_Do() {
	databaseURL, drop := exampleDatabase()
	defer drop()
	ctx := context.Background()

	pool, err := pgxpool.New(ctx, databaseURL)
	if err != nil {
		panic(err)
	}
	defer pool.Close()
	locker, err := advisory.New(pool, nil)
	if err != nil {
		panic(err)
	}
	defer locker.Close()

	err = locker.Do(ctx, advisory.Name("nightly-report"), nil, func(ctx context.Context, lk *advisory.Lock) error {
		fmt.Println("running the report under", lk.Key())
		return nil
	})
	fmt.Println("done:", err)
	// Output:
	// running the report under "nightly-report" (7440995589958059143)
	// done: <nil>
}

// Transaction-scoped locks end with the transaction, need no Locker, and
// work behind PgBouncer's transaction pooling.
func ExampleTryLockTx() {
	databaseURL, drop := exampleDatabase()
	defer drop()
	ctx := context.Background()

	pool, err := pgxpool.New(ctx, databaseURL)
	if err != nil {
		panic(err)
	}
	defer pool.Close()

	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		token, err := advisory.TryLockTx(ctx, tx, advisory.Name("account:42"), nil)
		if err != nil {
			return err // errors.Is(err, pgfence.ErrNotAcquired): someone else has it
		}
		fmt.Println("locked until commit, token > 0:", token > 0)
		// ... write rows guarded by token ...
		return nil
	})
	fmt.Println("committed:", err)
	// Output:
	// locked until commit, token > 0: true
	// committed: <nil>
}

// NameKeySQL computes a Name key in SQL, so other clients can take the same
// lock.
func ExampleName() {
	databaseURL, drop := exampleDatabase()
	defer drop()
	ctx := context.Background()

	conn, err := pgx.Connect(ctx, databaseURL)
	if err != nil {
		panic(err)
	}
	defer conn.Close(ctx)

	var key int64
	if err := conn.QueryRow(ctx, advisory.NameKeySQL, "account:42").Scan(&key); err != nil {
		panic(err)
	}
	fmt.Println(key, key == advisory.Name("account:42").Int64())
	// Output:
	// 4097093253131737194 true
}
