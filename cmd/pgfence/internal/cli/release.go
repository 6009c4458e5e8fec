package cli

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/user"

	"github.com/pgfence/pgfence/leasetable"
)

// forceReasonPrefix starts the default reason recorded for a forced
// release, so the audit trail shows it came from this command.
const forceReasonPrefix = "pgfence-cli: release --force"

const releaseHelp = `
Usage:
  pgfence release --force [flags] NAME

An operator's override: ends the lease NAME whoever holds it. In one
statement (<schema>.pgfence_force_release), the lease row gets a fresh
fencing token and expires now, and waiters are notified on channel
` + leasetable.NotifyChannel + `. A holder that still believes in the lease then
fails to renew it (renewal requires its own token and an unexpired row), and
its guarded writes carry an older token than the next holder's, so they are
rejected.

The release is recorded in <schema>.pgfence_forced_releases with the reason
(--reason, else who ran this command where), the database user and the
client address, and in the server log; 'pgfence ls --forced' lists it. The
role needs pgfence's operator grant ('pgfence grant ROLE --operator').

The holder is not stopped: it finds out when it next renews or writes. Use
this when a holder is stuck or gone and you cannot wait for its TTL.

Asks for confirmation unless --yes; without a terminal, --yes is required.

Examples:
  pgfence release --force nightly-report
  pgfence release --force --yes account:42 --reason "worker-7 hung, ticket OPS-12" --database postgres://ops@db/app
`

// releasePoolMaxConns: release runs one statement at a time.
const releasePoolMaxConns = 2

func (a *App) release(ctx context.Context, args []string) error {
	var database, schema, reason string
	var force, yes bool
	f := newFlags("release")
	f.Bool(&force, "f", "force", "required: release the lease whoever holds it")
	f.Bool(&yes, "y", "yes", "do not ask for confirmation")
	f.String(&reason, "r", "reason", "TEXT", "why, for the audit trail (default: who ran this command, and where)")
	f.String(&database, "d", "database", "URL", databaseFlagUsage)
	schemaFlag(f, &schema)
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
	if err := checkName(name); err != nil {
		return err
	}
	if len(reason) > leasetable.MaxNameLength {
		return usageErrorf("--reason is %d bytes long; at most %d are allowed", len(reason), leasetable.MaxNameLength)
	}
	if reason == "" {
		reason = defaultForceReason()
	}
	if err := checkSchema(schema); err != nil {
		return err
	}
	dsn, err := connString(database)
	if err != nil {
		return err
	}
	pool, err := newPool(ctx, dsn, "pgfence release", releasePoolMaxConns)
	if err != nil {
		return err
	}
	defer pool.Close()
	locker, err := leasetable.New(ctx, pool, &leasetable.Config{Schema: schema, DisableListen: true, Logger: a.logger()})
	if err != nil {
		return explainSchemaError(err, schema)
	}
	defer locker.Close()

	info, held, err := locker.Get(ctx, name)
	if err != nil {
		return explainSchemaError(err, schema)
	}
	state := "not held now"
	if held {
		state = fmt.Sprintf("held by %q with token %d, expires %s", info.Owner, info.Token, info.ExpiresAt.Local().Format("15:04:05 (database clock)"))
	}
	if err := a.confirm(fmt.Sprintf("Lease %q is %s.\nForce-release it? Its holder will be fenced out.", name, state), yes); err != nil {
		return err
	}

	r, err := locker.ForceRelease(ctx, name, reason)
	if errors.Is(err, leasetable.ErrNoLease) {
		return fmt.Errorf("no lease named %q (see 'pgfence ls')", name)
	}
	if err != nil {
		return explainSchemaError(err, schema)
	}
	was := "was held by"
	if !r.WasHeld {
		was = "was not held; last owner"
	}
	fmt.Fprintf(a.Stdout, "released %q: token %d -> %d (%s %q); recorded with reason %q\n",
		name, r.OldToken, r.Token, was, r.OldOwner, reason)
	return nil
}

// defaultForceReason names the operator, for the audit trail:
// "pgfence-cli: release --force by user@host".
func defaultForceReason() string {
	who := "unknown"
	if u, err := user.Current(); err == nil {
		who = u.Username
	}
	if h, err := os.Hostname(); err == nil {
		who += "@" + h
	}
	o := forceReasonPrefix + " by " + who
	if len(o) > leasetable.MaxNameLength {
		o = o[:leasetable.MaxNameLength]
	}
	return o
}
