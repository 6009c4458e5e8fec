package leasetable_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/pgfence/pgfence"
	"github.com/pgfence/pgfence/leasetable"
)

func ExampleLocker_AcquirePermit() {
	ctx := context.Background()
	pool, drop := exampleDB()
	defer drop()

	locker, err := leasetable.New(ctx, pool, nil)
	if err != nil {
		panic(err)
	}
	defer locker.Close()

	// At most 2 transcodes at once, across every Locker of the database.
	a, err := locker.AcquirePermit(ctx, "transcode", 2, nil)
	if err != nil {
		panic(err)
	}
	b, err := locker.AcquirePermit(ctx, "transcode", 2, nil)
	if err != nil {
		panic(err)
	}
	_, err = locker.TryAcquirePermit(ctx, "transcode", 2, nil)
	fmt.Println("third:", errors.Is(err, pgfence.ErrNotAcquired))
	_, err = locker.TryAcquirePermit(ctx, "transcode", 3, nil)
	fmt.Println("another count:", errors.Is(err, leasetable.ErrPermitsMismatch))

	// Each permit is a lease with its own token: key fenced rows by its name.
	sem, slot, _ := leasetable.SplitPermit(a.Name())
	fmt.Println(sem, slot, a.Token() != b.Token())
	_ = a.Release(ctx)
	_ = b.Release(ctx)
	// Output:
	// third: true
	// another count: true
	// transcode 0 true
}

func ExampleLocker_AcquireSet() {
	ctx := context.Background()
	pool, drop := exampleDB()
	defer drop()

	locker, err := leasetable.New(ctx, pool, nil)
	if err != nil {
		panic(err)
	}
	defer locker.Close()

	held, err := locker.TryAcquire(ctx, "account:9", nil)
	if err != nil {
		panic(err)
	}
	// All or nothing: account:9 is held, so account:7 is not taken either.
	_, err = locker.TryAcquireSet(ctx, []string{"account:7", "account:9"}, nil)
	fmt.Println("refused:", errors.Is(err, pgfence.ErrNotAcquired))
	_ = held.Release(ctx)

	leases, err := locker.AcquireSet(ctx, []string{"account:7", "account:9"}, nil)
	if err != nil {
		panic(err)
	}
	for _, l := range leases {
		fmt.Println("holding", l.Name())
		_ = l.Release(ctx)
	}
	// Output:
	// refused: true
	// holding account:7
	// holding account:9
}
