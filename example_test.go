package pgfence_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence"
	"github.com/pgfence/pgfence/fence"
	"github.com/pgfence/pgfence/leasetable"
)

// A job takes the lease for one account, and every write it makes carries
// the lease's fencing token, so a holder that lost the lease can no longer
// change the row. DATABASE_URL names a database where pgfence's migrations
// are applied (migrations.Up, or pgfence migrate up).
func Example() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		panic(err)
	}
	defer pool.Close()

	_, err = pool.Exec(ctx, `
		CREATE TABLE accounts (
			id          int PRIMARY KEY,
			balance     bigint NOT NULL,
			fence_token bigint NOT NULL DEFAULT 0);
		INSERT INTO accounts (id, balance) VALUES (42, 100)`)
	if err != nil {
		panic(err)
	}

	locker, err := leasetable.New(ctx, pool, &leasetable.Config{TTL: 30 * time.Second})
	if err != nil {
		panic(err)
	}
	defer locker.Close()

	deposit := fence.Update("accounts").Set("balance = balance + $1").Where("id = $2")

	var oldToken int64
	for _, amount := range []int64{10, 20} {
		err = locker.Do(ctx, "account:42", nil, func(ctx context.Context, lease pgfence.Lease) error {
			if oldToken == 0 {
				oldToken = lease.Token()
			}
			// ctx is cancelled if the lease is lost; the token fences the write.
			_, err := deposit.Exec(ctx, pool, lease.Token(), amount, 42)
			return err
		})
		if err != nil {
			panic(err)
		}
	}

	// A late write from the first holder, long after its lease passed on.
	_, err = deposit.Exec(ctx, pool, oldToken, 1000, 42)
	fmt.Println("stale write rejected:", errors.Is(err, pgfence.ErrFenced))

	var balance int64
	if err := pool.QueryRow(ctx, "SELECT balance FROM accounts WHERE id = 42").Scan(&balance); err != nil {
		panic(err)
	}
	fmt.Println("balance:", balance)
	// Output:
	// stale write rejected: true
	// balance: 130
}

// Code written against pgfence.Locker switches strategy by changing the
// constructor alone: here the same job runs under a lease and under a
// session advisory lock.
func ExampleLocker() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		panic(err)
	}
	defer pool.Close()

	nightly := func(locker pgfence.Locker) error {
		return locker.Do(ctx, "nightly-report", nil, func(ctx context.Context, l pgfence.Lease) error {
			fmt.Println("running with a fencing token:", l.Token() > 0)
			return nil
		})
	}

	leases, err := leasetable.New(ctx, pool, nil)
	if err != nil {
		panic(err)
	}
	defer leases.Close()
	if err := nightly(leases); err != nil {
		panic(err)
	}
	// Output:
	// running with a fencing token: true
}
