package cli

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence/advisory"
	"github.com/pgfence/pgfence/cmd/pgfence/internal/demo"
	"github.com/pgfence/pgfence/leasetable"
)

const demoHelp = `
Usage:
  pgfence demo [--database URL]

Shows, in a few seconds on a real PostgreSQL, why a lock needs a fencing
token. Two workers - real processes, this binary re-executed - want to add
to account 42 (balance 100) under the lease ` + demoLease + `:

  1. worker-A acquires the lease (TTL 2s) and reads the balance, 100;
  2. the demo stops worker-A with SIGSTOP, as a GC pause or a frozen VM
     would, between its read and its write; its renewals stop too;
  3. the lease expires; worker-B acquires it (a larger token) and writes
     100 + 50 = 150, fenced with its token;
  4. the demo resumes worker-A (SIGCONT). Still believing in its lease, it
     writes 100 + 10 = 110 fenced with its old token: rejected with
     pgfence.ErrFenced, and the row keeps 150;
  5. the same late write without fencing (a plain UPDATE) is accepted and
     silently overwrites worker-B's update: a lost update.

Every step is printed on a timeline with the lease's holder and token, as
the database sees them.

Database:
  With --database or DATABASE_URL, the demo uses that database: it applies
  pgfence's migrations to --schema (pgfence's objects stay), creates the
  schema pgfence_demo, and drops that schema when it ends. Its lease is
  named ` + demoLease + ` so it cannot collide with a real lock; the
  released row stays in pgfence_leases until 'pgfence prune' removes it.
  One demo runs on a database at a time: a second one stops at once with
  an error and touches nothing.
  The PG* variables are not used. Without a database, it starts a
  throwaway PostgreSQL from the local server binaries (initdb and postgres
  from PG_BINDIR, PATH or /usr/lib/postgresql/*/bin) in a private temporary
  directory, reachable only through a unix socket there (no TCP), and
  removes it at the end. SIGINT cleans up too (exit status 130).

Exit status 0 means the story played out: the fenced stale write was
rejected and the unfenced one overwrote the row.

Examples:
  go run ./cmd/pgfence demo
  pgfence demo --database postgres://localhost/scratch
`

// demoLease is the demo's lease name, prefixed so that on a user's
// database it cannot be a real lock's.
const demoLease = "pgfence-demo:account:42"

// demoLockKey is the session advisory lock a demo holds on a given
// database for its whole run, so that a second demo there stops at once
// instead of resetting the first one's account and dropping its schema.
var demoLockKey = advisory.Name("pgfence-demo").Int64()

// Takes demoLockKey for the session, without waiting.
const demoLockSQL = `SELECT pg_catalog.pg_try_advisory_lock($1)`

// Releases demoLockKey.
const demoUnlockSQL = `SELECT pg_catalog.pg_advisory_unlock($1)`

// demoTTL is the workers' lease TTL: short, so the story is quick.
const demoTTL = 2 * time.Second

// demoStepTimeout bounds each step a worker performs.
const demoStepTimeout = time.Minute

// The demo account's row. Locks nothing.
const demoAccountSQL = `SELECT balance, fence_token FROM pgfence_demo.accounts WHERE id OPERATOR(pg_catalog.=) $1`

func (a *App) demo(ctx context.Context, args []string) (err error) {
	var database, schema string
	f := newFlags("demo")
	f.String(&database, "d", "database", "URL", "database URL (default $DATABASE_URL, else a throwaway PostgreSQL)")
	schemaFlag(f, &schema)
	pos, _, err := a.parseOrHelp(f, demoHelp, args)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return usageErrorf("unexpected argument %q", pos[0])
	}
	if err := checkSchema(schema); err != nil {
		return err
	}
	source := "--database"
	if strings.TrimSpace(database) == "" {
		database, source = os.Getenv("DATABASE_URL"), "DATABASE_URL"
	}
	database = strings.TrimSpace(database)
	if database != "" {
		if err := validate(database, source); err != nil {
			return err
		}
	}
	self, err := os.Executable()
	if err != nil {
		return fmt.Errorf("find the pgfence binary to run the workers: %w", err)
	}

	fmt.Fprintf(a.Stdout, "pgfence demo: a paused lock holder, a fenced write and an unfenced one.\n\n")
	fmt.Fprintf(a.Stdout, "%9s  %-8s  %-16s  %s\n", "elapsed", "actor", "lease holder", "event")
	d := &demoRun{a: a, tl: demo.NewTimeline(a.Stdout, nil, 8), schema: schema}
	defer d.cleanup(ctx)

	if database == "" {
		d.say("demo", "no --database or DATABASE_URL: starting a throwaway PostgreSQL from the local binaries")
		db, err := demo.StartDatabase(ctx)
		if err != nil {
			return err
		}
		d.cluster = db
		database = db.URL
		d.say("demo", "throwaway PostgreSQL up (binaries in %s), database %s", db.BinDir, demo.DatabaseName)
	} else {
		d.userDB = true
		d.say("demo", "using the database from %s (%s)", source, describeDB(database))
		if err := d.exclude(ctx, database); err != nil {
			return err
		}
	}
	d.url = database
	if err := demo.Prepare(ctx, database, schema); err != nil {
		return fmt.Errorf("prepare the demo's database: %w", explainSchemaError(err, schema))
	}
	d.prepared = true
	if d.conn, err = connect(ctx, database); err != nil {
		return err
	}
	if d.pool, err = newPool(ctx, database, "pgfence demo", 2); err != nil {
		return err
	}
	if d.locker, err = leasetable.New(ctx, d.pool, &leasetable.Config{Schema: schema, DisableListen: true, Logger: d.a.logger()}); err != nil {
		return explainSchemaError(err, schema)
	}
	d.say("demo", "pgfence migrations applied in schema %s; pgfence_demo.accounts: account %d, balance %d, fence_token 0",
		schema, demo.AccountID, demo.InitialBalance)

	story, err := d.play(ctx, self)
	d.cleanup(ctx)
	if err != nil {
		if ctx.Err() != nil {
			return exitWith(interruptedStatus(ctx), errors.New("interrupted; cleaned up"))
		}
		return err
	}
	return a.verdict(story)
}

// demoRun is one run of the demo and what it must clean up.
type demoRun struct {
	a        *App
	tl       *demo.Timeline
	url      string
	schema   string
	userDB   bool
	prepared bool
	cluster  *demo.Database
	conn     *pgx.Conn
	pool     *pgxpool.Pool
	locker   *leasetable.Locker // reads the lease's holder
	lastTok  int64              // the last token a worker acquired
	guard    *pgx.Conn          // holds demoLockKey on a given database
	workers  []*demo.Worker
	cleaned  bool
}

// say prints an event with the lease's holder as the database sees it.
func (d *demoRun) say(actor, format string, args ...any) {
	d.tl.Event(actor, "%-16s  %s", d.holder(), fmt.Sprintf(format, args...))
}

// holder describes the lease's holder as the database sees it: "worker-A
// #5" (owner and token), "free (last #5)" once it expired or was released,
// or "-" before any worker acquired it.
func (d *demoRun) holder() string {
	if d.locker == nil {
		return "-"
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	info, held, err := d.locker.Get(ctx, demoLease)
	switch {
	case err != nil:
		return "?"
	case held:
		return fmt.Sprintf("%s #%d", info.Owner, info.Token)
	case d.lastTok == 0:
		return "-"
	}
	return fmt.Sprintf("free (last #%d)", d.lastTok)
}

// account reads the demo account's balance and token.
func (d *demoRun) account(ctx context.Context) (balance, token int64, err error) {
	err = d.conn.QueryRow(ctx, demoAccountSQL, demo.AccountID).Scan(&balance, &token)
	return balance, token, err
}

func (d *demoRun) startWorker(self, name string) (*demo.Worker, error) {
	w, err := demo.StartWorker(name, self, []string{demoWorkerCommand, name},
		[]string{envDemoDatabase + "=" + d.url, envDemoSchema + "=" + d.schema}, d.a.Stderr)
	if err != nil {
		return nil, err
	}
	d.workers = append(d.workers, w)
	return w, nil
}

// do runs one worker step and turns a reported failure into an error.
func (d *demoRun) do(ctx context.Context, w *demo.Worker, cmd demo.Command) (demo.Event, error) {
	ctx, cancel := context.WithTimeout(ctx, demoStepTimeout)
	defer cancel()
	ev, err := w.Do(ctx, cmd)
	if err == nil && ev.Error != "" && !ev.Fenced && !ev.Lost {
		err = fmt.Errorf("%s: %s: %s", w.Name, cmd.Op, ev.Error)
	}
	return ev, err
}

// demoStory is what happened, for the verdict.
type demoStory struct {
	tokenA, tokenB       int64
	readA                int64
	wroteB               int64
	fencedRejected       bool
	afterFenced          int64
	beforePlain, afterPl int64
	plainAccepted        bool
}

// play runs the story with two worker processes.
func (d *demoRun) play(ctx context.Context, self string) (demoStory, error) {
	var s demoStory
	a, err := d.startWorker(self, "worker-A")
	if err != nil {
		return s, err
	}
	b, err := d.startWorker(self, "worker-B")
	if err != nil {
		return s, err
	}
	d.say("demo", "started worker-A (pid %d) and worker-B (pid %d): real processes, this binary re-executed", a.Pid(), b.Pid())

	acquire := demo.Command{Op: "acquire", Lease: demoLease, TTLMillis: demoTTL.Milliseconds()}
	ev, err := d.do(ctx, a, acquire)
	if err != nil {
		return s, err
	}
	s.tokenA = ev.Token
	d.lastTok = ev.Token
	d.say(a.Name, "acquired %s: token %d, TTL %v, renewed every %v", demoLease, s.tokenA, demoTTL, (demoTTL / 3).Round(time.Millisecond))
	if ev, err = d.do(ctx, a, demo.Command{Op: "read"}); err != nil {
		return s, err
	}
	s.readA = ev.Balance
	d.say(a.Name, "read balance %d; about to write %d + 10 = %d", s.readA, s.readA, s.readA+10)

	if err := a.Pause(); err != nil {
		return s, err
	}
	d.say("demo", "SIGSTOP worker-A (pid %d, state %s): a real stopped process, frozen between its read and its write; its renewals stop too",
		a.Pid(), stoppedState(a.Pid()))

	start := time.Now()
	d.say(b.Name, "waiting for %s", demoLease)
	if ev, err = d.do(ctx, b, acquire); err != nil {
		return s, err
	}
	s.tokenB = ev.Token
	d.lastTok = ev.Token
	d.say(b.Name, "acquired %s after %.1fs, when worker-A's lease expired: token %d (> %d)",
		demoLease, time.Since(start).Seconds(), s.tokenB, s.tokenA)
	if ev, err = d.do(ctx, b, demo.Command{Op: "read"}); err != nil {
		return s, err
	}
	s.wroteB = ev.Balance + 50
	if _, err = d.do(ctx, b, demo.Command{Op: "write", Fenced: true, Balance: s.wroteB}); err != nil {
		return s, err
	}
	d.say(b.Name, "read balance %d, wrote %d + 50 = %d (fenced: fence_token <= %d)", ev.Balance, ev.Balance, s.wroteB, s.tokenB)

	if err := a.Resume(); err != nil {
		return s, err
	}
	d.say("demo", "SIGCONT worker-A: it carries on where it stopped, still believing it holds the lease, with the balance it read")
	ev, err = d.do(ctx, a, demo.Command{Op: "write", Fenced: true, Balance: s.readA + 10})
	if err != nil {
		return s, err
	}
	balance, rowToken, err := d.account(ctx)
	if err != nil {
		return s, err
	}
	s.afterFenced = balance
	if ev.Fenced {
		s.fencedRejected = true
		d.say(a.Name, "fenced write balance = %d REJECTED (pgfence.ErrFenced): presented token %d, row has token %d",
			s.readA+10, ev.Token, ev.Current)
	} else {
		d.say(a.Name, "fenced write balance = %d was ACCEPTED (unexpected)", s.readA+10)
	}
	d.say("demo", "row: balance %d, fence_token %d", balance, rowToken)
	if ev, err = d.do(ctx, a, demo.Command{Op: "status"}); err != nil {
		return s, err
	}
	if ev.Lost {
		d.say(a.Name, "checks its lease only now: lost (%s)", ev.Error)
	}

	s.beforePlain = balance
	d.say("demo", "now the same late write WITHOUT fencing: UPDATE ... SET balance = %d WHERE id = %d", s.readA+10, demo.AccountID)
	if ev, err = d.do(ctx, a, demo.Command{Op: "write", Balance: s.readA + 10}); err != nil {
		return s, err
	}
	if balance, rowToken, err = d.account(ctx); err != nil {
		return s, err
	}
	s.afterPl = balance
	s.plainAccepted = balance == s.readA+10
	d.say(a.Name, "unfenced write accepted: balance %d -> %d (fence_token still %d)", s.beforePlain, s.afterPl, rowToken)

	if _, err = d.do(ctx, b, demo.Command{Op: "release"}); err != nil {
		return s, err
	}
	d.say(b.Name, "released %s", demoLease)
	return s, nil
}

// verdict prints the outcome and fails unless the story went as told.
func (a *App) verdict(s demoStory) error {
	expected := s.readA + 50
	fmt.Fprintf(a.Stdout, "\nVerdict:\n")
	ok := s.fencedRejected && s.afterFenced == s.wroteB && s.wroteB == expected && s.plainAccepted && s.tokenB > s.tokenA
	if s.fencedRejected {
		fmt.Fprintf(a.Stdout, "  with fencing:    worker-A's stale write (token %d < %d) was rejected; balance %d = %d + worker-B's 50\n",
			s.tokenA, s.tokenB, s.afterFenced, s.readA)
	} else {
		fmt.Fprintf(a.Stdout, "  with fencing:    worker-A's stale write was NOT rejected; balance %d\n", s.afterFenced)
	}
	if s.plainAccepted {
		fmt.Fprintf(a.Stdout, "  without fencing: the same write was accepted; balance %d -> %d: worker-B's +50 is lost\n",
			s.beforePlain, s.afterPl)
	} else {
		fmt.Fprintf(a.Stdout, "  without fencing: the write did not land as expected; balance %d -> %d\n", s.beforePlain, s.afterPl)
	}
	if !ok {
		return errors.New("the demo did not play out as expected; see the timeline above")
	}
	fmt.Fprintf(a.Stdout, "\nThe lease alone could not stop a paused holder; the fencing token did.\n"+
		"Next: 'pgfence run NAME -- COMMAND' runs a job under a lease and passes PGFENCE_TOKEN to it.\n")
	return nil
}

// exclude takes the demo's session advisory lock on the given database, on
// a connection of its own kept until cleanup, or fails when another demo
// holds it. Nothing has been created then, so cleanup drops nothing.
func (d *demoRun) exclude(ctx context.Context, database string) error {
	conn, err := connect(ctx, database)
	if err != nil {
		return err
	}
	var ok bool
	if err := conn.QueryRow(ctx, demoLockSQL, demoLockKey).Scan(&ok); err != nil {
		closeConn(ctx, conn)
		return fmt.Errorf("take the demo's advisory lock: %w", err)
	}
	if !ok {
		closeConn(ctx, conn)
		return fmt.Errorf("another pgfence demo is running on this database (it holds the session advisory lock %d); "+
			"wait until it ends, or give this one a database of its own", demoLockKey)
	}
	d.guard = conn
	return nil
}

// cleanup stops the workers, drops what the demo created on a user's
// database, and stops a throwaway server. It runs on every exit, also when
// ctx was cancelled by SIGINT.
func (d *demoRun) cleanup(ctx context.Context) {
	if d.cleaned {
		return
	}
	d.cleaned = true
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	for _, w := range d.workers {
		_ = w.Close()
	}
	if d.userDB && d.prepared {
		if err := demo.Drop(ctx, d.url); err != nil {
			d.a.say(ctx, slog.LevelWarn, fmt.Sprintf("cleaning up: %v (drop the schema pgfence_demo by hand)", err))
		}
		d.say("demo", "cleaned up: dropped schema pgfence_demo; the released lease row %s stays until 'pgfence prune'", demoLease)
	}
	if d.locker != nil {
		d.locker.Close()
		d.locker = nil
	}
	if d.pool != nil {
		d.pool.Close()
		d.pool = nil
	}
	if d.conn != nil {
		closeConn(ctx, d.conn)
		d.conn = nil
	}
	if d.guard != nil {
		// Unlock before closing: the server ends a closed session's
		// backend, and its lock, only a moment after the demo exits, and a
		// demo started then would be refused.
		_, _ = d.guard.Exec(ctx, demoUnlockSQL, demoLockKey)
		closeConn(ctx, d.guard)
		d.guard = nil
	}
	if d.cluster != nil {
		d.cluster.Close()
		d.tl.Event("demo", "%-16s  %s", "-", "cleaned up: throwaway PostgreSQL stopped and removed")
	}
}

// describeDB names a database without its password: "user@host:port/db".
func describeDB(url string) string {
	cfg, err := pgx.ParseConfig(url)
	if err != nil {
		return "?"
	}
	return fmt.Sprintf("%s@%s:%d/%s", cfg.User, cfg.Host, cfg.Port, cfg.Database)
}

// stoppedState waits briefly for a process that was sent SIGSTOP to stop
// (signals are delivered asynchronously) and returns its state.
func stoppedState(pid int) string {
	deadline := time.Now().Add(2 * time.Second)
	for procState(pid) != "T (stopped)" && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	return procState(pid)
}

// procState returns a process's state from /proc, "T (stopped)" for a
// stopped one, or "?" where /proc cannot be read.
func procState(pid int) string {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return "?"
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 || i+2 >= len(s) {
		return "?"
	}
	if s[i+2] == 'T' {
		return "T (stopped)"
	}
	return s[i+2 : i+3]
}
