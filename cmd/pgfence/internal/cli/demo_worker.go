package cli

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence"
	"github.com/pgfence/pgfence/cmd/pgfence/internal/demo"
	"github.com/pgfence/pgfence/fence"
	"github.com/pgfence/pgfence/leasetable"
)

// demoWorkerCommand is the hidden subcommand a demo worker runs: the demo
// re-executes the pgfence binary with it, so each worker is a real process
// that can be stopped with SIGSTOP. It is not listed in the help.
const demoWorkerCommand = "demo-worker"

// envDemoDatabase passes the demo's database to its workers (not on the
// command line, where ps would show a password).
const envDemoDatabase = "PGFENCE_DEMO_DATABASE"

// envDemoSchema passes the schema pgfence is installed in to the workers.
const envDemoSchema = "PGFENCE_DEMO_SCHEMA"

// demoAcquireTimeout bounds a worker's wait for the demo's lease.
const demoAcquireTimeout = 30 * time.Second

// Reads the demo account (pgfence_demo.accounts). Locks nothing.
const demoReadSQL = `SELECT balance FROM pgfence_demo.accounts WHERE id OPERATOR(pg_catalog.=) $1`

// The unfenced write the demo contrasts with the fenced one: a plain UPDATE
// of the account row (row lock only), as most code writes it.
const demoPlainWriteSQL = `UPDATE pgfence_demo.accounts SET balance = $1 WHERE id OPERATOR(pg_catalog.=) $2`

// demoWrite is the fenced write: the same UPDATE, guarded by the token.
var demoWrite = fence.UpdateIdent(demo.AccountsTable).Set("balance = $1").Where("id = $2")

// demoWorker is `pgfence demo-worker NAME`: it serves the demo's commands
// (see package demo) on standard input and output until standard input
// ends.
func (a *App) demoWorker(ctx context.Context, args []string) error {
	if len(args) != 1 {
		return usageErrorf("internal command of 'pgfence demo'; expected a worker name")
	}
	url := os.Getenv(envDemoDatabase)
	if url == "" {
		return usageErrorf("internal command of 'pgfence demo'; %s is not set", envDemoDatabase)
	}
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		return err
	}
	defer pool.Close()
	locker, err := leasetable.New(ctx, pool, &leasetable.Config{Owner: args[0], Schema: os.Getenv(envDemoSchema)})
	if err != nil {
		return err
	}
	defer locker.Close()
	w := &demoWorkerState{pool: pool, locker: locker}
	return demo.Serve(ctx, os.Stdin, a.Stdout, w.handle)
}

// demoWorkerState is one worker's lease and pool.
type demoWorkerState struct {
	pool   *pgxpool.Pool
	locker *leasetable.Locker
	lease  pgfence.Lease
}

// handle performs one of the demo's commands: acquire, read, write,
// status, release.
func (w *demoWorkerState) handle(ctx context.Context, cmd demo.Command) demo.Event {
	switch cmd.Op {
	case "acquire":
		l, err := w.locker.Acquire(ctx, cmd.Lease, &pgfence.AcquireOpts{
			TTL: time.Duration(cmd.TTLMillis) * time.Millisecond, WaitTimeout: demoAcquireTimeout,
		})
		if err != nil {
			return demo.Event{Error: err.Error()}
		}
		w.lease = l
		return demo.Event{Token: l.Token()}
	case "read":
		var balance int64
		if err := w.pool.QueryRow(ctx, demoReadSQL, demo.AccountID).Scan(&balance); err != nil {
			return demo.Event{Error: err.Error()}
		}
		return demo.Event{Balance: balance}
	case "write":
		if w.lease == nil {
			return demo.Event{Error: "no lease"}
		}
		// The write does not look at the lease first: the worker was
		// stopped after it decided to write, as a paused process is.
		token := w.lease.Token()
		if !cmd.Fenced {
			if _, err := w.pool.Exec(ctx, demoPlainWriteSQL, cmd.Balance, demo.AccountID); err != nil {
				return demo.Event{Token: token, Error: err.Error()}
			}
			return demo.Event{Token: token, Balance: cmd.Balance}
		}
		_, err := demoWrite.Exec(ctx, w.pool, token, cmd.Balance, demo.AccountID)
		var stale *fence.StaleTokenError
		switch {
		case errors.As(err, &stale):
			return demo.Event{Token: token, Fenced: errors.Is(err, pgfence.ErrFenced), Current: stale.Current, Error: err.Error()}
		case err != nil:
			return demo.Event{Token: token, Error: err.Error()}
		}
		return demo.Event{Token: token, Balance: cmd.Balance, Fenced: false}
	case "status":
		if w.lease == nil {
			return demo.Event{Error: "no lease"}
		}
		ev := demo.Event{Token: w.lease.Token()}
		if err := w.lease.Err(); err != nil {
			ev.Lost = errors.Is(err, pgfence.ErrLeaseLost)
			ev.Error = err.Error()
		}
		return ev
	case "release":
		if w.lease == nil {
			return demo.Event{Error: "no lease"}
		}
		if err := w.lease.Release(ctx); err != nil && !errors.Is(err, pgfence.ErrNotHeld) {
			return demo.Event{Token: w.lease.Token(), Error: err.Error()}
		}
		return demo.Event{Token: w.lease.Token()}
	default:
		return demo.Event{Error: fmt.Sprintf("unknown operation %q", cmd.Op)}
	}
}
