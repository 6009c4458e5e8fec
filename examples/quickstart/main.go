// Command quickstart takes a lease, fences its writes with the lease's
// token, and shows a stale holder's late write being rejected.
//
//	DATABASE_URL=postgres://user@localhost:5432/app go run ./examples/quickstart
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"os"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence"
	"github.com/pgfence/pgfence/fence"
	"github.com/pgfence/pgfence/leasetable"
	"github.com/pgfence/pgfence/migrations"
)

func main() {
	if err := run(context.Background(), os.Getenv("DATABASE_URL"), os.Stdout); err != nil {
		log.Fatal(err)
	}
}

func run(ctx context.Context, databaseURL string, out io.Writer) error {
	pool, err := pgxpool.New(ctx, databaseURL)
	if err != nil {
		return err
	}
	defer pool.Close()

	// Install pgfence's schema (schema "pgfence"; a no-op when it is there).
	if err := migrations.Up(ctx, migrations.Target{Pool: pool}, nil); err != nil {
		return err
	}

	// The protected table only needs a bigint column for the token.
	_, err = pool.Exec(ctx, `
		CREATE TABLE IF NOT EXISTS accounts (
			id          int PRIMARY KEY,
			balance     bigint NOT NULL,
			fence_token bigint NOT NULL DEFAULT 0);
		INSERT INTO accounts (id, balance) VALUES (42, 100) ON CONFLICT (id) DO NOTHING`)
	if err != nil {
		return err
	}

	locker, err := leasetable.New(ctx, pool, &leasetable.Config{TTL: 30 * time.Second})
	if err != nil {
		return err
	}
	defer locker.Close() // releases what it holds; never closes your pool

	deposit := fence.Update("accounts").Set("balance = balance + $1").Where("id = $2")

	var firstToken int64
	for _, amount := range []int64{10, 20} {
		err := locker.Do(ctx, "account:42", nil, func(ctx context.Context, lease pgfence.Lease) error {
			if firstToken == 0 {
				firstToken = lease.Token()
			}
			// ctx is cancelled (cause pgfence.ErrLeaseLost) if the lease is lost;
			// the token makes the row reject this write once a newer holder wrote it.
			_, err := deposit.Exec(ctx, pool, lease.Token(), amount, 42)
			return err
		})
		if err != nil {
			return err
		}
	}

	// A late write from the first holder, after its lease passed on.
	_, err = deposit.Exec(ctx, pool, firstToken, 1000, 42)
	var stale *fence.StaleTokenError
	if !errors.As(err, &stale) {
		return fmt.Errorf("the stale write was not rejected: %v", err)
	}
	fmt.Fprintf(out, "stale write rejected (pgfence.ErrFenced: %v): presented token %d, row has %d\n",
		errors.Is(err, pgfence.ErrFenced), stale.Presented, stale.Current)

	var balance int64
	if err := pool.QueryRow(ctx, "SELECT balance FROM accounts WHERE id = 42").Scan(&balance); err != nil {
		return err
	}
	fmt.Fprintln(out, "balance:", balance)
	return nil
}
