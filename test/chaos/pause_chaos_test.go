//go:build chaos

package chaos_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/test/chaos"
)

// completeFromChild completes p from the child's next reply line.
func completeFromChild(t *testing.T, ctx context.Context, p *chaos.Pend, c *chaos.Child) {
	t.Helper()
	reply, err := c.Recv(ctx)
	require.NoError(t, err)
	f := strings.Fields(reply)
	switch {
	case len(f) == 3 && f[0] == "ok":
		var v, rt int64
		_, err := fmt.Sscan(f[1]+" "+f[2], &v, &rt)
		require.NoError(t, err)
		p.Complete(chaos.Ok, func(o *chaos.Op) { o.Value, o.RowToken = v, rt })
	case reply == "ok":
		p.Complete(chaos.Ok, nil)
	case reply == "fenced":
		p.Complete(chaos.Fail, func(o *chaos.Op) { o.Fenced = true; o.Err = "fenced" })
	case f[0] == "fail":
		p.Complete(chaos.Fail, func(o *chaos.Op) { o.Err = reply })
	default:
		p.Complete(chaos.Unknown, func(o *chaos.Op) { o.Err = reply })
	}
}

// pausedHolder: a holder in a child process reads the register, is paused
// with SIGSTOP (its lease would expire), a new holder with a newer token
// does its read-modify-write, then the paused one resumes and writes.
func pausedHolder(t *testing.T, guarded bool) {
	ctx := ctxFor(t, 2*time.Minute)
	db := pgtest.NewDB(t)
	reg, err := chaos.NewSQLRegister(ctx, db.Pool, "chaos_register", guarded)
	require.NoError(t, err)
	child, err := chaos.StartChild(ctx, chaos.ChildOpts{URL: db.URL, Table: "chaos_register", Guarded: guarded})
	require.NoError(t, err)
	t.Cleanup(child.Close)
	rec := chaos.NewRecorder()

	const rounds = 3
	for i := 0; i < rounds; i++ {
		// The child holder is granted the lock and reads.
		acq := rec.Invoke(chaos.Op{Process: 0, Kind: chaos.Acquire, Name: "r"})
		t1 := nextToken(t, ctx, db.Pool)
		acq.Complete(chaos.Ok, func(o *chaos.Op) { o.Token = t1 })
		rd := rec.Invoke(chaos.Op{Process: 0, Kind: chaos.Read, Token: t1})
		require.NoError(t, child.Send(fmt.Sprintf("read %d", t1)))
		completeFromChild(t, ctx, rd, child)
		h := rec.History()
		v := h[len(h)-1].Value

		// It is paused; its write is already queued when it stops.
		require.NoError(t, child.Stop(ctx))
		st, err := chaos.ProcessState(child.Pid())
		require.NoError(t, err)
		require.Equal(t, byte('T'), st)
		wr := rec.Invoke(chaos.Op{Process: 0, Kind: chaos.Write, Token: t1, Value: v + 1})
		require.NoError(t, child.Send(fmt.Sprintf("write %d %d", t1, v+1)))

		// Its lease lapses: a new holder takes over and writes.
		acq = rec.Invoke(chaos.Op{Process: 1, Kind: chaos.Acquire, Name: "r"})
		t2 := nextToken(t, ctx, db.Pool)
		acq.Complete(chaos.Ok, func(o *chaos.Op) { o.Token = t2 })
		rd2 := rec.Invoke(chaos.Op{Process: 1, Kind: chaos.Read, Token: t2})
		v2, rt, err := reg.Read(ctx, t2)
		rd2.Complete(chaos.Classify(err), func(o *chaos.Op) { o.Value, o.RowToken = v2, rt })
		require.NoError(t, err)
		wr2 := rec.Invoke(chaos.Op{Process: 1, Kind: chaos.Write, Token: t2, Value: v2 + 1})
		err = reg.Write(ctx, t2, v2+1)
		wr2.Complete(chaos.Classify(err), nil)
		require.NoError(t, err)

		// The paused holder resumes, and its stale write arrives.
		require.NoError(t, child.Cont())
		completeFromChild(t, ctx, wr, child)
	}
	final := finalState(t, ctx, reg)
	h := rec.History()
	if guarded {
		require.Equal(t, rounds, countFenced(h), "every stale write must be fenced")
		verdict(t, h, &chaos.CheckOpts{Name: "process-pause-guarded", Final: &final.Value, Claim: true}, false)
		return
	}
	verdict(t, h, &chaos.CheckOpts{Name: "negative-control-process-pause-unguarded", Final: &final.Value}, true)
}

func TestProcessPauseGuarded(t *testing.T) {
	t.Parallel()
	pausedHolder(t, true)
}

func TestProcessPauseUnguardedIsDetected(t *testing.T) {
	t.Parallel()
	pausedHolder(t, false)
}
