package migrations_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/migrations"
)

// The attacks of an application role on another's leases (issue 33). Each
// runs against the baseline schema, where it must fail, and, as its
// negative control, against the baseline with the one check that stops it
// removed (weaken), where it must succeed. Both roles have what
// migrations.Grant gives.

// arena is an install with two application roles: holder takes leases,
// attacker attacks them.
type arena struct {
	db               *pgtest.DB
	holder, attacker *pgx.Conn
	outsider         string // a role with no pgfence grant
}

// newArena installs pgfence, grants the holder and the attacker, then
// applies edits.
func newArena(t *testing.T, edits []edit) arena {
	t.Helper()
	ctx := testCtx(t)
	roles := newRoles(t, "holder", "attacker", "outsider") // before the database: dropped after it
	db := pgtest.NewDB(t)
	for _, r := range roles[:2] {
		require.NoError(t, migrations.Grant(ctx, migrations.Target{URL: db.URL}, r, nil, nil))
	}
	weaken(t, db, edits...)
	return arena{db: db, holder: connAs(t, db, roles[0]), attacker: connAs(t, db, roles[1]), outsider: roles[2]}
}

// acquire takes name for the holder and returns its token and secret.
func (a arena) acquire(t *testing.T, name string, ttl time.Duration) (int64, string) {
	t.Helper()
	var (
		token  int64
		secret string
	)
	require.NoError(t, a.holder.QueryRow(testCtx(t), "SELECT fence, secret FROM pgfence.pgfence_acquire($1, 'holder', $2) WHERE acquired",
		[]string{name}, []int64{ttl.Microseconds()}).Scan(&token, &secret))
	return token, secret
}

// stolen is what any granted role reads about a lease: its token and owner.
func (a arena) stolen(t *testing.T, name string) (token int64, owner string) {
	t.Helper()
	require.NoError(t, a.attacker.QueryRow(testCtx(t), "SELECT fence, owner FROM pgfence.pgfence_leases WHERE name = $1", name).Scan(&token, &owner))
	return token, owner
}

// both runs attack against the baseline and, as the negative control,
// against the baseline weakened by control; the attack reports whether it
// succeeded.
func both(t *testing.T, control []edit, attack func(t *testing.T, a arena) bool) {
	t.Helper()
	t.Run("baseline", func(t *testing.T) {
		t.Parallel()
		require.False(t, attack(t, newArena(t, nil)), "the attack must fail on the baseline schema")
	})
	t.Run("control", func(t *testing.T) {
		t.Parallel()
		require.True(t, attack(t, newArena(t, control)), "negative control: the attack succeeds without the check")
	})
}

// Signatures of the functions the controls edit.
const (
	renewFn   = "pgfence_renew(text[], bigint[], text[], bigint[])"
	acquireFn = "pgfence_acquire(text[], text, bigint[])"
)

// The negative controls: each removes the one check that stops an attack.
var (
	noRenewSecret   = []edit{{renewFn, "AND p.secret_hash = r.h", ""}}
	noReleaseSecret = []edit{
		{releaseFn, "AND l.secret_hash = pg_catalog.sha256(pg_catalog.convert_to($3[1], 'UTF8'))", ""},
		{releaseFn, "AND l.secret_hash = pg_catalog.sha256(pg_catalog.convert_to(r.secret, 'UTF8'))", ""},
	}
	noProclaimSecret = []edit{{"pgfence_leader_proclaim(text, bigint, text, text)",
		"AND l.secret_hash = pg_catalog.sha256(pg_catalog.convert_to($3, 'UTF8'))", ""}}
	noLeaseHeldSecret = []edit{{"pgfence_lease_held(text, bigint, text)",
		"AND l.secret_hash = pg_catalog.sha256(pg_catalog.convert_to($3, 'UTF8'))", ""}}
	noClaim = []edit{
		{acquireFn, "pg_catalog.pg_try_advisory_xact_lock(pg_catalog.hashtextextended($1[1], 7378831))", "true"},
		{acquireFn, "pg_catalog.pg_try_advisory_xact_lock(pg_catalog.hashtextextended(r.name, 7378831))", "true"},
	}
	noPruneAgeCheck = []edit{{"pgfence_prune_delete(text[], bigint[], interval)",
		"IF $3 IS NULL OR pg_catalog.now() - $3 > pg_catalog.now() - interval '1 minute' THEN", "IF false THEN"}}
	noTTLCheck       = []edit{{acquireFn, "PERFORM pgfence_check_us($3, 1, 'a TTL');", ""}}
	namedReleaseNote = []edit{{"pgfence_notify_waiters(text, bigint)", "pgfence_notify_payload(waits, tok)", "waits"}}
)

func TestAttackRenewWithReadableValues(t *testing.T) {
	t.Parallel()
	both(t, noRenewSecret, func(t *testing.T, a arena) bool {
		ctx := testCtx(t)
		a.acquire(t, "victim", time.Minute)
		token, owner := a.stolen(t, "victim")
		// A century is refused whatever the proof; within the bound, the
		// owner's name where the secret goes (the nearest guess).
		_, err := a.attacker.Exec(ctx, "SELECT * FROM pgfence.pgfence_renew('{victim}', $1, $2, '{3153600000000}')",
			[]int64{token}, []string{owner})
		requireSQLState(t, err, "22023")
		var n int
		require.NoError(t, a.attacker.QueryRow(ctx, "SELECT count(*) FROM pgfence.pgfence_renew('{victim}', $1, $2, '{600000000}') WHERE renewed",
			[]int64{token}, []string{owner}).Scan(&n))
		return n > 0
	})
}

func TestAttackReleaseWithReadableValues(t *testing.T) {
	t.Parallel()
	both(t, noReleaseSecret, func(t *testing.T, a arena) bool {
		ctx := testCtx(t)
		a.acquire(t, "victim", time.Minute)
		token, owner := a.stolen(t, "victim")
		var n int
		require.NoError(t, a.attacker.QueryRow(ctx, "SELECT count(*) FROM pgfence.pgfence_release('{victim}', $1, $2, '{0}')",
			[]int64{token}, []string{owner}).Scan(&n))
		return n > 0
	})
}

func TestAttackProclaimWithReadableValues(t *testing.T) {
	t.Parallel()
	both(t, noProclaimSecret, func(t *testing.T, a arena) bool {
		ctx := testCtx(t)
		a.acquire(t, "election", time.Minute)
		token, owner := a.stolen(t, "election")
		var ok bool
		require.NoError(t, a.attacker.QueryRow(ctx, "SELECT pgfence.pgfence_leader_proclaim('election', $1, $2, 'attacker:6666')",
			token, owner).Scan(&ok))
		return ok
	})
}

// TestAttackLeaseHeldInOpenTransaction: lease_held in a transaction left
// open locks the lease's row, so that the holder's renewal waits for it or
// skips the lease (which then expires). The renewal runs under a
// lock_timeout: it fails only if it waited.
func TestAttackLeaseHeldInOpenTransaction(t *testing.T) {
	t.Parallel()
	both(t, noLeaseHeldSecret, func(t *testing.T, a arena) bool {
		ctx := testCtx(t)
		token, secret := a.acquire(t, "victim", time.Minute)
		other, otherSecret := a.acquire(t, "beside", time.Minute)
		stolenToken, owner := a.stolen(t, "victim")
		tx, err := a.attacker.Begin(ctx)
		require.NoError(t, err)
		defer func() { _ = tx.Rollback(ctx) }()
		var held bool
		require.NoError(t, tx.QueryRow(ctx, "SELECT pgfence.pgfence_lease_held('victim', $1, $2)", stolenToken, owner).Scan(&held))
		_, err = a.holder.Exec(ctx, "SET lock_timeout = '500ms'")
		require.NoError(t, err)
		var renewed int
		err = a.holder.QueryRow(ctx, "SELECT count(*) FROM pgfence.pgfence_renew('{beside,victim}', $1, $2, '{60000000,60000000}') WHERE renewed",
			[]int64{other, token}, []string{otherSecret, secret}).Scan(&renewed)
		if err != nil {
			requireSQLState(t, err, "55P03") // lock_not_available: the renewal waited
			return true
		}
		return held || renewed < 2
	})
}

// TestAttackUncommittedClaim: an uncommitted acquire of a free name makes
// the victim's acquire of that name, and of an unrelated name in the same
// batch, wait until the attacker's transaction ends.
func TestAttackUncommittedClaim(t *testing.T) {
	t.Parallel()
	both(t, noClaim, func(t *testing.T, a arena) bool {
		ctx := testCtx(t)
		tx, err := a.attacker.Begin(ctx)
		require.NoError(t, err)
		defer func() { _ = tx.Rollback(ctx) }()
		_, err = tx.Exec(ctx, "SELECT * FROM pgfence.pgfence_acquire('{claimed}', 'attacker', '{60000000}')")
		require.NoError(t, err)
		_, err = a.holder.Exec(ctx, "SET statement_timeout = '500ms'")
		require.NoError(t, err)
		for _, names := range [][]string{{"claimed"}, {"claimed", "unrelated"}} {
			ttls := make([]int64, len(names))
			for i := range ttls {
				ttls[i] = 60000000
			}
			rows, err := a.holder.Query(ctx, "SELECT acquired, name, owner FROM pgfence.pgfence_acquire($1, 'holder', $2)", names, ttls)
			require.NoError(t, err)
			got := map[string]bool{}
			for rows.Next() {
				var (
					acquired bool
					name     string
					owner    *string
				)
				require.NoError(t, rows.Scan(&acquired, &name, &owner))
				got[name] = acquired
				if name == "claimed" {
					require.False(t, acquired)
					require.Nil(t, owner, "busy: no holder to report")
				}
			}
			rows.Close()
			if err := rows.Err(); err != nil {
				requireSQLState(t, err, "57014") // query_canceled: it waited
				return true
			}
			if len(names) == 2 {
				require.True(t, got["unrelated"], "the unrelated name is taken at once")
			}
		}
		return false
	})
}

// TestAttackPruneNegativeAge: an age that compares as zero but moves the
// cutoff five days ahead deletes a held lease.
func TestAttackPruneNegativeAge(t *testing.T) {
	t.Parallel()
	both(t, noPruneAgeCheck, func(t *testing.T, a arena) bool {
		ctx := testCtx(t)
		token, _ := a.acquire(t, "victim", time.Minute)
		var deleted int64
		err := a.attacker.QueryRow(ctx, "SELECT pgfence.pgfence_prune_delete('{victim}', $1, '-1 year 360 days')", []int64{token}).Scan(&deleted)
		if err != nil {
			requireSQLState(t, err, "22023")
			_, err = a.attacker.Exec(ctx, "SELECT * FROM pgfence.pgfence_prune_scan('', 10, '-1 year 360 days')")
			requireSQLState(t, err, "22023")
			_, err = a.attacker.Exec(ctx, "SELECT * FROM pgfence.pgfence_prune_scan('', 10, '59 seconds')")
			requireSQLState(t, err, "22023")
			return false
		}
		return deleted > 0
	})
}

// TestAttackCenturiesLongLease: a free name taken for 8,000 years.
func TestAttackCenturiesLongLease(t *testing.T) {
	t.Parallel()
	both(t, noTTLCheck, func(t *testing.T, a arena) bool {
		_, err := a.attacker.Exec(testCtx(t), "SELECT * FROM pgfence.pgfence_acquire('{forever}', 'attacker', $1)",
			[]int64{8000 * 365 * 24 * 3600 * 1_000_000})
		if err != nil {
			requireSQLState(t, err, "22023")
			return false
		}
		return true
	})
}

// TestAttackListenReadsNames: a role with no pgfence grant listens on the
// release channel and reads the released lease's name.
func TestAttackListenReadsNames(t *testing.T) {
	t.Parallel()
	both(t, namedReleaseNote, func(t *testing.T, a arena) bool {
		ctx := testCtx(t)
		outsider := connAs(t, a.db, a.outsider)
		_, err := outsider.Exec(ctx, "LISTEN pgfence_lease_released")
		require.NoError(t, err)
		holdInterest(t, a.db, "alice@example.com") // someone waits: the release notifies
		token, secret := a.acquire(t, "alice@example.com", time.Minute)
		_, err = a.holder.Exec(ctx, "SELECT * FROM pgfence.pgfence_release('{alice@example.com}', $1, $2, '{0}')", []int64{token}, []string{secret})
		require.NoError(t, err)
		wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		n, err := outsider.WaitForNotification(wctx)
		require.NoError(t, err)
		return n.Payload == "alice@example.com"
	})
}
