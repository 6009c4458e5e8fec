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

	"github.com/pgfence/pgfence"
	"github.com/pgfence/pgfence/leader"
	"github.com/pgfence/pgfence/leasetable"
)

const lsHelp = `
Usage:
  pgfence ls [flags]
  pgfence ls --terms [flags]
  pgfence ls --forced [flags]
  pgfence ls --jobs [flags]

Lists the leases held in <schema>.pgfence_leases, the leaders of the
elections (package leader: <schema>.pgfence_leaders) and the advisory locks
held or awaited in the database (from pg_locks). Times are judged on the
database's clock: a lease is held while its expires_at is after the
database's now(). A lease that was released or expired is not listed; an
election whose last term ended is listed with no leader.

With --terms, lists instead the recent terms of every election (the newest
ten of each), newest first.

With --forced, lists instead the audit trail of forced releases
(<schema>.pgfence_forced_releases, written by 'pgfence release --force'),
newest first; reading it needs pgfence's operator grant.

With --jobs, lists instead the newest slots of each scheduled job
(<schema>.pgfence_slots, written by package schedule and 'pgfence run
--every/--slot'), newest first within each job: --limit of each (default
10).

Names, owners, reasons and application names that hold control or other
non-printing characters are shown quoted, with Go escapes ("a\nb",
"\x1b[31m"); --json shows them as they are.

A semaphore's permits (pgfence run --permits) are leases named NAME, the
byte 0x1f, the slot: listed with the leases (quoted, as 'pgfence release
--force' also takes them), and summed up per semaphore with a permit held.
WAITING counts the processes (Lockers) with a caller waiting for a permit,
registered in the database to be woken (an advisory lock in pg_locks), not
the callers: one pgfence run waiting counts 1, a program with ten calls
waiting in one Locker counts 1 too. A Locker stays registered about a second
after its last caller stopped waiting; one without LISTEN is not counted.

Columns:
  leases            NAME, OWNER, TOKEN (the fencing token), HELD FOR (since
                    acquired), EXPIRES IN
  semaphores        SEMAPHORE, IN USE (permits held), PERMITS, WAITING
                    (Lockers with a caller waiting for a permit)
  leaders           ELECTION, LEADER (the value it proclaimed, "-" when
                    nobody leads), OWNER, TERM (the term's fencing token),
                    LEADING FOR, EXPIRES IN
  terms             ELECTION, TERM, LEADER, OWNER, BEGAN AT, STATE (leading,
                    or ended)
  advisory locks    KEY (the 64-bit key, or "k1,k2" for two 32-bit keys), MODE,
                    GRANTED (false: waiting), PID, APPLICATION, DATABASE
  forced releases   RELEASED AT, LEASE, OLD OWNER, OLD TOKEN, NEW TOKEN, WAS
                    HELD, BY (database user), FROM (client address), REASON
  job slots         JOB, SLOT, STATE (running, done, failed), OWNER (who ran
                    it last), TOKEN (its lease's), ATTEMPTS, STARTED AT,
                    DURATION ("-" while running), ERROR (a failed run's)

With --json, prints one object:
  {"now": time, "leases": [{"name", "owner", "token", "held", "acquired_at",
   "expires_at", "held_for_seconds", "expires_in_seconds"}],
   "semaphores": [{"name", "permits", "in_use", "waiting"}],
   "leaders": [{"election", "leading", "token", "owner", "value",
   "proclaimed", "began_at", "expires_at", "leading_for_seconds",
   "expires_in_seconds"}],
   "advisory_locks": [{"key", "key1", "key2", "mode", "granted", "pid",
   "application_name", "database"}]}
where key is set for 64-bit keys, key1 and key2 for pairs of 32-bit keys,
and a leader's other fields are zero (times null) when nobody leads;
with --terms:
  {"terms": [{"election", "token", "owner", "value", "began_at", "leading",
   "expires_at"}]}
with --forced:
  {"forced_releases": [{"name", "old_owner", "old_token", "was_held",
   "token", "reason", "released_by", "client_addr", "released_at"}]}
where client_addr is empty for a unix-socket client;
with --jobs:
  {"slots": [{"job", "slot", "state", "owner", "token", "attempts",
   "started_at", "finished_at", "duration_seconds", "error"}]}
where finished_at and duration_seconds are null while running.

Examples:
  pgfence ls
  pgfence ls --database postgres://app@db/app --schema pgfence
  pgfence ls --json | jq '.leases[] | select(.name == "nightly-report")'
  pgfence ls --json | jq -r '.leaders[] | select(.election == "scheduler") | .value'
  pgfence ls --terms
  pgfence ls --forced --limit 10
  pgfence ls --jobs --limit 3
`

// Advisory locks in the current database. For a bigint key, classid holds
// its high 32 bits and objid its low 32 bits (objsubid 1); for a pair of
// int4 keys, classid and objid hold them (objsubid 2). Both columns are
// unsigned oids, so an int4 key is recovered by subtracting 2^32 when its
// sign bit is set. Reads only; locks nothing. Built-ins are qualified, so the
// session's search_path cannot redirect them.
const listAdvisorySQL = `
SELECT l.objsubid,
       (l.classid::pg_catalog.int8 OPERATOR(pg_catalog.<<) 32) OPERATOR(pg_catalog.|) l.objid::pg_catalog.int8 AS key,
       (l.classid::pg_catalog.int8 OPERATOR(pg_catalog.-) CASE WHEN l.classid::pg_catalog.int8 OPERATOR(pg_catalog.>=) 2147483648
            THEN 4294967296 ELSE 0 END)::pg_catalog.int4 AS key1,
       (l.objid::pg_catalog.int8 OPERATOR(pg_catalog.-) CASE WHEN l.objid::pg_catalog.int8 OPERATOR(pg_catalog.>=) 2147483648
            THEN 4294967296 ELSE 0 END)::pg_catalog.int4 AS key2,
       l.mode, l.granted, l.pid, coalesce(a.application_name, ''), coalesce(d.datname::pg_catalog.text, '')
FROM pg_catalog.pg_locks l
LEFT JOIN pg_catalog.pg_stat_activity a ON a.pid OPERATOR(pg_catalog.=) l.pid
LEFT JOIN pg_catalog.pg_database d ON d.oid OPERATOR(pg_catalog.=) l.database
WHERE l.locktype OPERATOR(pg_catalog.=) 'advisory'
  AND l.database OPERATOR(pg_catalog.=) (SELECT oid FROM pg_catalog.pg_database
                                         WHERE datname OPERATOR(pg_catalog.=) pg_catalog.current_database())
ORDER BY key, key1, key2, l.granted DESC, l.pid`

// The database's clock. Reads nothing.
const dbNowSQL = `SELECT pg_catalog.now()`

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

// leaderJSON is one election of ls --json: its current leader, if any.
type leaderJSON struct {
	Election          string     `json:"election"`
	Leading           bool       `json:"leading"`
	Token             int64      `json:"token"`
	Owner             string     `json:"owner"`
	Value             string     `json:"value"`
	Proclaimed        bool       `json:"proclaimed"`
	BeganAt           *time.Time `json:"began_at"`
	ExpiresAt         *time.Time `json:"expires_at"`
	LeadingForSeconds float64    `json:"leading_for_seconds"`
	ExpiresInSeconds  float64    `json:"expires_in_seconds"`
}

// termJSON is one term of ls --terms --json.
type termJSON struct {
	Election  string     `json:"election"`
	Token     int64      `json:"token"`
	Owner     string     `json:"owner"`
	Value     string     `json:"value"`
	BeganAt   time.Time  `json:"began_at"`
	Leading   bool       `json:"leading"`
	ExpiresAt *time.Time `json:"expires_at,omitempty"`
}

// semaphoreJSON is one semaphore with a permit held, in ls --json.
type semaphoreJSON struct {
	Name    string `json:"name"`
	Permits int    `json:"permits"`
	InUse   int    `json:"in_use"`
	Waiting int    `json:"waiting"`
}

// lsJSON is the output of ls --json.
type lsJSON struct {
	Now           time.Time       `json:"now"`
	Leases        []leaseJSON     `json:"leases"`
	Semaphores    []semaphoreJSON `json:"semaphores"`
	Leaders       []leaderJSON    `json:"leaders"`
	AdvisoryLocks []advisoryJSON  `json:"advisory_locks"`
}

// forcedJSON is one forced release of ls --forced --json.
type forcedJSON struct {
	Name       string    `json:"name"`
	OldOwner   string    `json:"old_owner"`
	OldToken   int64     `json:"old_token"`
	WasHeld    bool      `json:"was_held"`
	Token      int64     `json:"token"`
	Reason     string    `json:"reason"`
	ReleasedBy string    `json:"released_by"`
	ClientAddr string    `json:"client_addr"`
	ReleasedAt time.Time `json:"released_at"`
}

// lsPoolMaxConns: ls runs one statement at a time.
const lsPoolMaxConns = 2

// defaultForcedLimit is how many forced releases ls --forced shows.
const defaultForcedLimit = 50

func (a *App) ls(ctx context.Context, args []string) error {
	var database, schema string
	var asJSON, forced, terms, jobs bool
	limit := defaultForcedLimit
	f := newFlags("ls")
	f.String(&database, "d", "database", "URL", databaseFlagUsage)
	schemaFlag(f, &schema)
	f.Bool(&asJSON, "j", "json", "print JSON for scripts")
	f.Bool(&forced, "", "forced", "list the forced releases (the audit trail of release --force) instead")
	f.Bool(&terms, "", "terms", "list the recent terms of every election instead")
	f.Bool(&jobs, "", "jobs", "list the recent slots of every scheduled job instead")
	f.fs.IntVar(&limit, "limit", limit, "")
	f.add("", "limit", "N", fmt.Sprintf("with --forced: show the newest N (default %d); with --jobs: the newest N of each job (default %d)",
		defaultForcedLimit, defaultJobsLimit), "")
	pos, _, err := a.parseOrHelp(f, lsHelp, args)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return usageErrorf("unexpected argument %q", pos[0])
	}
	if limit <= 0 {
		return usageErrorf("--limit must be positive, not %d", limit)
	}
	if forced && terms || jobs && (forced || terms) {
		return usageErrorf("--forced, --terms and --jobs list different things: pass one")
	}
	if jobs && !f.set("", "limit") {
		limit = defaultJobsLimit
	}
	pool, locker, done, err := a.openLocker(ctx, database, schema, "pgfence ls", lsPoolMaxConns)
	if err != nil {
		return err
	}
	defer done()
	if forced {
		return a.lsForced(ctx, locker, schema, limit, asJSON)
	}
	if terms {
		return a.lsTerms(ctx, pool, schema, asJSON)
	}
	if jobs {
		return a.lsJobs(ctx, pool, schema, limit, asJSON)
	}

	out := lsJSON{Leases: []leaseJSON{}, Semaphores: []semaphoreJSON{}, Leaders: []leaderJSON{}, AdvisoryLocks: []advisoryJSON{}}
	// The clock is read before the leases, so every lease List finds held
	// (expires_at after its own, later now()) expires after out.Now too.
	if err := pool.QueryRow(ctx, dbNowSQL).Scan(&out.Now); err != nil {
		return err
	}
	infos, err := locker.List(ctx)
	if err != nil {
		return explainSchemaError(err, schema)
	}
	for _, i := range infos {
		out.Leases = append(out.Leases, leaseJSON{
			Name: i.Name, Owner: i.Owner, Token: i.Token, Held: true,
			AcquiredAt: jsonTime(i.AcquiredAt), ExpiresAt: jsonTime(i.ExpiresAt),
			// A lease acquired after out.Now was read has been held
			// for no time at all on that clock.
			HeldForSeconds:   max(0, out.Now.Sub(i.AcquiredAt).Seconds()),
			ExpiresInSeconds: i.ExpiresAt.Sub(out.Now).Seconds(),
		})
	}
	sems, err := locker.Semaphores(ctx)
	if err != nil {
		return explainSchemaError(err, schema)
	}
	for _, s := range sems {
		out.Semaphores = append(out.Semaphores, semaphoreJSON{Name: s.Name, Permits: s.Permits, InUse: s.InUse, Waiting: s.Waiting})
	}
	elections, err := leader.List(ctx, pool, schema)
	if err != nil {
		return explainSchemaError(err, schema)
	}
	for _, e := range elections {
		l := leaderJSON{Election: e.Election, Leading: e.Leading}
		if e.Leading {
			began, expires := jsonTime(e.BeganAt), jsonTime(e.ExpiresAt)
			l.Token, l.Owner, l.Value, l.Proclaimed = e.Token, e.Owner, e.Value, e.Proclaimed
			l.BeganAt, l.ExpiresAt = &began, &expires
			l.LeadingForSeconds = max(0, out.Now.Sub(began).Seconds())
			l.ExpiresInSeconds = expires.Sub(out.Now).Seconds()
		}
		out.Leaders = append(out.Leaders, l)
	}
	rows, _ := pool.Query(ctx, listAdvisorySQL)
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
	return printLs(a.Stdout, out)
}

// lsTerms is ls --terms.
func (a *App) lsTerms(ctx context.Context, db pgfence.DB, schema string, asJSON bool) error {
	terms, err := leader.Terms(ctx, db, schema)
	if err != nil {
		return fmt.Errorf("list terms: %w", explainSchemaError(err, schema))
	}
	out := struct {
		Terms []termJSON `json:"terms"`
	}{Terms: []termJSON{}}
	for _, t := range terms {
		j := termJSON{Election: t.Election, Token: t.Token, Owner: t.Owner, Value: t.Value, BeganAt: jsonTime(t.BeganAt), Leading: t.Leading}
		if t.Leading {
			expires := jsonTime(t.ExpiresAt)
			j.ExpiresAt = &expires
		}
		out.Terms = append(out.Terms, j)
	}
	if asJSON {
		enc := json.NewEncoder(a.Stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(out)
	}
	return printTerms(a.Stdout, out.Terms)
}

func printTerms(w io.Writer, terms []termJSON) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	if len(terms) == 0 {
		fmt.Fprintln(tw, "No election has had a term.")
		return tw.Flush()
	}
	fmt.Fprintln(tw, "ELECTION\tTERM\tLEADER\tOWNER\tBEGAN AT\tSTATE")
	for _, t := range terms {
		state := "ended"
		if t.Leading {
			state = "leading"
		}
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\t%s\n", display(t.Election), t.Token, displayValue(t.Value), display(t.Owner),
			t.BeganAt.Local().Format(time.RFC3339), state)
	}
	return tw.Flush()
}

// lsForced is ls --forced.
func (a *App) lsForced(ctx context.Context, locker *leasetable.Locker, schema string, limit int, asJSON bool) error {
	frs, err := locker.ForcedReleases(ctx, limit)
	if err != nil {
		return fmt.Errorf("list forced releases: %w", explainSchemaError(err, schema))
	}
	out := struct {
		ForcedReleases []forcedJSON `json:"forced_releases"`
	}{ForcedReleases: []forcedJSON{}}
	for _, r := range frs {
		addr := ""
		if r.ClientAddr.IsValid() {
			addr = r.ClientAddr.String()
		}
		out.ForcedReleases = append(out.ForcedReleases, forcedJSON{
			Name: r.Name, OldOwner: r.OldOwner, OldToken: r.OldToken, WasHeld: r.WasHeld, Token: r.Token,
			Reason: r.Reason, ReleasedBy: r.ReleasedBy, ClientAddr: addr, ReleasedAt: r.ReleasedAt,
		})
	}
	if asJSON {
		enc := json.NewEncoder(a.Stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(out)
	}
	tw := tabwriter.NewWriter(a.Stdout, 0, 4, 2, ' ', 0)
	if len(out.ForcedReleases) == 0 {
		fmt.Fprintln(tw, "No lease was force-released.")
		return tw.Flush()
	}
	fmt.Fprintln(tw, "RELEASED AT\tLEASE\tOLD OWNER\tOLD TOKEN\tNEW TOKEN\tWAS HELD\tBY\tFROM\tREASON")
	for _, r := range out.ForcedReleases {
		from := r.ClientAddr
		if from == "" {
			from = "local"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\t%t\t%s\t%s\t%s\n", r.ReleasedAt.Local().Format(time.RFC3339),
			display(r.Name), display(r.OldOwner), r.OldToken, r.Token, r.WasHeld, display(r.ReleasedBy), from, display(r.Reason))
	}
	return tw.Flush()
}

func printLs(w io.Writer, out lsJSON) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	if len(out.Leases) == 0 {
		fmt.Fprintln(tw, "No lease is held.")
	} else {
		fmt.Fprintln(tw, "LEASE\tOWNER\tTOKEN\tHELD FOR\tEXPIRES IN")
		for _, l := range out.Leases {
			heldFor, expiresIn := seconds(l.HeldForSeconds), seconds(l.ExpiresInSeconds)
			fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\n", display(l.Name), display(l.Owner), l.Token, heldFor, expiresIn)
		}
	}
	if len(out.Semaphores) > 0 {
		fmt.Fprintln(tw)
		fmt.Fprintln(tw, "SEMAPHORE\tIN USE\tPERMITS\tWAITING")
		for _, s := range out.Semaphores {
			fmt.Fprintf(tw, "%s\t%d\t%d\t%d\n", display(s.Name), s.InUse, s.Permits, s.Waiting)
		}
	}
	if len(out.Leaders) > 0 {
		fmt.Fprintln(tw)
		fmt.Fprintln(tw, "ELECTION\tLEADER\tOWNER\tTERM\tLEADING FOR\tEXPIRES IN")
		for _, l := range out.Leaders {
			if !l.Leading {
				fmt.Fprintf(tw, "%s\t-\t-\t-\t-\t-\n", display(l.Election))
				continue
			}
			value := displayValue(l.Value)
			if !l.Proclaimed {
				value = "(not proclaimed)"
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\t%s\n", display(l.Election), value, display(l.Owner), l.Token,
				seconds(l.LeadingForSeconds), seconds(l.ExpiresInSeconds))
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

// displayValue is display for a leader's value, which may be empty: that
// shows as "".
func displayValue(s string) string {
	if s == "" {
		return `""`
	}
	return display(s)
}

// seconds formats a duration given in seconds for people: "4.2s" under a
// minute, "3m12s" or "2h0m5s" above.
func seconds(s float64) string {
	if s >= maxSeconds || s <= -maxSeconds {
		// A time no pgfence function writes (an expiry beyond its 7-day
		// bound, set by hand): shown as it is, never as an overflow.
		return fmt.Sprintf("%.0fs", s)
	}
	d := time.Duration(s * float64(time.Second))
	if d < time.Minute {
		return d.Round(100 * time.Millisecond).String()
	}
	return d.Round(time.Second).String()
}

// maxSeconds is the largest number of seconds seconds formats as a duration.
const maxSeconds = float64(1<<63-1) / float64(time.Second)

// jsonTime returns t, or the last instant of year 9999 for a later t, which
// JSON's timestamps (RFC 3339) cannot write.
func jsonTime(t time.Time) time.Time {
	if last := time.Date(9999, 12, 31, 23, 59, 59, 999999999, time.UTC); t.After(last) {
		return last
	}
	return t
}
