//go:build chaos

package chaos_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence"
	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/leader"
	"github.com/pgfence/pgfence/test/chaos"
)

// killedBackend: the leader runs as an application role with pgfence's
// grants only; its backends (pool and LISTEN connection) are killed with
// pg_terminate_backend while the role may not log in again, so its lease
// is no longer renewed. Its term must end at its local deadline, before
// the follower (waiting in Campaign) begins the next term; once the role
// may log in again, its late change is rejected (guarded) or lands (the
// negative control). Three rounds; the history check covers them all.
func killedBackend(t *testing.T, guarded bool) {
	ctx := ctxFor(t, 2*time.Minute)
	db := pgtest.NewDB(t)
	_, err := db.Pool.Exec(ctx, leaderWorkSQL)
	require.NoError(t, err)
	role := newRole(t, db)
	ident := pgx.Identifier{role}.Sanitize()
	const app = "chaos-leader-victim"
	victimPool := db.NewPool(t, func(c *pgxpool.Config) {
		c.ConnConfig.User = role
		c.ConnConfig.RuntimeParams["application_name"] = app
		c.ConnConfig.ConnectTimeout = time.Second
	})
	victim := newInProcessCandidate(t, ctx, "victim", victimPool)
	follower := newInProcessCandidate(t, ctx, "follower", db.Pool)
	var terms []termRec
	for i := 0; i < 3; i++ {
		term, err := victim.e.Campaign(ctx)
		require.NoError(t, err)
		old, oldEnded := watchTerm("victim", term)
		require.NoError(t, leaderWrite(ctx, victimPool, term.Token(), term.Lease().Secret(), true))

		won := make(chan *leader.Term, 1)
		go func() {
			next, err := follower.e.Campaign(ctx)
			if err != nil {
				t.Error(err)
				logElection(t, db, role)
			}
			won <- next
		}()
		_, err = db.Pool.Exec(ctx, "ALTER ROLE "+ident+" NOLOGIN")
		require.NoError(t, err)
		killedAt := time.Now()
		killed, err := chaos.TerminateBackends(ctx, db.Pool, db.Name, app)
		require.NoError(t, err)
		require.Positive(t, killed)
		// The victim's lease as the kill left it: it can renew no more.
		held, ok, err := follower.locker.Get(ctx, leaderElection)
		require.NoError(t, err)
		next := <-won
		require.NotNil(t, next)
		rec, ended := watchTerm("follower", next)
		<-oldEnded // already: its deadline came first (checked below)
		require.ErrorIs(t, term.Err(), pgfence.ErrLeaseLost)
		require.NoError(t, leaderWrite(ctx, db.Pool, next.Token(), next.Lease().Secret(), true))

		// The victim's session is back; its late change arrives.
		_, err = db.Pool.Exec(ctx, "ALTER ROLE "+ident+" LOGIN")
		require.NoError(t, err)
		err = leaderWrite(ctx, victimPool, term.Token(), term.Lease().Secret(), guarded)
		if guarded {
			require.ErrorIs(t, err, pgfence.ErrFenced, "the old leader's late change must be rejected")
		} else {
			require.NoError(t, err, "unguarded: the late change lands")
		}
		takeover := "(the lease had expired when read)"
		if ok && held.Token == term.Token() {
			takeover = fmt.Sprintf("%v after the victim's lease expired (database clock)", next.BeganAt().Sub(held.ExpiresAt).Round(time.Microsecond))
		}
		t.Logf("round %d: killed %d backends of the leader (token %d); the follower's term %d began %v after the kill, %s",
			i, killed, term.Token(), next.Token(), next.BeganAt().Sub(killedAt).Round(time.Millisecond), takeover)
		require.NoError(t, next.Resign(ctx))
		<-ended
		terms = append(terms, *old, *rec)
	}
	scenario := "leader-killed-backend"
	if !guarded {
		scenario = "negative-control-leader-killed-backend-unguarded"
	}
	// In this process the old leader also learnt of the end before the
	// next term began (its context was cancelled at the deadline).
	require.Empty(t, checkDeadlines(terms, true), "the old leader learnt before the next term began")
	requireLeaderHistory(t, scenario, terms, readLeaderLog(t, ctx, db.Pool), !guarded)
}

func TestLeaderKilledBackend(t *testing.T) {
	t.Parallel()
	killedBackend(t, true)
}

// Negative control: the same with unguarded changes: the old leader's late
// change lands, and the history check reports the overlap.
func TestLeaderKilledBackendUnguardedIsDetected(t *testing.T) {
	t.Parallel()
	killedBackend(t, false)
}

// logElection logs the election's lease row, read on the database clock,
// and the backends of role still connected: when a follower's campaign
// fails, they tell whether the old leader's lease went on being renewed
// (and through which backend) or the follower did not take a free lease.
func logElection(t *testing.T, db *pgtest.DB, role string) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var owner string
	var token int64
	var left float64
	err := db.Pool.QueryRow(ctx, `SELECT owner, fence, extract(epoch FROM expires_at - clock_timestamp())::float8 FROM pgfence.pgfence_leases WHERE name = $1`,
		leaderElection).Scan(&owner, &token, &left)
	t.Logf("election lease: owner %q, token %d, expires in %.3fs (err %v)", owner, token, left, err)
	rows, err := db.Pool.Query(ctx, `SELECT pid, application_name, backend_start::text, state, coalesce(query, '') FROM pg_stat_activity WHERE usename = $1`, role)
	if err != nil {
		t.Logf("backends of %s: %v", role, err)
		return
	}
	defer rows.Close()
	for rows.Next() {
		v, err := rows.Values()
		t.Logf("backend of %s still connected: %v (err %v)", role, v, err)
	}
}
