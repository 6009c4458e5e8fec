package cli

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/pgfence/pgfence/leasetable"
)

const pruneHelp = `
Usage:
  pgfence prune [flags]

Deletes the rows of <schema>.pgfence_leases whose lease expired or was
released more than --older-than ago (default 24h), judged on the database's
clock. A lease table keeps one row per lease name ever used, so a service
that takes a lease per entity ("account:42" for every account) grows it by a
row per name; run this from cron to bound it. Held leases and rows that
expired more recently are never touched, and rows another transaction has
locked are left for the next run.

It works in batches of a few thousand rows, each its own short statement.
Before deleting a batch it waits for the transactions that were writing
pgfence_leases when it read the batch (usually milliseconds), so an acquirer
in flight cannot re-create a pruned name with an older fencing token; the
next holder of a pruned name gets a larger token than any before. SIGINT or
SIGTERM stops it (exit status 1); what was deleted stays deleted.

Prints how many rows were deleted. With --json, prints one object:
  {"deleted": N, "older_than_seconds": S}

Examples:
  pgfence prune
  pgfence prune --older-than 168h --database postgres://ops@db/app
  # crontab: every hour
  0 * * * * pgfence prune --json >> /var/log/pgfence-prune.log
`

// prunePoolMaxConns: Prune runs one statement at a time.
const prunePoolMaxConns = 2

// pruneJSON is the output of prune --json.
type pruneJSON struct {
	Deleted          int64   `json:"deleted"`
	OlderThanSeconds float64 `json:"older_than_seconds"`
}

func (a *App) prune(ctx context.Context, args []string) error {
	var database, schema string
	var asJSON bool
	olderThan := leasetable.DefaultPruneAge
	f := newFlags("prune")
	f.Duration(&olderThan, "", "older-than", "delete rows whose lease ended more than DURATION ago; at least "+leasetable.MinPruneAge.String())
	f.Bool(&asJSON, "j", "json", "print JSON for scripts")
	f.String(&database, "d", "database", "URL", databaseFlagUsage)
	schemaFlag(f, &schema)
	pos, _, err := a.parseOrHelp(f, pruneHelp, args)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return usageErrorf("unexpected argument %q", pos[0])
	}
	if olderThan < leasetable.MinPruneAge {
		return usageErrorf("--older-than must be at least %v, not %v", leasetable.MinPruneAge, olderThan)
	}
	_, locker, done, err := a.openLocker(ctx, database, schema, "pgfence prune", prunePoolMaxConns)
	if err != nil {
		return err
	}
	defer done()

	deleted, err := locker.Prune(ctx, olderThan)
	if err != nil {
		return explainSchemaError(err, schema)
	}
	if asJSON {
		enc := json.NewEncoder(a.Stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(pruneJSON{Deleted: deleted, OlderThanSeconds: olderThan.Seconds()})
	}
	rows := "rows"
	if deleted == 1 {
		rows = "row"
	}
	fmt.Fprintf(a.Stdout, "pruned %d %s of leases that ended more than %v ago\n", deleted, rows, olderThan)
	return nil
}
