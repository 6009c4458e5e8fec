//go:build chaos

package chaos_test

import (
	"errors"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence"
	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/leader"
)

// restartedServer: the leader's server goes down (crashed with SIGKILL,
// or shut down cleanly) for longer than the lease's TTL and comes back.
// The leader cannot renew meanwhile: its term must end at its local
// deadline, while the server is down, before the follower (campaigning
// again after each failed attempt) begins the next term after the
// restart, with a newer token (tokens survive the crash). The old
// leader's late change is rejected (guarded) or lands (the negative
// control). Two rounds, one per kind of restart.
func restartedServer(t *testing.T, guarded bool) {
	ctx := ctxFor(t, 3*time.Minute)
	c, s := pgtest.NewCluster(t, nil)
	db := s.NewDB(t)
	_, err := db.Pool.Exec(ctx, leaderWorkSQL)
	require.NoError(t, err)
	short := func(cfg *pgxpool.Config) { cfg.ConnConfig.ConnectTimeout = time.Second }
	oldPool, followerPool := db.NewPool(t, short), db.NewPool(t, short)
	old := newInProcessCandidate(t, ctx, "leader", oldPool)
	follower := newInProcessCandidate(t, ctx, "follower", followerPool)
	var terms []termRec
	for i, crash := range []bool{true, false} {
		term, err := old.e.Campaign(ctx)
		require.NoError(t, err)
		rec, ended := watchTerm("leader", term)
		require.NoError(t, leaderWrite(ctx, oldPool, term.Token(), term.Lease().Secret(), true))

		won := make(chan *leader.Term, 1)
		go func() {
			// Campaign returns database errors; campaign again, as Run
			// does, until the server is back.
			for ctx.Err() == nil {
				next, err := follower.e.Campaign(ctx)
				if err == nil {
					won <- next
					return
				}
				time.Sleep(20 * time.Millisecond)
			}
			won <- nil
		}()
		down := time.Now()
		if crash {
			require.NoError(t, c.Crash(syscall.SIGKILL))
		} else {
			require.NoError(t, c.Stop())
		}
		<-ended // while the server is down: at the term's local deadline
		require.ErrorIs(t, term.Err(), pgfence.ErrLeaseLost)
		time.Sleep(inProcessTTL) // the lease expires in the database too
		require.NoError(t, c.Start(ctx))
		up := time.Now()
		next := <-won
		require.NotNil(t, next)
		require.Greater(t, next.Token(), term.Token())
		nrec, nended := watchTerm("follower", next)
		require.True(t, rec.learned.Before(up), "the old leader learnt while the server was down")
		// Both pools still hold connections the restart broke: a change
		// that fails on one is retried on a fresh one.
		write := func(pool *pgxpool.Pool, token int64, secret pgfence.Secret, guarded bool) (err error) {
			for attempt := 0; attempt < 20; attempt++ {
				if err = leaderWrite(ctx, pool, token, secret, guarded); err == nil || !isConnErr(err) {
					return err
				}
				time.Sleep(50 * time.Millisecond)
			}
			return err
		}
		if err := write(followerPool, next.Token(), next.Lease().Secret(), true); err != nil {
			// Its renewals can meet the broken connections too: on a
			// loaded machine its short term may end before it writes.
			require.ErrorIs(t, err, pgfence.ErrFenced)
			require.Error(t, next.Err(), "rejected only once its term ended: %v", err)
		}
		lateErr := write(oldPool, term.Token(), term.Lease().Secret(), guarded)
		if guarded {
			require.ErrorIs(t, lateErr, pgfence.ErrFenced, "the old leader's late change must be rejected")
		} else {
			require.NoError(t, lateErr, "unguarded: the late change lands")
		}
		t.Logf("round %d (crash %v): server down %v; the old term ended %v after it went down; the next term began %v after Start returned (negative: during its readiness check)",
			i, crash, up.Sub(down).Round(time.Millisecond), rec.learned.Sub(down).Round(time.Millisecond),
			next.BeganAt().Sub(up).Round(time.Millisecond))
		if err := next.Resign(ctx); err != nil {
			require.ErrorIs(t, err, pgfence.ErrNotHeld)
			t.Logf("round %d: the follower's term %d had ended before it resigned: %v", i, next.Token(), next.Err())
		}
		<-nended
		terms = append(terms, *rec, *nrec)
	}
	scenario := "leader-server-restart"
	if !guarded {
		scenario = "negative-control-leader-server-restart-unguarded"
	}
	require.Empty(t, checkDeadlines(terms, true), "the old leader learnt before the next term began")
	requireLeaderHistory(t, scenario, terms, readLeaderLog(t, ctx, db.Pool), !guarded)
}

// isConnErr reports whether err came from a connection that the restart
// broke (the write did not reach the new server).
func isConnErr(err error) bool {
	if errors.Is(err, pgfence.ErrFenced) {
		return false
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return strings.HasPrefix(pgErr.Code, "08") || strings.HasPrefix(pgErr.Code, "57")
	}
	return true
}

func TestLeaderServerRestart(t *testing.T) {
	t.Parallel()
	restartedServer(t, true)
}

// Negative control: the same restarts with unguarded changes: the old
// leader's late change lands, and the history check reports the overlap.
func TestLeaderServerRestartUnguardedIsDetected(t *testing.T) {
	t.Parallel()
	restartedServer(t, false)
}
