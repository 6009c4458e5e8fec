package leasetable_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/pgfence/pgfence"
	"github.com/pgfence/pgfence/leasetable"
)

func ExampleLocker_TryAcquire() {
	ctx := context.Background()
	pool, drop := exampleDB() // a *pgxpool.Pool on a migrated database
	defer drop()

	locker, err := leasetable.New(ctx, pool, &leasetable.Config{TTL: 30 * time.Second})
	if err != nil {
		panic(err)
	}
	defer locker.Close()

	lease, err := locker.TryAcquire(ctx, "account:42", nil)
	if err != nil {
		panic(err)
	}
	fmt.Println("holding", lease.Name())

	// Another process (here: another Locker) cannot take it meanwhile.
	other, err := leasetable.New(ctx, pool, nil)
	if err != nil {
		panic(err)
	}
	defer other.Close()
	_, err = other.TryAcquire(ctx, "account:42", nil)
	fmt.Println("other:", errors.Is(err, pgfence.ErrNotAcquired))

	if err := lease.Release(ctx); err != nil {
		panic(err)
	}
	next, err := other.TryAcquire(ctx, "account:42", nil)
	if err != nil {
		panic(err)
	}
	fmt.Println("newer token:", next.Token() > lease.Token())
	_ = next.Release(ctx)
	// Output:
	// holding account:42
	// other: true
	// newer token: true
}

func ExampleLocker_Acquire() {
	ctx := context.Background()
	pool, drop := exampleDB()
	defer drop()

	first, err := leasetable.New(ctx, pool, nil)
	if err != nil {
		panic(err)
	}
	defer first.Close()
	second, err := leasetable.New(ctx, pool, nil)
	if err != nil {
		panic(err)
	}
	defer second.Close()

	held, err := first.TryAcquire(ctx, "leader", nil)
	if err != nil {
		panic(err)
	}
	acquired := make(chan pgfence.Lease)
	go func() {
		// Waits until the first holder releases; wakes on its NOTIFY.
		ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		lease, err := second.Acquire(ctx, "leader", nil)
		if err != nil {
			panic(err)
		}
		acquired <- lease
	}()
	if err := held.Release(ctx); err != nil {
		panic(err)
	}
	lease := <-acquired
	fmt.Println("second holds", lease.Name())
	select {
	case <-lease.Done():
		fmt.Println("lost:", lease.Err())
	default:
		fmt.Println("still held:", lease.Err() == nil)
	}
	_ = lease.Release(ctx)
	// Output:
	// second holds leader
	// still held: true
}

func ExampleLocker_Do() {
	ctx := context.Background()
	pool, drop := exampleDB()
	defer drop()

	locker, err := leasetable.New(ctx, pool, nil)
	if err != nil {
		panic(err)
	}
	defer locker.Close()

	err = locker.Do(ctx, "nightly-report", &leasetable.AcquireOpts{AtLeast: time.Minute},
		func(ctx context.Context, lease pgfence.Lease) error {
			// ctx is cancelled if the lease is lost; pass lease.Token() to
			// fenced writes.
			fmt.Println("running with a token:", lease.Token() > 0)
			return nil
		})
	if err != nil {
		panic(err)
	}
	// AtLeast keeps a quick job from running again on a node whose
	// schedule fires a little later.
	_, err = locker.TryAcquire(ctx, "nightly-report", nil)
	fmt.Println("again at once:", errors.Is(err, pgfence.ErrNotAcquired))
	// Output:
	// running with a token: true
	// again at once: true
}

func ExampleLocker_Prune() {
	ctx := context.Background()
	pool, drop := exampleDB()
	defer drop()

	locker, err := leasetable.New(ctx, pool, nil)
	if err != nil {
		panic(err)
	}
	defer locker.Close()

	lease, err := locker.TryAcquire(ctx, "account:42", nil)
	if err != nil {
		panic(err)
	}
	if err := lease.Release(ctx); err != nil {
		panic(err)
	}
	// Make the released row two days old; in production rows of names
	// nobody uses any more get old by themselves.
	if _, err := pool.Exec(ctx, "UPDATE pgfence.pgfence_leases SET expires_at = now() - interval '2 days'"); err != nil {
		panic(err)
	}

	// Run from time to time, for example hourly.
	n, err := locker.Prune(ctx, leasetable.DefaultPruneAge)
	if err != nil {
		panic(err)
	}
	fmt.Println("pruned:", n)

	// The name can be taken again, with a newer token than ever before.
	next, err := locker.TryAcquire(ctx, "account:42", nil)
	if err != nil {
		panic(err)
	}
	fmt.Println("newer token:", next.Token() > lease.Token())
	_ = next.Release(ctx)
	// Output:
	// pruned: 1
	// newer token: true
}
