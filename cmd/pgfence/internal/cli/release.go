package cli

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/user"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence/leasetable"
)

// forceReasonPrefix starts the default reason recorded for a forced
// release, so the audit trail shows it came from this command.
const forceReasonPrefix = "pgfence-cli: release --force"

const releaseHelp = `
Usage:
  pgfence release --force [flags] NAME
  pgfence release --force --permit SLOT [flags] SEMAPHORE

An operator's override: ends the lease NAME whoever holds it. In one
statement (<schema>.pgfence_force_release), the lease row gets a fresh
fencing token and expires now, and waiters are notified on channel
` + leasetable.NotifyChannel + `. A holder that still believes in the lease then
fails to renew it (renewal requires its own token and an unexpired row), and
its guarded writes carry an older token than the next holder's, so they are
rejected.

A semaphore's permit (pgfence run --permits) is a lease too, with its own
token: --permit SLOT names permit SLOT (0 to 1023) of the semaphore
SEMAPHORE. NAME may also be a permit's name as 'pgfence ls' shows it, in
double quotes with Go escapes: '"jobs\x1f3"' is permit 3 of semaphore jobs
(the single quotes are for the shell). Should a lease be named literally
so, quotes and backslash included, that form is refused as ambiguous: use
--permit.

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
  pgfence release --force --permit 3 jobs
  pgfence release --force '"jobs\x1f3"'
`

// releasePoolMaxConns: release runs one statement at a time.
const releasePoolMaxConns = 2

// releaseTarget is what release --force ends: a lease, or a semaphore's
// permit.
type releaseTarget struct {
	lease     string // the lease row's name
	permit    bool   // the row is permit slot of semaphore
	semaphore string
	slot      int
	shown     string // for a permit named as ls shows it: NAME as given, which is also a lease name
}

// String names the target for people: lease "x", or permit 3 of semaphore "jobs".
func (t releaseTarget) String() string {
	if t.permit {
		return fmt.Sprintf("permit %d of semaphore %q", t.slot, t.semaphore)
	}
	return fmt.Sprintf("lease %q", t.lease)
}

// parseReleaseTarget reads release's NAME: a semaphore's with --permit
// (permitSet), else a lease's, or a permit's as ls shows it (Go-quoted) or
// as it is (with its 0x1f byte).
func parseReleaseTarget(name string, permitSet bool, slot int) (releaseTarget, error) {
	if permitSet {
		if slot < 0 || slot >= leasetable.MaxPermits {
			return releaseTarget{}, usageErrorf("--permit must be between 0 and %d, not %d", leasetable.MaxPermits-1, slot)
		}
		if err := checkSemaphoreName(name); err != nil {
			return releaseTarget{}, err
		}
		return releaseTarget{lease: leasetable.PermitName(name, slot), permit: true, semaphore: name, slot: slot}, nil
	}
	if sem, n, ok := leasetable.SplitPermit(name); ok {
		if err := checkSemaphoreName(sem); err != nil {
			return releaseTarget{}, err
		}
		return releaseTarget{lease: name, permit: true, semaphore: sem, slot: n}, nil
	}
	if strings.HasPrefix(name, `"`) {
		if u, err := strconv.Unquote(name); err == nil {
			if sem, n, ok := leasetable.SplitPermit(u); ok && checkSemaphoreName(sem) == nil {
				return releaseTarget{lease: u, permit: true, semaphore: sem, slot: n, shown: name}, nil
			}
		}
	}
	if name == "" {
		return releaseTarget{}, usageErrorf("the lease name is empty")
	}
	if err := checkName(name); err != nil {
		return releaseTarget{}, err
	}
	return releaseTarget{lease: name}, nil
}

// checkSemaphoreName rejects what leasetable refuses as a semaphore name.
func checkSemaphoreName(name string) error {
	switch {
	case name == "":
		return usageErrorf("the semaphore name is empty")
	case len(name) > leasetable.MaxSemaphoreNameLength:
		return usageErrorf("the semaphore name is %d bytes long; at most %d are allowed", len(name), leasetable.MaxSemaphoreNameLength)
	case !utf8.ValidString(name):
		return usageErrorf("the semaphore name %q is not valid UTF-8", name)
	}
	for _, r := range name {
		if r < 0x20 || r == 0x7f { // leasetable's rule: C0 controls (0x1f among them) and DEL
			return usageErrorf("the semaphore name %q holds a control character (%U)", name, r)
		}
	}
	return nil
}

// permitStateSQL reads a permit's row ($1), whether held or not, and
// whether a lease row is named $2 (NULL: none asked), for release's
// confirmation (%[1]s is the schema). It locks nothing. Locker.Get reads
// only held rows: a permit never taken (no row) is refused before asking,
// and a literal lease named as ls shows a permit is found held or not.
const permitStateSQL = `
SELECT p.owner, p.fence, p.expires_at, p.expires_at OPERATOR(pg_catalog.>) pg_catalog.now(),
       EXISTS (SELECT FROM %[1]s.pgfence_leases l WHERE l.name OPERATOR(pg_catalog.=) $2::pg_catalog.text)
FROM (SELECT) AS one
LEFT JOIN %[1]s.pgfence_leases p ON p.name OPERATOR(pg_catalog.=) $1::pg_catalog.text`

func (a *App) release(ctx context.Context, args []string) error {
	var database, schema, reason string
	var force, yes bool
	var slot int
	f := newFlags("release")
	f.Bool(&force, "f", "force", "required: release the lease whoever holds it")
	f.fs.IntVar(&slot, "permit", 0, "")
	f.add("", "permit", "SLOT", "release permit SLOT (0 to 1023) of the semaphore NAME", "")
	f.Bool(&yes, "y", "yes", "do not ask for confirmation")
	f.String(&reason, "r", "reason", "TEXT", "why, for the audit trail (default: who ran this command, and where)")
	f.String(&database, "d", "database", "URL", databaseFlagUsage)
	schemaFlag(f, &schema)
	pos, _, err := a.parseOrHelp(f, releaseHelp, args)
	if err != nil {
		return err
	}
	permitSet := f.set("", "permit")
	if len(pos) != 1 {
		if permitSet {
			return usageErrorf("expected one semaphore name after --permit SLOT")
		}
		return usageErrorf("expected one lease name")
	}
	if !force {
		return usageErrorf("release only ends another owner's lease: pass --force to confirm that is what you want")
	}
	target, err := parseReleaseTarget(pos[0], permitSet, slot)
	if err != nil {
		return err
	}
	if len(reason) > leasetable.MaxNameLength {
		return usageErrorf("--reason is %d bytes long; at most %d are allowed", len(reason), leasetable.MaxNameLength)
	}
	if reason == "" {
		reason = defaultForceReason()
	}
	pool, locker, done, err := a.openLocker(ctx, database, schema, "pgfence release", releasePoolMaxConns)
	if err != nil {
		return err
	}
	defer done()

	state, err := releaseState(ctx, locker, pool, schema, target)
	if err != nil {
		return err
	}
	what := target.String()
	if err := a.confirm(fmt.Sprintf("%s is %s.\nForce-release it? Its holder will be fenced out.", upperFirst(what), state), yes); err != nil {
		return err
	}

	r, err := locker.ForceRelease(ctx, target.lease, reason)
	if errors.Is(err, leasetable.ErrNoLease) {
		if target.permit {
			return fmt.Errorf("semaphore %q has no permit %d (see 'pgfence ls')", target.semaphore, target.slot)
		}
		return fmt.Errorf("no lease named %q (see 'pgfence ls')", target.lease)
	}
	if err != nil {
		return explainSchemaError(err, schema)
	}
	was := "was held by"
	if !r.WasHeld {
		was = "was not held; last owner"
	}
	released := fmt.Sprintf("%q", target.lease)
	if target.permit {
		released = what
	}
	fmt.Fprintf(a.Stdout, "released %s: token %d -> %d (%s %q); recorded with reason %q\n",
		released, r.OldToken, r.Token, was, r.OldOwner, reason)
	return nil
}

// releaseState describes the target's row for the confirmation: "held by
// ... with token N, expires ...", or "not held now". For a permit it
// refuses one that was never taken, and a NAME that is both a permit as ls
// shows it and a lease's literal name.
func releaseState(ctx context.Context, locker *leasetable.Locker, pool *pgxpool.Pool, schema string, t releaseTarget) (string, error) {
	held := func(owner string, token int64, expires time.Time) string {
		return fmt.Sprintf("held by %q with token %d, expires %s", owner, token, expires.Local().Format("15:04:05 (database clock)"))
	}
	if !t.permit {
		info, ok, err := locker.Get(ctx, t.lease)
		if err != nil {
			return "", explainSchemaError(err, schema)
		}
		if !ok {
			return "not held now", nil
		}
		return held(info.Owner, info.Token, info.ExpiresAt), nil
	}
	var (
		owner   *string
		token   *int64
		expires *time.Time
		isHeld  *bool
		literal bool
		shown   *string
	)
	if t.shown != "" {
		shown = &t.shown
	}
	err := pool.QueryRow(ctx, fmt.Sprintf(permitStateSQL, pgx.Identifier{schema}.Sanitize()), t.lease, shown).
		Scan(&owner, &token, &expires, &isHeld, &literal)
	if err != nil {
		return "", explainSchemaError(fmt.Errorf("read %s: %w", t, err), schema)
	}
	switch {
	case literal:
		return "", usageErrorf("%s is how 'pgfence ls' shows %s, but a lease is also named so literally: "+
			"pass --permit %d %s for the permit", display(t.lease), t, t.slot, strconv.Quote(t.semaphore))
	case owner == nil:
		return "", fmt.Errorf("semaphore %q has no permit %d: it was never taken, or its row was pruned (see 'pgfence ls')", t.semaphore, t.slot)
	case !*isHeld:
		return "not held now", nil
	}
	return held(*owner, *token, *expires), nil
}

// upperFirst returns s with its first byte in upper case (s is ASCII there:
// "lease" or "permit").
func upperFirst(s string) string { return strings.ToUpper(s[:1]) + s[1:] }

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
