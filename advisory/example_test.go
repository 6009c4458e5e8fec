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

// A Locker holds session locks on its own connections; TryAcquire returns
// at once, with a fencing token for guarded writes.
func Example() {
	databaseURL, drop := exampleDatabase()
	defer drop()
	ctx := context.Background()

	pool, err := pgxpool.New(ctx, databaseURL)
	if err != nil {
		panic(err)
	}
	defer pool.Close()
	locker, err := advisory.New(ctx, pool, nil)
	if err != nil {
		panic(err)
	}
	defer locker.Close()

	lease, err := locker.TryAcquire(ctx, "account:42", nil)
	if err != nil {
		panic(err)
	}
	fmt.Println("holding", lease.Name(), "token > 0:", lease.Token() > 0)

	_, err = locker.TryAcquire(ctx, "account:42", nil)
	fmt.Println("second TryAcquire not acquired:", errors.Is(err, pgfence.ErrNotAcquired))

	if err := lease.Release(ctx); err != nil {
		panic(err)
	}
	fmt.Println("after Release:", errors.Is(lease.Err(), pgfence.ErrNotHeld))
	// Output:
	// holding account:42 token > 0: true
	// second TryAcquire not acquired: true
	// after Release: true
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
	locker, err := advisory.New(ctx, pool, nil)
	if err != nil {
		panic(err)
	}
	defer locker.Close()

	err = locker.Do(ctx, "nightly-report", nil, func(ctx context.Context, lease pgfence.Lease) error {
		fmt.Println("running the report under", lease.(*advisory.Lease).Key())
		return nil
	})
	fmt.Println("done:", err)
	// Output:
	// running the report under "nightly-report" (7440995589958059143)
	// done: <nil>
}

// Transaction-scoped locks end with the transaction, hold no session of the
// Locker (which only names the schema whose sequence draws the token), and
// work behind PgBouncer's transaction pooling.
func ExampleLocker_TryAcquireTx() {
	databaseURL, drop := exampleDatabase()
	defer drop()
	ctx := context.Background()

	pool, err := pgxpool.New(ctx, databaseURL)
	if err != nil {
		panic(err)
	}
	defer pool.Close()
	locker, err := advisory.New(ctx, pool, nil)
	if err != nil {
		panic(err)
	}
	defer locker.Close()

	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		token, err := locker.TryAcquireTx(ctx, tx, advisory.Name("account:42"), nil)
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
