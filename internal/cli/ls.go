package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
)

const lsHelp = `
Usage:
  pgfence ls [flags]

Lists the lease holders in pgfence_leases and the advisory locks held or
awaited in the database (from pg_locks). Times are judged on the database's
clock: a lease is held while its expires_at is after the database's now().

Names, owners and application names that hold control or other
non-printing characters are shown quoted, with Go escapes ("a\nb",
"\x1b[31m"); --json shows them as they are.

Columns:
  leases          NAME, OWNER, TOKEN (the fencing token), HELD FOR (since
                  acquired), EXPIRES IN
  advisory locks  KEY (the 64-bit key, or "k1,k2" for two 32-bit keys), MODE,
                  GRANTED (false: waiting), PID, APPLICATION, DATABASE

With --json, prints one object:
  {"now": time, "leases": [{"name", "owner", "token", "held", "acquired_at",
   "expires_at", "held_for_seconds", "expires_in_seconds"}],
   "advisory_locks": [{"key", "key1", "key2", "mode", "granted", "pid",
   "application_name", "database"}]}
where expires_in_seconds is negative for expired leases, and key is set for
64-bit keys, key1 and key2 for pairs of 32-bit keys.

Examples:
  pgfence ls
  pgfence ls --all --database postgres://app@db/app
  pgfence ls --json | jq '.leases[] | select(.name == "nightly-report")'
`

// Lease rows, judged on the database clock. Durations are computed in SQL so
// the client's clock plays no part. Reads only; locks nothing.
const listLeasesSQL = `
SELECT name, owner, fence, acquired_at, expires_at, expires_at > now() AS held,
       extract(epoch FROM now() - acquired_at)::float8 AS held_for,
       extract(epoch FROM expires_at - now())::float8 AS expires_in
FROM pgfence_leases
WHERE $1 OR expires_at > now()
ORDER BY name`

// Advisory locks in the current database. For a bigint key, classid holds
// its high 32 bits and objid its low 32 bits (objsubid 1); for a pair of
// int4 keys, classid and objid hold them (objsubid 2). Both columns are
// unsigned oids, so an int4 key is recovered by subtracting 2^32 when its
// sign bit is set. Reads only; locks nothing.
const listAdvisorySQL = `
SELECT l.objsubid,
       (l.classid::bigint << 32) | l.objid::bigint AS key,
       (l.classid::bigint - CASE WHEN l.classid::bigint >= 2147483648 THEN 4294967296 ELSE 0 END)::int4 AS key1,
       (l.objid::bigint - CASE WHEN l.objid::bigint >= 2147483648 THEN 4294967296 ELSE 0 END)::int4 AS key2,
       l.mode, l.granted, l.pid, coalesce(a.application_name, ''), coalesce(d.datname, '')
FROM pg_locks l
LEFT JOIN pg_stat_activity a ON a.pid = l.pid
LEFT JOIN pg_database d ON d.oid = l.database
WHERE l.locktype = 'advisory' AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
ORDER BY key, key1, key2, l.granted DESC, l.pid`

const dbNowSQL = `SELECT now()`

// leaseJSON is one lease row of ls --json.
type leaseJSON struct {
	Name             string    `json:"name"`
	Owner            string    `json:"owner"`
	Token            int64     `json:"token"`
	Held             bool      `json:"held"`
	AcquiredAt       time.Time `json:"acquired_at"`
	ExpiresAt        time.Time `json:"expires_at"`
	HeldForSeconds   float64   `json:"held_for_seconds"`
	ExpiresInSeconds float64   `json:"expires_in_seconds"`
}

// advisoryJSON is one advisory lock of ls --json.
type advisoryJSON struct {
	Key             *int64 `json:"key,omitempty"`
	Key1            *int32 `json:"key1,omitempty"`
	Key2            *int32 `json:"key2,omitempty"`
	Mode            string `json:"mode"`
	Granted         bool   `json:"granted"`
	PID             int32  `json:"pid"`
	ApplicationName string `json:"application_name"`
	Database        string `json:"database"`
}

// lsJSON is the output of ls --json.
type lsJSON struct {
	Now           time.Time      `json:"now"`
	Leases        []leaseJSON    `json:"leases"`
	AdvisoryLocks []advisoryJSON `json:"advisory_locks"`
}

func (a *App) ls(ctx context.Context, args []string) error {
	var database string
	var asJSON, all bool
	f := newFlags("ls")
	f.String(&database, "d", "database", "URL", databaseFlagUsage)
	f.Bool(&asJSON, "j", "json", "print JSON for scripts")
	f.Bool(&all, "a", "all", "include leases that are no longer held (released or expired rows)")
	pos, _, err := a.parseOrHelp(f, lsHelp, args)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return usageErrorf("unexpected argument %q", pos[0])
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

	out := lsJSON{Leases: []leaseJSON{}, AdvisoryLocks: []advisoryJSON{}}
	if err := conn.QueryRow(ctx, dbNowSQL).Scan(&out.Now); err != nil {
		return err
	}
	rows, _ := conn.Query(ctx, listLeasesSQL, all)
	out.Leases, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (leaseJSON, error) {
		var l leaseJSON
		err := r.Scan(&l.Name, &l.Owner, &l.Token, &l.AcquiredAt, &l.ExpiresAt, &l.Held, &l.HeldForSeconds, &l.ExpiresInSeconds)
		return l, err
	})
	if err != nil {
		return fmt.Errorf("list leases: %w", explainSchemaError(err))
	}
	rows, _ = conn.Query(ctx, listAdvisorySQL)
	out.AdvisoryLocks, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (advisoryJSON, error) {
		var l advisoryJSON
		var subid int16
		var key int64
		var k1, k2 int32
		err := r.Scan(&subid, &key, &k1, &k2, &l.Mode, &l.Granted, &l.PID, &l.ApplicationName, &l.Database)
		if subid == 2 {
			l.Key1, l.Key2 = &k1, &k2
		} else {
			l.Key = &key
		}
		return l, err
	})
	if err != nil {
		return fmt.Errorf("list advisory locks: %w", err)
	}
	if asJSON {
		enc := json.NewEncoder(a.Stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(out)
	}
	return printLs(a.Stdout, out, all)
}

func printLs(w io.Writer, out lsJSON, all bool) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	if len(out.Leases) == 0 {
		if all {
			fmt.Fprintln(tw, "No leases.")
		} else {
			fmt.Fprintln(tw, "No lease is held.")
		}
	} else {
		fmt.Fprintln(tw, "LEASE\tOWNER\tTOKEN\tHELD FOR\tEXPIRES IN")
		for _, l := range out.Leases {
			heldFor, expiresIn := "-", "expired "+seconds(-l.ExpiresInSeconds)+" ago"
			if l.Held {
				heldFor, expiresIn = seconds(l.HeldForSeconds), seconds(l.ExpiresInSeconds)
			}
			fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\n", display(l.Name), display(l.Owner), l.Token, heldFor, expiresIn)
		}
	}
	fmt.Fprintln(tw)
	if len(out.AdvisoryLocks) == 0 {
		fmt.Fprintln(tw, "No advisory lock is held or awaited.")
	} else {
		fmt.Fprintln(tw, "ADVISORY KEY\tMODE\tGRANTED\tPID\tAPPLICATION\tDATABASE")
		for _, l := range out.AdvisoryLocks {
			key := ""
			if l.Key != nil {
				key = strconv.FormatInt(*l.Key, 10)
			} else {
				key = fmt.Sprintf("%d,%d", *l.Key1, *l.Key2)
			}
			fmt.Fprintf(tw, "%s\t%s\t%t\t%d\t%s\t%s\n", key, display(l.Mode), l.Granted, l.PID, display(l.ApplicationName), display(l.Database))
		}
	}
	return tw.Flush()
}

// display returns s for a table cell: as it is when every character is
// printable, else quoted and escaped as Go's %q does ("a\nb", "\x1b[31m").
// Lease names, owners and application names are chosen by any client, so a
// terminal must not interpret them: control characters (C0, DEL, C1), tabs
// (which would shift the columns), other non-printing characters such as
// bidirectional overrides, and invalid UTF-8 are all escaped. A value that
// starts with a double quote is quoted too, so a quoted cell is never
// mistaken for a name that looks like one. JSON output is not affected.
func display(s string) string {
	if strings.HasPrefix(s, `"`) || !utf8.ValidString(s) {
		return strconv.Quote(s)
	}
	for _, r := range s {
		if !strconv.IsPrint(r) {
			return strconv.Quote(s)
		}
	}
	return s
}

// seconds formats a duration given in seconds for people: "4.2s" under a
// minute, "3m12s" or "2h0m5s" above.
func seconds(s float64) string {
	d := time.Duration(s * float64(time.Second))
	if d < time.Minute {
		return d.Round(100 * time.Millisecond).String()
	}
	return d.Round(time.Second).String()
}
