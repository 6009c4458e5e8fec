package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"text/tabwriter"

	"github.com/pgfence/pgfence/doctor"
)

const doctorHelp = `
Usage:
  pgfence doctor [flags]

Checks the database for what pgfence's guarantees need, and prints one
finding per check, each ok, warn or fail, with the fix:

  server        PostgreSQL 13 or later; YugabyteDB and CockroachDB fail,
                Neon warns (scale-to-zero ends sessions)
  standby       the server is a primary, not a standby or reader endpoint
  replication   standbys and whether each is synchronous
  schema        pgfence's schema, its version and its token sequence
  grants        what 'pgfence grant' gives, for --role (default: the role
                connected); the install's owner connecting is a warning
  pooler        a pooler in the path; transaction pooling is a warning
  notify_queue  how full the server's notification queue is
  clock         this host's clock against the server's
  timeouts      idle_in_transaction_session_timeout, lock_timeout and
                statement_timeout as the role connected gets them

It only reads, and opens two connections at once (the pooler check).
docs/doctor.md explains each check.

With --json, prints {"findings": [{"check", "level", "detail", "fix"}],
"worst": level}.

Exit codes:
  0  every finding is ok
  1  the checks could not run (database unreachable); see the message
  2  usage error
  3  warnings, no failure
  4  at least one failure

Examples:
  pgfence doctor
  pgfence doctor --role app --database postgres://owner@db/app
  pgfence doctor --json | jq '.findings[] | select(.level != "ok")'
`

// doctorJSON is the output of doctor --json.
type doctorJSON struct {
	Findings []doctor.Finding `json:"findings"`
	Worst    doctor.Level     `json:"worst"`
}

func (a *App) doctor(ctx context.Context, args []string) error {
	var database, schema, role string
	var asJSON, operator bool
	f := newFlags("doctor")
	f.String(&database, "d", "database", "URL", databaseFlagUsage)
	schemaFlag(f, &schema)
	f.String(&role, "", "role", "ROLE", "check the grants of ROLE (default: the role connected)")
	f.Bool(&operator, "", "operator", "also check the operator grant (release --force, ls --forced)")
	f.Bool(&asJSON, "", "json", "print the report as JSON")
	pos, _, err := a.parseOrHelp(f, doctorHelp, args)
	if err != nil {
		return err
	}
	if len(pos) != 0 {
		return usageErrorf("doctor takes no arguments")
	}
	if err := checkSchema(schema); err != nil {
		return err
	}
	dsn, err := connString(database)
	if err != nil {
		return err
	}
	cc, err := connConfig(dsn, "pgfence-doctor")
	if err != nil {
		return err
	}
	r, err := doctor.Check(ctx, cc, &doctor.Config{Schema: schema, Role: role, Operator: operator})
	if err != nil {
		return err
	}
	if asJSON {
		enc := json.NewEncoder(a.Stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(doctorJSON{Findings: r.Findings, Worst: r.Worst()}); err != nil {
			return err
		}
	} else {
		tw := tabwriter.NewWriter(a.Stdout, 0, 4, 2, ' ', 0)
		for _, f := range r.Findings {
			fmt.Fprintf(tw, "%s\t%s\t%s\n", strings.ToUpper(string(f.Level)), f.Check, display(f.Detail))
			if f.Fix != "" {
				fmt.Fprintf(tw, "\t\tfix: %s\n", display(f.Fix))
			}
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	switch r.Worst() {
	case doctor.Fail:
		return exitWith(ExitDoctorFail, nil)
	case doctor.Warn:
		return exitWith(ExitDoctorWarn, nil)
	}
	return nil
}
