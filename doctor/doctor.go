// Package doctor checks a deployment for what pgfence's guarantees need:
// the server and its engine, standbys and replication, the schema and its
// token sequence, a role's grants, a pooler in the path, the notification
// queue, the clock, and the timeouts the recipes depend on. Each [Finding]
// has a [Level] and, unless it is [OK], a fix. `pgfence doctor` prints the
// same report. docs/doctor.md explains each check.
package doctor

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgfence/pgfence"
	"github.com/pgfence/pgfence/internal/engine"
	"github.com/pgfence/pgfence/internal/install"
	"github.com/pgfence/pgfence/migrations"
)

// Level is how much a finding matters.
type Level string

// The levels, from best to worst.
const (
	// OK: nothing to do.
	OK Level = "ok"
	// Warn: pgfence works, with a weaker guarantee or a cost.
	Warn Level = "warn"
	// Fail: pgfence's tokens or exclusion would not hold, or it cannot run.
	Fail Level = "fail"
)

func (l Level) rank() int {
	switch l {
	case Warn:
		return 1
	case Fail:
		return 2
	}
	return 0
}

// Finding is the result of one check.
type Finding struct {
	// Check names the check: "server", "standby", "replication", "schema",
	// "grants", "pooler", "notify_queue", "clock" or "timeouts".
	Check string `json:"check"`
	// Level is the finding's level.
	Level Level `json:"level"`
	// Detail says what was found.
	Detail string `json:"detail"`
	// Fix says what to do; empty for OK.
	Fix string `json:"fix,omitempty"`
}

// Report is the outcome of [Check], in the order the checks ran.
type Report struct {
	Findings []Finding `json:"findings"`
}

// Worst returns the worst level among the findings (OK when none).
func (r Report) Worst() Level {
	w := OK
	for _, f := range r.Findings {
		if f.Level.rank() > w.rank() {
			w = f.Level
		}
	}
	return w
}

// DefaultSkewWarn is the default [Config].SkewWarn.
const DefaultSkewWarn = time.Second

// Config says what to check. A nil *Config is the zero Config.
type Config struct {
	// Schema is the schema pgfence is installed in; empty means "pgfence".
	Schema string
	// Role is the role whose grants are checked; empty means the role
	// connected.
	Role string
	// Operator also checks the operator grant (migrations.GrantOpts).
	Operator bool
	// SkewWarn is the clock difference between this host and the server
	// above which the clock check warns; zero means DefaultSkewWarn.
	SkewWarn time.Duration
}

// Check connects with cc (twice at once, for the pooler check), runs every
// check within ctx, and returns the report. It returns an error only when
// it cannot connect; a check that cannot run is a Warn finding saying why.
// cc is copied, never changed.
func Check(ctx context.Context, cc *pgx.ConnConfig, cfg *Config) (Report, error) {
	if cc == nil {
		return Report{}, errors.New("pgfence: doctor: nil ConnConfig")
	}
	var c Config
	if cfg != nil {
		c = *cfg
	}
	if c.SkewWarn <= 0 {
		c.SkewWarn = DefaultSkewWarn
	}
	schema, quoted, err := install.Schema("pgfence: doctor: Config.Schema", c.Schema)
	if err != nil {
		return Report{}, err
	}
	conn, err := pgx.ConnectConfig(ctx, cc.Copy())
	if err != nil {
		return Report{}, fmt.Errorf("pgfence: doctor: connect: %w", err)
	}
	defer closeConn(conn)
	d := &doctor{ctx: ctx, cc: cc, conn: conn, cfg: c, schema: schema, quoted: quoted}
	d.server()
	d.schemaAndGrants()
	d.pooler()
	d.notifyQueue()
	d.clock()
	d.timeouts()
	return d.report, nil
}

type doctor struct {
	ctx            context.Context
	cc             *pgx.ConnConfig
	conn           *pgx.Conn
	cfg            Config
	schema, quoted string
	report         Report
}

func (d *doctor) add(check string, level Level, detail, fix string) {
	d.report.Findings = append(d.report.Findings, Finding{Check: check, Level: level, Detail: detail, Fix: fix})
}

// cannot records a check that could not run.
func (d *doctor) cannot(check string, err error) {
	d.add(check, Warn, "could not check: "+err.Error(), "run the doctor as a role that may read the catalogs named in the error")
}

// minMajor is the oldest PostgreSQL major version pgfence's schema needs
// (pg_current_xact_id_if_assigned, gen_random_uuid).
const minMajor = 13

// serverVersionSQL reads server_version_num. No lock.
const serverVersionSQL = `SELECT pg_catalog.current_setting('server_version_num')::pg_catalog.int4`

// server checks the engine, the version, standby and replication.
func (d *doctor) server() {
	f, err := engine.Read(d.ctx, d.conn)
	if err != nil {
		d.cannot("server", err)
		return
	}
	if err := f.EngineRefusal(); err != nil { // a standby is the standby finding's
		d.add("server", Fail, err.Error(), "run pgfence on PostgreSQL")
		return
	}
	var num int
	if err := d.conn.QueryRow(d.ctx, serverVersionSQL).Scan(&num); err != nil {
		d.cannot("server", err)
		return
	}
	switch {
	case num/10000 < minMajor:
		d.add("server", Fail, fmt.Sprintf("PostgreSQL %d (%s); pgfence needs %d or later", num/10000, f.Version, minMajor), "upgrade PostgreSQL")
	case f.Kind == engine.Neon:
		d.add("server", Warn, "Neon ("+f.Version+"): a compute that scales to zero ends every session, and with them session advisory locks and LISTEN",
			"turn scale-to-zero off for the compute advisory.Locker uses, and connect to its direct endpoint, not the -pooler one")
	default:
		d.add("server", OK, f.Version, "")
	}
	if f.InRecovery {
		d.add("standby", Fail, "the server is a standby in recovery (a replica or reader endpoint): reads may be stale and nothing can be taken",
			"connect to the primary (with a multi-host URL, target_session_attrs=read-write)")
	} else {
		d.add("standby", OK, "the server is a primary", "")
	}
	if f.InRecovery {
		return
	}
	ws := f.Warnings()
	switch {
	case len(ws) > 0:
		d.add("replication", Warn, ws[0].Detail, "set synchronous_standby_names to the standbys a failover may promote (docs/ha.md)")
	case len(f.Standbys) == 0:
		d.add("replication", OK, "no standby streams from this server: a failover needs a standby (docs/ha.md)", "")
	default:
		var states []string
		for _, s := range f.Standbys {
			st := s.SyncState
			if st == "" {
				st = "state not visible to this role (needs pg_read_all_stats)"
			}
			states = append(states, fmt.Sprintf("%q %s", s.Name, st))
		}
		d.add("replication", OK, fmt.Sprintf("synchronous_standby_names = %q; standbys: %s", f.SyncNames, strings.Join(states, ", ")), "")
	}
}

// schemaAndGrants checks the install (install.Check) and the role's grants.
func (d *doctor) schemaAndGrants() {
	inst, err := install.Check(d.ctx, d.conn, d.schema, d.quoted)
	if err != nil {
		if errors.Is(err, pgfence.ErrNotInstalled) {
			d.add("schema", Fail, err.Error(), "see the message: pgfence migrate up --schema "+d.schema+" as the install's owner")
		} else {
			d.cannot("schema", err)
		}
		return
	}
	d.add("schema", OK, fmt.Sprintf("schema %q at version %d; token sequence INCREMENT %d CACHE 1 NO CYCLE", d.schema, inst.Version, install.TokenStep), "")

	role := d.cfg.Role
	if role == "" {
		if err := d.conn.QueryRow(d.ctx, "SELECT current_user::pg_catalog.text").Scan(&role); err != nil {
			d.cannot("grants", err)
			return
		}
	}
	var owner string
	err = d.conn.QueryRow(d.ctx, `SELECT pg_catalog.pg_get_userbyid(c.relowner)::pg_catalog.text FROM pg_catalog.pg_class c
		WHERE c.oid OPERATOR(pg_catalog.=) pg_catalog.to_regclass($1)`, d.quoted+".pgfence_leases").Scan(&owner)
	if err != nil {
		d.cannot("grants", err)
		return
	}
	missing, err := migrations.MissingGrants(d.ctx, d.conn, d.schema, role, &migrations.GrantOpts{Operator: d.cfg.Operator})
	if err != nil {
		d.cannot("grants", err)
		return
	}
	switch {
	case len(missing) > 0:
		d.add("grants", Fail, fmt.Sprintf("role %q lacks %s", role, strings.Join(missing, ", ")),
			fmt.Sprintf("as %q: pgfence grant --schema %s %s", owner, d.schema, role))
	case role == owner:
		d.add("grants", Warn, fmt.Sprintf("role %q owns the install: an application that connects as the owner can change pgfence's functions and tokens", role),
			"run the application as a role given pgfence grant, not as the owner")
	default:
		d.add("grants", OK, fmt.Sprintf("role %q holds what pgfence grant gives", role), "")
	}
}

// notifyQueue checks how full the notification queue is.
func (d *doctor) notifyQueue() {
	var usage float64
	if err := d.conn.QueryRow(d.ctx, "SELECT pg_catalog.pg_notification_queue_usage()").Scan(&usage); err != nil {
		d.cannot("notify_queue", err)
		return
	}
	detail := fmt.Sprintf("the notification queue is %.1f%% full", usage*100)
	switch {
	case usage >= 0.5:
		d.add("notify_queue", Fail, detail+": at 100% every NOTIFY fails, and with it every release that notifies",
			"find the session that LISTENs and does not read (often idle in a transaction) and end it")
	case usage >= 0.1:
		d.add("notify_queue", Warn, detail+": a listening session is not reading", "find the listening session that is idle in a transaction")
	default:
		d.add("notify_queue", OK, detail, "")
	}
}

// clock compares this host's clock with the server's.
func (d *doctor) clock() {
	var server time.Time
	before := time.Now()
	if err := d.conn.QueryRow(d.ctx, "SELECT pg_catalog.clock_timestamp()").Scan(&server); err != nil {
		d.cannot("clock", err)
		return
	}
	rtt := time.Since(before)
	skew := server.Sub(before.Add(rtt / 2))
	detail := fmt.Sprintf("the server's clock is %v ahead of this host's (± %v)", skew.Round(time.Millisecond), (rtt / 2).Round(time.Millisecond))
	if skew.Abs()-rtt/2 > d.cfg.SkewWarn {
		d.add("clock", Warn, detail+": expiries are judged on the server's clock, so times printed here and by ls look shifted",
			"synchronise both clocks (NTP/chrony)")
		return
	}
	d.add("clock", OK, detail, "")
}

// timeoutsSQL reads the settings of the connected role and database that
// the recipes depend on. No lock.
const timeoutsSQL = `SELECT pg_catalog.current_setting('idle_in_transaction_session_timeout'), ` +
	`pg_catalog.current_setting('lock_timeout'), pg_catalog.current_setting('statement_timeout')`

// timeouts checks idle_in_transaction_session_timeout, lock_timeout and
// statement_timeout as the connected role gets them.
func (d *doctor) timeouts() {
	var idle, lock, stmt string
	if err := d.conn.QueryRow(d.ctx, timeoutsSQL).Scan(&idle, &lock, &stmt); err != nil {
		d.cannot("timeouts", err)
		return
	}
	detail := fmt.Sprintf("idle_in_transaction_session_timeout = %s, lock_timeout = %s, statement_timeout = %s", idle, lock, stmt)
	if idle == "0" {
		d.add("timeouts", Warn, detail+": a client that stalls inside a lease-checked transaction keeps the lease row locked FOR SHARE, "+
			"and nobody can take the lease over, for as long as it stalls",
			"ALTER ROLE <app> SET idle_in_transaction_session_timeout = '1min' (longer than your longest pause inside a transaction)")
		return
	}
	d.add("timeouts", OK, detail, "")
}

func closeConn(conn *pgx.Conn) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = conn.Close(ctx)
}
