//go:build chaos

package chaos_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/leasetable"
	"github.com/pgfence/pgfence/test/chaos"
)

// pausedPermitHolder: a holder in a child process, granted the one permit
// of a semaphore with a 300ms TTL, reads the permit's guard row and is
// paused with SIGSTOP past the TTL; a Locker's AcquirePermit gets the
// permit with a newer token and does its read-modify-write; the paused
// holder resumes and its write arrives.
func pausedPermitHolder(t *testing.T, guarded bool) {
	ctx := ctxFor(t, 2*time.Minute)
	db := pgtest.NewDB(t)
	reg, err := chaos.NewSQLRegister(ctx, db.Pool, "chaos_register", guarded)
	require.NoError(t, err)
	child, err := chaos.StartChild(ctx, chaos.ChildOpts{URL: db.URL, Table: "chaos_register", Guarded: guarded})
	require.NoError(t, err)
	t.Cleanup(child.Close)
	k, err := leasetable.New(ctx, db.NewPool(t, nil), nil)
	require.NoError(t, err)
	t.Cleanup(k.Close)
	rec := chaos.NewRecorder()

	const rounds = 3
	for range rounds {
		acq := rec.Invoke(chaos.Op{Process: 0, Kind: chaos.Acquire, Name: "sem"})
		var ok bool
		var name string
		var t1 int64
		require.NoError(t, db.Pool.QueryRow(ctx, `SELECT acquired, name, fence FROM pgfence.pgfence_acquire_permit('sem', 1, 'child', 300000)`).
			Scan(&ok, &name, &t1))
		require.True(t, ok)
		acq.Complete(chaos.Ok, func(o *chaos.Op) { o.Name, o.Token = name, t1 })
		rd := rec.Invoke(chaos.Op{Process: 0, Kind: chaos.Read, Token: t1})
		require.NoError(t, child.Send(fmt.Sprintf("read %d", t1)))
		completeFromChild(t, ctx, rd, child)
		h := rec.History()
		v := h[len(h)-1].Value

		require.NoError(t, child.Stop(ctx))
		wr := rec.Invoke(chaos.Op{Process: 0, Kind: chaos.Write, Token: t1, Value: v + 1})
		require.NoError(t, child.Send(fmt.Sprintf("write %d %d", t1, v+1)))

		// The permit expires; the waiting AcquirePermit gets it.
		acq = rec.Invoke(chaos.Op{Process: 1, Kind: chaos.Acquire, Name: "sem"})
		l, err := k.AcquirePermit(ctx, "sem", 1, nil)
		require.NoError(t, err)
		acq.Complete(chaos.Ok, func(o *chaos.Op) { o.Name, o.Token = l.Name(), l.Token() })
		require.Equal(t, name, l.Name(), "the same permit")
		rd2 := rec.Invoke(chaos.Op{Process: 1, Kind: chaos.Read, Token: l.Token()})
		v2, rt, err := reg.Read(ctx, l.Token())
		rd2.Complete(chaos.Classify(err), func(o *chaos.Op) { o.Value, o.RowToken = v2, rt })
		require.NoError(t, err)
		wr2 := rec.Invoke(chaos.Op{Process: 1, Kind: chaos.Write, Token: l.Token(), Value: v2 + 1})
		err = reg.Write(ctx, l.Token(), v2+1)
		wr2.Complete(chaos.Classify(err), nil)
		require.NoError(t, err)
		rel := rec.Invoke(chaos.Op{Process: 1, Kind: chaos.Release, Name: l.Name(), Token: l.Token()})
		rel.Complete(chaos.Classify(l.Release(ctx)), nil)

		require.NoError(t, child.Cont())
		completeFromChild(t, ctx, wr, child)
	}
	final := finalState(t, ctx, reg)
	h := rec.History()
	require.Empty(t, chaos.CheckPermitCap(h, 1), "the paused holder is fenced out, not a second valid permit")
	require.Empty(t, chaos.CheckTokensIncreasing(h))
	if guarded {
		require.Equal(t, rounds, countFenced(h), "every stale write must be fenced")
		verdict(t, h, &chaos.CheckOpts{Name: "permit-pause-guarded", Final: &final.Value, Claim: true}, false)
		return
	}
	verdict(t, h, &chaos.CheckOpts{Name: "negative-control-permit-pause-unguarded", Final: &final.Value}, true)
}

// TestPermitPauseGuarded: the paused permit holder's late writes are fenced
// through the permit's token, and the history is linearizable.
func TestPermitPauseGuarded(t *testing.T) {
	t.Parallel()
	pausedPermitHolder(t, true)
}

// TestPermitPauseUnguardedIsDetected: the negative control: the same with
// an unguarded register loses updates, and the checker says so.
func TestPermitPauseUnguardedIsDetected(t *testing.T) {
	t.Parallel()
	pausedPermitHolder(t, false)
}
