package cli

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/user"

	"github.com/jackc/pgx/v5"

	"github.com/pgfence/pgfence/leasetable"
)

// forceOwnerPrefix starts the owner written into a force-released lease's
// row, so ls and the row itself show who ended it.
const forceOwnerPrefix = "pgfence-cli:force-release"

const releaseHelp = `
Usage:
  pgfence release --force [flags] NAME

An operator's override: ends the lease NAME whoever holds it. In one
statement, the lease row gets a fresh fencing token (pgfence_next_token())
and expires now, and waiters are notified on channel ` + leasetable.NotifyChannel + `.
A holder that still believes in the lease then fails to renew it (renewal
requires its own token and an unexpired row), and its guarded writes carry
an older token than the next holder's, so they are rejected.

The holder is not stopped: it finds out when it next renews or writes. Use
this when a holder is stuck or gone and you cannot wait for its TTL.

Asks for confirmation unless --yes; without a terminal, --yes is required.

Examples:
  pgfence release --force nightly-report
  pgfence release --force --yes account:42 --database postgres://ops@db/app
`

// Reads the lease about to be released, for the confirmation prompt. Locks
// nothing.
const getLeaseSQL = `
SELECT owner, fence, expires_at > now(), extract(epoch FROM expires_at - now())::float8
FROM pgfence_leases WHERE name = $1`

// Force-releases a lease in one statement: locks the row (FOR UPDATE) to
// read its previous holder, gives it a fresh token and expires it now, and
// notifies waiters. pgfence_next_token() makes the transaction commit
// durably, so the new token is never reissued after a crash.
const forceReleaseSQL = `
WITH released AS (
    UPDATE pgfence_leases l
    SET fence = pgfence_next_token(), expires_at = now(), owner = $2
    FROM (SELECT name, owner, fence, expires_at FROM pgfence_leases WHERE name = $1 FOR UPDATE) old
    WHERE l.name = old.name
    RETURNING old.owner AS old_owner, old.fence AS old_token, old.expires_at > now() AS was_held, l.fence AS token
)
SELECT r.old_owner, r.old_token, r.was_held, r.token
FROM released r, LATERAL (SELECT pg_notify($3, $1)) n`

func (a *App) release(ctx context.Context, args []string) error {
	var database string
	var force, yes bool
	f := newFlags("release")
	f.Bool(&force, "f", "force", "required: release the lease whoever holds it")
	f.Bool(&yes, "y", "yes", "do not ask for confirmation")
	f.String(&database, "d", "database", "URL", databaseFlagUsage)
	pos, _, err := a.parseOrHelp(f, releaseHelp, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return usageErrorf("expected one lease name")
	}
	name := pos[0]
	if !force {
		return usageErrorf("release only ends another owner's lease: pass --force to confirm that is what you want")
	}
	if name == "" {
		return usageErrorf("the lease name is empty")
	}
	dsn, err := connString(database)
	if err != nil {
		return err
	}
	conn, err := connect(ctx, dsn)
	if err != nil {
		return err
	}
	defer closeConn(ctx, conn)

	var owner string
	var token int64
	var held bool
	var expiresIn float64
	err = conn.QueryRow(ctx, getLeaseSQL, name).Scan(&owner, &token, &held, &expiresIn)
	if errors.Is(err, pgx.ErrNoRows) {
		return fmt.Errorf("no lease named %q (see 'pgfence ls --all')", name)
	}
	if err != nil {
		return explainSchemaError(err)
	}
	state := fmt.Sprintf("held by %q with token %d, expires in %s", owner, token, seconds(expiresIn))
	if !held {
		state = fmt.Sprintf("not held (last owner %q, token %d, expired %s ago)", owner, token, seconds(-expiresIn))
	}
	if err := a.confirm(fmt.Sprintf("Lease %q is %s.\nForce-release it? Its holder will be fenced out.", name, state), yes); err != nil {
		return err
	}

	var oldOwner string
	var oldToken, newToken int64
	var wasHeld bool
	err = conn.QueryRow(ctx, forceReleaseSQL, name, forceOwner(), leasetable.NotifyChannel).Scan(&oldOwner, &oldToken, &wasHeld, &newToken)
	if errors.Is(err, pgx.ErrNoRows) {
		return fmt.Errorf("no lease named %q: it was removed meanwhile", name)
	}
	if err != nil {
		return explainSchemaError(err)
	}
	was := "was held by"
	if !wasHeld {
		was = "was not held; last owner"
	}
	fmt.Fprintf(a.Stdout, "released %q: token %d -> %d (%s %q)\n", name, oldToken, newToken, was, oldOwner)
	return nil
}

// forceOwner names the operator in the released row's owner column:
// "pgfence-cli:force-release by user@host".
func forceOwner() string {
	who := "unknown"
	if u, err := user.Current(); err == nil {
		who = u.Username
	}
	if h, err := os.Hostname(); err == nil {
		who += "@" + h
	}
	o := forceOwnerPrefix + " by " + who
	if len(o) > 512 {
		o = o[:512]
	}
	return o
}
