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

// The attacks of an application role on another's leases (issue 33), each
// run against the latest schema, where it must fail, and against version 11
// (ownership proven by name, token and owner) as its negative control,
// where it succeeds. The attacker has what pgfence grant gives (at 11, the
// same functions and tables).

// arena is an install at some version with two application roles: holder
// takes leases, attacker attacks them.
type arena struct {
	db               *pgtest.DB
	holder, attacker *pgx.Conn
	outsider         string // a role with no pgfence grant
	latest           bool
}

func newArena(t *testing.T, version uint) arena {
	t.Helper()
	ctx := testCtx(t)
	roles := newRoles(t, "holder", "attacker", "outsider") // before the database: dropped after it
	db := dbAt(t, version)
	for _, r := range roles[:2] {
		if version == migrations.Latest() {
			require.NoError(t, migrations.Grant(ctx, migrations.Target{URL: db.URL}, r, nil, nil))
			continue
		}
		id := pgx.Identifier{r}.Sanitize()
		exec(t, db, "GRANT USAGE ON SCHEMA pgfence TO "+id,
			"GRANT SELECT ON pgfence.pgfence_leases, pgfence.pgfence_leaders TO "+id,
			"GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA pgfence TO "+id)
	}
	return arena{db: db, holder: connAs(t, db, roles[0]), attacker: connAs(t, db, roles[1]), outsider: roles[2],
		latest: version == migrations.Latest()}
}

// acquire takes name for the holder and returns its token and, from
// version 12, its secret.
func (a arena) acquire(t *testing.T, name string, ttl time.Duration) (int64, string) {
	t.Helper()
	var (
		token  int64
		secret string
	)
	if a.latest {
		require.NoError(t, a.holder.QueryRow(testCtx(t), "SELECT fence, secret FROM pgfence.pgfence_acquire($1, 'holder', $2) WHERE acquired",
			[]string{name}, []int64{ttl.Microseconds()}).Scan(&token, &secret))
	} else {
		require.NoError(t, a.holder.QueryRow(testCtx(t), "SELECT fence FROM pgfence.pgfence_acquire($1, 'holder', $2) WHERE acquired",
			[]string{name}, []int64{ttl.Microseconds()}).Scan(&token))
	}
	return token, secret
}

// stolen is what any granted role reads about a lease: its token and owner.
func (a arena) stolen(t *testing.T, name string) (token int64, owner string) {
	t.Helper()
	require.NoError(t, a.attacker.QueryRow(testCtx(t), "SELECT fence, owner FROM pgfence.pgfence_leases WHERE name = $1", name).Scan(&token, &owner))
	return token, owner
}

// both runs attack against the latest schema and against version 11; the
// attack reports whether it succeeded.
func both(t *testing.T, attack func(t *testing.T, a arena) bool) {
	t.Helper()
	t.Run("latest", func(t *testing.T) {
		t.Parallel()
		require.False(t, attack(t, newArena(t, migrations.Latest())), "the attack must fail on the latest schema")
	})
	t.Run("control-11", func(t *testing.T) {
		t.Parallel()
		require.True(t, attack(t, newArena(t, 11)), "negative control: the attack succeeds at version 11")
	})
}

func TestAttackRenewWithReadableValues(t *testing.T) {
	t.Parallel()
	both(t, func(t *testing.T, a arena) bool {
		ctx := testCtx(t)
		a.acquire(t, "victim", time.Minute)
		token, owner := a.stolen(t, "victim")
		if a.latest {
			// A century is refused whatever the proof; within the bound,
			// the owner's name where the secret goes (the nearest guess).
			_, err := a.attacker.Exec(ctx, "SELECT * FROM pgfence.pgfence_renew('{victim}', $1, $2, '{3153600000000}')",
				[]int64{token}, []string{owner})
			requireSQLState(t, err, "22023")
			var n int
			require.NoError(t, a.attacker.QueryRow(ctx, "SELECT count(*) FROM pgfence.pgfence_renew('{victim}', $1, $2, '{600000000}') WHERE renewed",
				[]int64{token}, []string{owner}).Scan(&n))
			return n > 0
		}
		var n int
		require.NoError(t, a.attacker.QueryRow(ctx, "SELECT count(*) FROM pgfence.pgfence_renew('{victim}', $1, '{3153600000000}')",
			[]int64{token}).Scan(&n))
		return n > 0
	})
}

func TestAttackReleaseWithReadableValues(t *testing.T) {
	t.Parallel()
	both(t, func(t *testing.T, a arena) bool {
		ctx := testCtx(t)
		a.acquire(t, "victim", time.Minute)
		token, owner := a.stolen(t, "victim")
		var n int
		if a.latest {
			require.NoError(t, a.attacker.QueryRow(ctx, "SELECT count(*) FROM pgfence.pgfence_release('{victim}', $1, $2, '{0}')",
				[]int64{token}, []string{owner}).Scan(&n))
		} else {
			require.NoError(t, a.attacker.QueryRow(ctx, "SELECT count(*) FROM pgfence.pgfence_release('{victim}', $1, '{0}', $2)",
				[]int64{token}, owner).Scan(&n))
		}
		return n > 0
	})
}

func TestAttackProclaimWithReadableValues(t *testing.T) {
	t.Parallel()
	both(t, func(t *testing.T, a arena) bool {
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
// open locks the lease's row, so that the holder's renewal waits (and the
// lease, with every lease renewed beside it, expires). The renewal here runs
// under a lock_timeout: it fails only if it waited.
func TestAttackLeaseHeldInOpenTransaction(t *testing.T) {
	t.Parallel()
	both(t, func(t *testing.T, a arena) bool {
		ctx := testCtx(t)
		token, secret := a.acquire(t, "victim", time.Minute)
		other, otherSecret := a.acquire(t, "beside", time.Minute)
		stolenToken, owner := a.stolen(t, "victim")
		tx, err := a.attacker.Begin(ctx)
		require.NoError(t, err)
		defer func() { _ = tx.Rollback(ctx) }()
		var held bool
		if a.latest {
			require.NoError(t, tx.QueryRow(ctx, "SELECT pgfence.pgfence_lease_held('victim', $1, $2)", stolenToken, owner).Scan(&held))
		} else {
			require.NoError(t, tx.QueryRow(ctx, "SELECT pgfence.pgfence_lease_held('victim', $1)", stolenToken).Scan(&held))
		}
		_, err = a.holder.Exec(ctx, "SET lock_timeout = '500ms'")
		require.NoError(t, err)
		var renewed int
		if a.latest {
			err = a.holder.QueryRow(ctx, "SELECT count(*) FROM pgfence.pgfence_renew('{beside,victim}', $1, $2, '{60000000,60000000}') WHERE renewed",
				[]int64{other, token}, []string{otherSecret, secret}).Scan(&renewed)
		} else {
			err = a.holder.QueryRow(ctx, "SELECT count(*) FROM pgfence.pgfence_renew('{beside,victim}', $1, '{60000000,60000000}')",
				[]int64{other, token}).Scan(&renewed)
		}
		if err != nil {
			requireSQLState(t, err, "55P03") // lock_not_available: the renewal waited
			return true
		}
		require.Equal(t, 2, renewed, "both leases renewed at once")
		return held
	})
}

// TestAttackUncommittedClaim: an uncommitted acquire of a free name makes
// the victim's acquire of that name, and of an unrelated name in the same
// batch, wait until the attacker's transaction ends.
func TestAttackUncommittedClaim(t *testing.T) {
	t.Parallel()
	both(t, func(t *testing.T, a arena) bool {
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
	both(t, func(t *testing.T, a arena) bool {
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
	both(t, func(t *testing.T, a arena) bool {
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
	both(t, func(t *testing.T, a arena) bool {
		ctx := testCtx(t)
		outsider := connAs(t, a.db, a.outsider)
		_, err := outsider.Exec(ctx, "LISTEN pgfence_lease_released")
		require.NoError(t, err)
		token, secret := a.acquire(t, "alice@example.com", time.Minute)
		if a.latest {
			_, err = a.holder.Exec(ctx, "SELECT * FROM pgfence.pgfence_release('{alice@example.com}', $1, $2, '{0}')", []int64{token}, []string{secret})
		} else {
			_, err = a.holder.Exec(ctx, "SELECT * FROM pgfence.pgfence_release('{alice@example.com}', $1, '{0}', 'holder')", []int64{token})
		}
		require.NoError(t, err)
		wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		n, err := outsider.WaitForNotification(wctx)
		require.NoError(t, err)
		return n.Payload == "alice@example.com"
	})
}
