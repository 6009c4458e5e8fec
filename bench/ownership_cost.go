package main

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgfence/pgfence"
	"github.com/pgfence/pgfence/bench/internal/report"
	"github.com/pgfence/pgfence/bench/internal/systems"
	"github.com/pgfence/pgfence/leasetable"
	"github.com/pgfence/pgfence/migrations"
)

// Scenario 13 measures what the ownership secret (a secret drawn per
// acquisition and required by renew and release; keyed notification
// payloads, from schema version 12 on) costs per call: the same lease
// statements on two databases of the benchmark's server, one with schema
// version 11 (systems.SchemaV11), one migrated to the latest.

// ownershipArm is one database of scenario 13: the schema version it is
// migrated to and the statements a Locker of that version sends.
type ownershipArm struct {
	Version                 uint // 0: the latest, with migrations.Up; else 11, systems.SchemaV11
	acquire, renew, release string
	secret                  bool // acquire returns a secret; renew and release take it as $3
}

// ownershipArms are version 11 and the latest. The statements are
// leasetable's at version 11 and now (acquireSQL, renewSQL and releaseSQL),
// with the schema "pgfence".
var ownershipArms = []ownershipArm{
	{
		Version: 11,
		acquire: `SELECT acquired, name, owner, fence, acquired_at, expires_at, db_now FROM "pgfence".pgfence_acquire($1, $2, $3)`,
		renew:   `SELECT "pgfence".pgfence_renew($1, $2, $3)`,
		release: `SELECT fence, durability FROM "pgfence".pgfence_release($1, $2, $3, $4)`,
	},
	{
		acquire: `SELECT acquired, name, owner, fence, acquired_at, expires_at, db_now, secret FROM "pgfence".pgfence_acquire($1, $2, $3)`,
		renew:   `SELECT fence, renewed FROM "pgfence".pgfence_renew($1, $2, $3, $4)`,
		release: `SELECT fence, durability FROM "pgfence".pgfence_release($1, $2, $3, $4)`,
		secret:  true,
	},
}

// ownershipTTL is the TTL of scenario 13's leases, and of its renewals.
const ownershipTTL = 30 * time.Second

// ownershipArmResult is what scenario 13 measured on one arm: every call,
// batch by batch.
type ownershipArmResult struct {
	Version                 uint
	Acquire, Renew, Release [][]time.Duration // per batch: each call
	Handover                [][]time.Duration // per batch: each hand-over
}

// ownershipResult is scenario 13.
type ownershipResult struct {
	Batches, Cycles, Rounds int
	Arms                    []ownershipArmResult // version 11, then the latest
	LoadStart, LoadEnd      string
	// Later lists, in results of runs whose latest schema was a chain of
	// migrations, those after 000012 and the lease functions each defines.
	Later []laterMigration
}

// laterMigration is a migration after 000012 and the functions of the
// lease path that it creates, replaces or drops.
type laterMigration struct {
	File      string
	Redefines []string
}

// ownershipLease is a lease one arm's connection holds.
type ownershipLease struct {
	fence  int64
	secret string
}

// ownershipConn is one connection of an arm, with the arm's statements.
type ownershipConn struct {
	arm   ownershipArm
	conn  *pgx.Conn
	owner string
	ttl   []int64
}

// acquire runs the arm's acquire of name; ok reports whether it acquired.
func (c *ownershipConn) acquire(ctx context.Context, name string) (l ownershipLease, ok bool, err error) {
	var (
		rowName, owner, secret *string
		fence                  *int64
		at, exp, dbNow         *time.Time
	)
	dest := []any{&ok, &rowName, &owner, &fence, &at, &exp, &dbNow}
	if c.arm.secret {
		dest = append(dest, &secret)
	}
	if err := c.conn.QueryRow(ctx, c.arm.acquire, []string{name}, c.owner, c.ttl).Scan(dest...); err != nil {
		return l, false, err
	}
	if !ok {
		return l, false, nil
	}
	if fence == nil || (c.arm.secret && secret == nil) {
		return l, false, fmt.Errorf("version %d: acquire of %q answered acquired without its token or secret", c.arm.Version, name)
	}
	l.fence = *fence
	if secret != nil {
		l.secret = *secret
	}
	return l, true, nil
}

// renew runs the arm's renewal of l; an error unless it was renewed.
func (c *ownershipConn) renew(ctx context.Context, name string, l ownershipLease) error {
	var args []any
	if c.arm.secret {
		args = []any{[]string{name}, []int64{l.fence}, []string{l.secret}, c.ttl}
	} else {
		args = []any{[]string{name}, []int64{l.fence}, c.ttl}
	}
	rows, err := c.conn.Query(ctx, c.arm.renew, args...)
	if err != nil {
		return err
	}
	n := 0
	for rows.Next() {
		n++
		if c.arm.secret {
			var fence int64
			var renewed bool
			if err := rows.Scan(&fence, &renewed); err != nil {
				rows.Close()
				return err
			}
			if !renewed {
				n--
			}
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return err
	}
	if n != 1 {
		return fmt.Errorf("version %d: renewal of %q renewed %d leases", c.arm.Version, name, n)
	}
	return nil
}

// release runs the arm's release of l; an error unless it was held.
func (c *ownershipConn) release(ctx context.Context, name string, l ownershipLease) error {
	args := []any{[]string{name}, []int64{l.fence}, []int64{0}, c.owner}
	if c.arm.secret {
		args = []any{[]string{name}, []int64{l.fence}, []string{l.secret}, []int64{0}}
	}
	var fence int64
	var durability *string
	err := c.conn.QueryRow(ctx, c.arm.release, args...).Scan(&fence, &durability)
	if errors.Is(err, pgx.ErrNoRows) {
		return fmt.Errorf("version %d: release of %q: the lease was not held", c.arm.Version, name)
	}
	return err
}

// releasedBy reports whether a notification on leasetable.NotifyChannel
// announces the release of name with token: the name itself up to version
// 11, tag:token:mac from version 12 (the tag and MAC are not checked: the
// statement a Locker sends next does not depend on them).
func (c *ownershipConn) releasedBy(payload, name string, token int64) bool {
	if !c.arm.secret {
		return payload == name
	}
	parts := strings.Split(payload, ":")
	return len(parts) == 3 && parts[1] == strconv.FormatInt(token, 10)
}

// ownershipInterestSQL takes the interest key of lease $2 shared (class $1,
// the first 4 bytes of the name's keyed tag), as pgfence_notify_waiters
// tries it.
const ownershipInterestSQL = `SELECT pg_catalog.pg_advisory_lock_shared($1::pg_catalog.int4,
    (pg_catalog.get_byte(s.h, 0) << 24) | (pg_catalog.get_byte(s.h, 1) << 16) | (pg_catalog.get_byte(s.h, 2) << 8) | pg_catalog.get_byte(s.h, 3))
FROM (SELECT pg_catalog.sha256(k.key || '\x01'::bytea || pg_catalog.convert_to($2, 'UTF8')) AS h FROM "pgfence".pgfence_notify_key k) AS s
WHERE pg_catalog.to_regproc('"pgfence".pgfence_notify_waiters') IS NOT NULL`

// ownershipDB is one arm's database and its connections: calls runs the
// per-call cycles; a and b hand a lease back and forth, both LISTENing.
type ownershipDB struct {
	arm      ownershipArm
	calls    *ownershipConn
	a, b     *ownershipConn
	holder   *ownershipConn // a or b, which holds handover's lease
	held     ownershipLease
	handover string
}

func (d *ownershipDB) close(ctx context.Context) {
	for _, c := range []*ownershipConn{d.calls, d.a, d.b} {
		if c != nil {
			_ = c.conn.Close(ctx)
		}
	}
}

// cycles acquires, renews and releases each name, each statement committed
// on its own, and returns the time of each call.
func (d *ownershipDB) cycles(ctx context.Context, ns []string) (acq, ren, rel []time.Duration, err error) {
	c := d.calls
	for _, name := range ns {
		t0 := time.Now()
		l, ok, err := c.acquire(ctx, name)
		t1 := time.Now()
		if err != nil {
			return nil, nil, nil, err
		}
		if !ok {
			return nil, nil, nil, fmt.Errorf("version %d: %q is held", c.arm.Version, name)
		}
		if err := c.renew(ctx, name, l); err != nil {
			return nil, nil, nil, err
		}
		t2 := time.Now()
		if err := c.release(ctx, name, l); err != nil {
			return nil, nil, nil, err
		}
		t3 := time.Now()
		acq, ren, rel = append(acq, t1.Sub(t0)), append(ren, t2.Sub(t1)), append(rel, t3.Sub(t2))
	}
	return acq, ren, rel, nil
}

// handovers hands the lease over between a and b rounds times: the waiter
// tries to acquire (refused: held), then waits for a notification on
// leasetable.NotifyChannel; the holder releases; as soon as the
// notification of that release arrives, the waiter acquires. Each
// hand-over is timed from just before the release is sent to the waiter's
// acquire answered.
func (d *ownershipDB) handovers(ctx context.Context, rounds int) ([]time.Duration, error) {
	out := make([]time.Duration, 0, rounds)
	for range rounds {
		h, w := d.holder, d.a
		if h == d.a {
			w = d.b
		}
		if _, ok, err := w.acquire(ctx, d.handover); err != nil {
			return nil, err
		} else if ok {
			return nil, fmt.Errorf("version %d: the waiter acquired %q while it was held", d.arm.Version, d.handover)
		}
		type answer struct {
			l   ownershipLease
			at  time.Time
			err error
		}
		done := make(chan answer, 1)
		wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		token := d.held.fence
		go func() {
			pid := w.conn.PgConn().PID()
			for {
				n, err := w.conn.WaitForNotification(wctx)
				if err != nil {
					done <- answer{err: fmt.Errorf("version %d: wait for the release notification: %w", d.arm.Version, err)}
					return
				}
				if n.PID == pid || n.Channel != leasetable.NotifyChannel || !w.releasedBy(n.Payload, d.handover, token) {
					continue // its own release of an earlier round, or another
				}
				l, ok, err := w.acquire(wctx, d.handover)
				at := time.Now()
				if err == nil && !ok {
					err = fmt.Errorf("version %d: acquire after the release notification refused", d.arm.Version)
				}
				done <- answer{l: l, at: at, err: err}
				return
			}
		}()
		t0 := time.Now()
		err := h.release(ctx, d.handover, d.held)
		if err != nil {
			cancel()
			<-done
			return nil, err
		}
		a := <-done
		cancel()
		if a.err != nil {
			return nil, a.err
		}
		out = append(out, a.at.Sub(t0))
		d.holder, d.held = w, a.l
	}
	return out, nil
}

// ownershipDatabase is the database scenario 13 creates for arm.
func ownershipDatabase(arm ownershipArm) string {
	if arm.Version == 0 {
		return "bench_ownership_latest"
	}
	return fmt.Sprintf("bench_ownership_v%d", arm.Version)
}

// withDatabase returns the connection string s naming database db instead.
func withDatabase(s, db string) (string, error) {
	if !strings.Contains(s, "://") {
		return s + " dbname='" + strings.NewReplacer(`\`, `\\`, `'`, `\'`).Replace(db) + "'", nil
	}
	u, err := url.Parse(s)
	if err != nil {
		return "", err
	}
	u.Path = "/" + db
	return u.String(), nil
}

// createOwnershipDatabase creates arm's database afresh on the benchmark's
// server and installs it: version 11 from systems.SchemaV11 in schema
// pgfence, the latest with migrations.Up.
func createOwnershipDatabase(ctx context.Context, adminURL string, arm ownershipArm) (string, error) {
	name := ownershipDatabase(arm)
	if err := withConn(ctx, adminURL, func(c *pgx.Conn) error {
		if _, err := c.Exec(ctx, `DROP DATABASE IF EXISTS `+pgx.Identifier{name}.Sanitize()+` WITH (FORCE)`); err != nil {
			return err
		}
		_, err := c.Exec(ctx, `CREATE DATABASE `+pgx.Identifier{name}.Sanitize())
		return err
	}); err != nil {
		return "", fmt.Errorf("create database %s (scenario 13 needs CREATEDB on the server): %w", name, err)
	}
	u, err := withDatabase(adminURL, name)
	if err != nil {
		return "", err
	}
	if arm.Version == 0 {
		return u, migrations.Up(ctx, migrations.Target{URL: u}, nil)
	}
	if err := withConn(ctx, u, func(c *pgx.Conn) error {
		// One simple-protocol query: the whole file runs in one transaction.
		_, err := c.Exec(ctx, `CREATE SCHEMA `+pgx.Identifier{pgfence.DefaultSchema}.Sanitize()+`;`+systems.SchemaV11, pgx.QueryExecModeSimpleProtocol)
		return err
	}); err != nil {
		return "", fmt.Errorf("install schema version %d: %w", arm.Version, err)
	}
	return u, nil
}

// openOwnershipDB creates arm's database and opens its three connections.
func (r *runner) openOwnershipDB(ctx context.Context, arm ownershipArm) (*ownershipDB, error) {
	u, err := createOwnershipDatabase(ctx, r.env.DatabaseURL, arm)
	if err != nil {
		return nil, err
	}
	var v int
	if err := withConn(ctx, u, func(c *pgx.Conn) error {
		return c.QueryRow(ctx, `SELECT "pgfence".pgfence_schema_version()`).Scan(&v)
	}); err != nil {
		return nil, err
	}
	if (arm.Version != 0 && uint(v) != arm.Version) || (arm.Version == 0 && uint(v) != migrations.Latest()) {
		return nil, fmt.Errorf("%s is at schema version %d", ownershipDatabase(arm), v)
	}
	arm.Version = uint(v)
	d := &ownershipDB{arm: arm, handover: "s13-handover"}
	open := func(who string) (*ownershipConn, error) {
		c, err := pgx.Connect(ctx, u)
		if err != nil {
			return nil, err
		}
		return &ownershipConn{arm: arm, conn: c, owner: newOwnerName(who), ttl: []int64{ownershipTTL.Microseconds()}}, nil
	}
	for _, p := range []**ownershipConn{&d.calls, &d.a, &d.b} {
		if *p, err = open("s13"); err != nil {
			d.close(ctx)
			return nil, err
		}
	}
	for _, c := range []*ownershipConn{d.a, d.b} {
		if _, err := c.conn.Exec(ctx, "LISTEN "+leasetable.NotifyChannel); err != nil {
			d.close(ctx)
			return nil, err
		}
		// From schema version 2 of the 0.1.0 line, a release notifies only
		// when a waiter holds the name's interest key: both sides do, as a
		// waiting Locker's LISTEN connection would.
		if c.arm.secret {
			if _, err := c.conn.Exec(ctx, ownershipInterestSQL, leasetable.InterestClassID, d.handover); err != nil {
				d.close(ctx)
				return nil, err
			}
		}
	}
	l, ok, err := d.a.acquire(ctx, d.handover)
	if err == nil && !ok {
		err = fmt.Errorf("%q is held", d.handover)
	}
	if err != nil {
		d.close(ctx)
		return nil, err
	}
	d.holder, d.held = d.a, l
	return d, nil
}

// newOwnerName returns a lease owner unique to this process and call.
func newOwnerName(who string) string {
	return fmt.Sprintf("bench-%s-%d-%d", who, os.Getpid(), time.Now().UnixNano())
}

// ownershipCost is scenario 13: per call, the lease statements at schema
// version 11 and at the latest, one connection per arm, batches alternating
// between the arms (the order swapped every batch); each statement commits
// on its own, as a Locker sends it.
func (r *runner) ownershipCost(ctx context.Context) error {
	b, n, rounds := r.cfg.CallBatches, r.cfg.CallCycles, r.cfg.OwnershipRounds
	fmt.Printf("scenario 13: ownership secret cost, version 11 against the latest (%d), %d alternating batches of %d acquire/renew/release cycles and %d hand-overs per arm\n",
		migrations.Latest(), b, n, rounds)
	res := &ownershipResult{Batches: b, Cycles: n, Rounds: rounds, LoadStart: loadAvg()}
	var dbs []*ownershipDB
	defer func() {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		for _, d := range dbs {
			d.close(cctx)
		}
		_ = withConn(cctx, r.env.DatabaseURL, func(c *pgx.Conn) error {
			for _, arm := range ownershipArms {
				_, _ = c.Exec(cctx, `DROP DATABASE IF EXISTS `+pgx.Identifier{ownershipDatabase(arm)}.Sanitize()+` WITH (FORCE)`)
			}
			return nil
		})
	}()
	for _, arm := range ownershipArms {
		d, err := r.openOwnershipDB(ctx, arm)
		if err != nil {
			return fmt.Errorf("%s: %w", ownershipDatabase(arm), err)
		}
		dbs = append(dbs, d)
		res.Arms = append(res.Arms, ownershipArmResult{Version: d.arm.Version})
	}
	ns := names("s13-", n)
	// One unrecorded batch each: plans cached, rows for every name, the
	// connections warm.
	for _, d := range dbs {
		if _, _, _, err := d.cycles(ctx, ns); err != nil {
			return err
		}
		if _, err := d.handovers(ctx, max(rounds/4, 2)); err != nil {
			return err
		}
	}
	for i := range b {
		order := []int{0, 1}
		if i%2 == 1 {
			order = []int{1, 0}
		}
		for _, j := range order {
			acq, ren, rel, err := dbs[j].cycles(ctx, ns)
			if err != nil {
				return err
			}
			a := &res.Arms[j]
			a.Acquire, a.Renew, a.Release = append(a.Acquire, acq), append(a.Renew, ren), append(a.Release, rel)
		}
		for _, j := range order {
			hs, err := dbs[j].handovers(ctx, rounds)
			if err != nil {
				return err
			}
			res.Arms[j].Handover = append(res.Arms[j].Handover, hs)
		}
	}
	res.LoadEnd = loadAvg()
	for _, row := range res.rows() {
		fmt.Printf("  [13] %-22s v11 %-9s v%d %-9s v%d/v11 %s (paired %s)\n", row.what, report.Duration(row.old), res.Arms[1].Version, report.Duration(row.new), res.Arms[1].Version, ratioX(row.new, row.old), row.paired)
	}
	r.res.Ownership = res
	return writeOwnershipCost(r.cfg, r.res.Machine, res)
}

// ownershipRow is one line of scenario 13's table.
type ownershipRow struct {
	what     string
	old, new time.Duration
	paired   string
}

// rows returns the figures of scenario 13: each call's median, the
// hand-over's p50 and p99, over every sample of the arm; paired is the
// median over batches of the newer arm's batch median over version 11's in
// the same batch.
func (o *ownershipResult) rows() []ownershipRow {
	if len(o.Arms) != 2 {
		return nil
	}
	oldA, newA := o.Arms[0], o.Arms[1]
	row := func(what string, oldB, newB [][]time.Duration, q float64, paired bool) ownershipRow {
		r := ownershipRow{what: what, old: quantile(slices.Concat(oldB...), q), new: quantile(slices.Concat(newB...), q), paired: "n/a"}
		if paired {
			var rs []float64
			for i := range min(len(oldB), len(newB)) {
				if m := median(oldB[i]); m > 0 {
					rs = append(rs, float64(median(newB[i]))/float64(m))
				}
			}
			if len(rs) > 0 {
				r.paired = fmt.Sprintf("%.2fx", medianFloat(rs))
			}
		}
		return r
	}
	return []ownershipRow{
		row("acquire (free name)", oldA.Acquire, newA.Acquire, 0.5, true),
		row("renew (held lease)", oldA.Renew, newA.Renew, 0.5, true),
		row("release (held lease)", oldA.Release, newA.Release, 0.5, true),
		row("hand-over p50", oldA.Handover, newA.Handover, 0.5, true),
		row("hand-over p99", oldA.Handover, newA.Handover, 0.99, false),
	}
}

// quantile returns the nearest-rank q-quantile of ds.
func quantile(ds []time.Duration, q float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	i := int(float64(len(s))*q+0.999999) - 1
	return s[min(max(i, 0), len(s)-1)]
}

func ratioX(a, b time.Duration) string {
	if b <= 0 {
		return "n/a"
	}
	return fmt.Sprintf("%.2fx", float64(a)/float64(b))
}

// renderOwnershipCost writes scenario 13's section.
func renderOwnershipCost(p func(string, ...any), res *results) {
	o := res.Ownership
	if o == nil || len(o.Arms) != 2 {
		return
	}
	v := o.Arms[1].Version
	p("## 13. Ownership secret cost: schema version 11 against %d\n\n", v)
	p("From schema version 12 on, pgfence draws a secret for each acquisition (returned only to the acquirer, its SHA-256 stored), requires it for renew and release, and sends release notifications as tag:token:mac under the install's key instead of the name. Two databases on the benchmark's server, one with schema version 11 (`bench/internal/systems/testdata/v11.sql`: migrations 000001 to 000011 as they were before the 0.1.0 baseline), one migrated to the latest, %d (`migrations.Up`), are sent the statements leasetable sends at version 11 and since 12, as the install's owner, each statement committed on its own. Per call: one connection per version, %d batches of %d cycles (acquire a free name, whose row a release expired earlier; renew it; release it), the two versions alternating batch by batch, the order swapped every batch. Hand-over: per version two more connections LISTEN on `%s` and hand one lease back and forth, %d rounds per batch: the waiter's acquire is refused (held), the holder releases, and the waiter acquires as soon as the notification of that release arrives (checked by name at version 11, by token at %d; the MAC is not verified); timed from sending the release to the waiter's acquire answered. Medians and p99 are over every call of a version; the paired column is the median over batches of the batch medians' ratio.\n\n",
		v, o.Batches, o.Cycles, leasetable.NotifyChannel, o.Rounds, v)
	t := &report.Table{Header: []string{"call", "version 11", fmt.Sprintf("version %d", v), "added", fmt.Sprintf("v%d/v11", v), "paired batches (median)"}, TextColumns: 1}
	for _, r := range o.rows() {
		t.Rows = append(t.Rows, []string{r.what, report.Duration(r.old), report.Duration(r.new), report.Duration(r.new - r.old), ratioX(r.new, r.old), r.paired})
	}
	p("%s\n", t.Markdown())
	calls := 0
	for _, b := range o.Arms[0].Acquire {
		calls += len(b)
	}
	hs := 0
	for _, b := range o.Arms[0].Handover {
		hs += len(b)
	}
	p("%s calls of each kind and %s hand-overs per version, after one unrecorded batch each.", report.Thousands(int64(calls)), report.Thousands(int64(hs)))
	for _, m := range o.Later {
		if len(m.Redefines) == 0 {
			p(" `%s`, after 000012, defines none of the functions these statements call (pgfence_acquire, _renew, _release, _notify_payload, _next_token, _check_us).", m.File)
		} else {
			p(" `%s`, after 000012, redefines %s: the newer column measures it too.", m.File, strings.Join(m.Redefines, ", "))
		}
	}
	p("\n\n")
}

// writeOwnershipCost writes results/ownership-cost.md (in -out): the run's
// command line, the machine, and scenario 13's section.
func writeOwnershipCost(cfg *config, m machineInfo, o *ownershipResult) error {
	var b strings.Builder
	p := func(format string, args ...any) { fmt.Fprintf(&b, format, args...) }
	p("# Ownership secret cost (scenario 13)\n\n")
	p("Generated by `cd bench && go run . %s`, %s.", strings.Join(os.Args[1:], " "), time.Now().UTC().Format("2006-01-02 15:04 MST"))
	if cfg.Quick {
		p(" A **quick** run (%d batches).", o.Batches)
	}
	p("\n\n")
	p("Machine: %s, %d cores; load average %s at the start of this scenario, %s at its end; %s %s; PostgreSQL %s, fsync=%s, synchronous_commit=%s. The benchmark, its connections and PostgreSQL share these cores.\n\n",
		m.CPU, m.Cores, o.LoadStart, o.LoadEnd, m.GoVersion, m.OS, m.Postgres["server_version"], m.Postgres["fsync"], m.Postgres["synchronous_commit"])
	renderOwnershipCost(p, &results{Ownership: o})
	if err := os.MkdirAll(cfg.Out, 0o755); err != nil {
		return err
	}
	path := filepath.Join(cfg.Out, "ownership-cost.md")
	fmt.Println("wrote", path)
	return os.WriteFile(path, []byte(b.String()), 0o644)
}
