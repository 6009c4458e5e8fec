//go:build chaos

package chaos_test

import (
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence"
	"github.com/pgfence/pgfence/internal/pgtest"
)

// pausedLeader: a leader in a child process (package leader, TTL 300ms)
// changes the work, is stopped with SIGSTOP with its next change queued,
// and stays stopped past its TTL; a candidate in this process takes over
// once the lease expired in the database and changes the work under its
// own term; the child is resumed and its queued change arrives. Each of
// three rounds checks that the child's local deadline came before the new
// term began, that its late change is rejected (guarded) or lands (the
// negative control), and that it then learns its term ended; the history
// check by the database's clock runs over all rounds.
func pausedLeader(t *testing.T, guarded bool) {
	ctx := ctxFor(t, 2*time.Minute)
	db := pgtest.NewDB(t)
	_, err := db.Pool.Exec(ctx, leaderWorkSQL)
	require.NoError(t, err)
	child := startLeaderChild(t, ctx, db.URL, guarded)
	parent := newInProcessCandidate(t, ctx, "parent", db.Pool)
	var terms []termRec
	const rounds = 3
	for i := 0; i < rounds; i++ {
		reply := child.call(t, ctx, "campaign")
		f := strings.Fields(reply)
		require.Len(t, f, 3, reply)
		require.Equal(t, "ok", f[0], reply)
		tok1, err := strconv.ParseInt(f[1], 10, 64)
		require.NoError(t, err)
		old := termRec{who: "child", token: tok1, began: parseUnixNano(t, f[2])}
		require.Equal(t, "ok", child.call(t, ctx, "write "+f[1]))

		// SIGSTOP, with its next change queued: nothing renews its lease.
		child.stop(t, ctx)
		stopped := time.Now()
		child.send(t, "write "+f[1])

		term, err := parent.e.Campaign(ctx)
		require.NoError(t, err)
		require.Greater(t, term.Token(), tok1)
		rec, ended := watchTerm("parent", term)
		t.Logf("round %d: the child was stopped for %v when the parent's term began", i, time.Since(stopped).Round(time.Millisecond))
		// The new leader changes the work first (so the fence is ahead of
		// the child's token too); then the child resumes.
		require.NoError(t, leaderWrite(ctx, db.Pool, term.Token(), term.Lease().Secret(), true))
		child.cont(t)
		late := child.recv(t, ctx)
		if guarded {
			require.True(t, strings.HasPrefix(late, "fenced "), "the paused leader's late change must be rejected: %s", late)
		} else {
			require.Equal(t, "ok", late, "unguarded: the late change lands")
		}
		endReply := child.call(t, ctx, "waitended")
		e := strings.SplitN(endReply, " ", 4)
		require.Len(t, e, 4, endReply)
		require.Equal(t, "ended", e[0], "the resumed child must learn its term ended: %s", endReply)
		require.Contains(t, e[3], pgfence.ErrLeaseLost.Error())
		old.deadline, old.learned, old.cause = parseUnixNano(t, e[1]), parseUnixNano(t, e[2]), e[3]
		// A paused process learns only when it runs again, after the new
		// term began: what protects the new term is the deadline and the
		// fence, not the learning (the negative control of that check).
		require.NotEmpty(t, checkDeadlines([]termRec{old, *rec}, true), "a stopped process cannot learn before the next term")
		terms = append(terms, old)
		require.Equal(t, "ok", child.call(t, ctx, "resign"))
		require.NoError(t, term.Resign(ctx))
		<-ended
		terms = append(terms, *rec)
	}
	scenario := "leader-sigstop"
	if !guarded {
		scenario = "negative-control-leader-sigstop-unguarded"
	}
	requireLeaderHistory(t, scenario, terms, readLeaderLog(t, ctx, db.Pool), !guarded)
}

func TestLeaderSIGSTOPPastTTL(t *testing.T) {
	t.Parallel()
	pausedLeader(t, true)
}

// Negative control: the same pause with unguarded changes: the resumed
// leader's change lands after the next term began, and the history check
// by the database's clock reports the overlap.
func TestLeaderSIGSTOPUnguardedIsDetected(t *testing.T) {
	t.Parallel()
	pausedLeader(t, false)
}
