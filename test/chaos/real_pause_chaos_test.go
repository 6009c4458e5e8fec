//go:build chaos

package chaos_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/leasetable"
	"github.com/pgfence/pgfence/test/chaos"
)

// childCall sends line to the child and returns its reply.
func childCall(t *testing.T, ctx context.Context, c *chaos.Child, line string) string {
	t.Helper()
	require.NoError(t, c.Send(line))
	reply, err := c.Recv(ctx)
	require.NoError(t, err)
	return reply
}

// pausedLease: a child process takes a REAL leasetable lease (TTL 300ms,
// renewed by its watchdog) and claims the register; it is stopped with
// SIGSTOP with its write queued; its lease expires in the database; a new
// holder in this process acquires the lease (a newer token), reads and
// writes; the child is resumed (SIGCONT) and its stale write arrives. The
// child must then observe the loss (Lease.Done closed, Err matching
// pgfence.ErrLeaseLost). register is the child's and the parent's register:
// "fence" (token fencing), "fence-lease" (fencing and lease-checked),
// "fence-noclaim" (fencing, the new holder writes after the stale write: a
// negative control for the claiming read) or "sql" (unguarded writes: the
// negative control).
func pausedLease(t *testing.T, register string) chaos.History {
	guarded := register != "sql"
	const ttl = 300 * time.Millisecond
	const name = "chaos-paused"
	const table = "chaos_register"
	ctx := ctxFor(t, 2*time.Minute)
	db := pgtest.NewDB(t)
	var reg chaos.Register
	var err error
	switch register {
	case "fence":
		reg, err = chaos.NewFenceRegister(ctx, db.Pool, table, "")
	case "fence-noclaim":
		var fr *chaos.FenceRegister
		fr, err = chaos.NewFenceRegister(ctx, db.Pool, table, "")
		if err == nil {
			reg = fr.WithoutClaim()
		}
	case "fence-lease":
		reg, err = chaos.NewFenceRegister(ctx, db.Pool, table, name)
	default:
		reg, err = chaos.NewSQLRegister(ctx, db.Pool, table, guarded)
	}
	require.NoError(t, err)
	admin, err := chaos.NewSQLRegister(ctx, db.Pool, table, true)
	require.NoError(t, err)
	child, err := chaos.StartChild(ctx, chaos.ChildOpts{URL: db.URL, Table: table, Guarded: guarded, Register: register, LeaseTTL: ttl})
	require.NoError(t, err)
	t.Cleanup(child.Close)
	locker, err := leasetable.New(ctx, db.Pool, &leasetable.Config{TTL: ttl})
	require.NoError(t, err)
	t.Cleanup(locker.Close)
	rec := chaos.NewRecorder()

	const rounds = 3
	for i := 0; i < rounds; i++ {
		// The child takes the lease and claims the register.
		acq := rec.Invoke(chaos.Op{Process: 0, Kind: chaos.Acquire, Name: name})
		reply := childCall(t, ctx, child, "acquire "+name)
		require.True(t, strings.HasPrefix(reply, "ok "), reply)
		t1, err := strconv.ParseInt(strings.TrimPrefix(reply, "ok "), 10, 64)
		require.NoError(t, err)
		acq.Complete(chaos.Ok, func(o *chaos.Op) { o.Token = t1 })
		rd := rec.Invoke(chaos.Op{Process: 0, Kind: chaos.Read, Token: t1})
		require.NoError(t, child.Send(fmt.Sprintf("read %d", t1)))
		completeFromChild(t, ctx, rd, child)
		h := rec.History()
		v := h[len(h)-1].Value

		// SIGSTOP, with its write queued: nothing renews its lease now.
		require.NoError(t, child.Stop(ctx))
		wr := rec.Invoke(chaos.Op{Process: 0, Kind: chaos.Write, Token: t1, Value: v + 1})
		require.NoError(t, child.Send(fmt.Sprintf("write %d %d", t1, v+1)))

		// A new holder gets the lease once it expired in the database.
		acq = rec.Invoke(chaos.Op{Process: 1, Kind: chaos.Acquire, Name: name})
		lease, err := locker.Acquire(ctx, name, nil)
		require.NoError(t, err)
		t2 := lease.Token()
		acq.Complete(chaos.Ok, func(o *chaos.Op) { o.Token = t2 })
		require.Greater(t, t2, t1)
		reg := reg
		if hr, ok := reg.(chaos.HolderRegister); ok {
			reg = hr.ForHolder(lease) // a lease-checked register presents the new holder's secret
		}
		rd2 := rec.Invoke(chaos.Op{Process: 1, Kind: chaos.Read, Token: t2})
		v2, rt, err := reg.Read(ctx, t2)
		rd2.Complete(chaos.Classify(err), func(o *chaos.Op) { o.Value, o.RowToken = v2, rt })
		require.NoError(t, err)
		write2 := func() {
			wr2 := rec.Invoke(chaos.Op{Process: 1, Kind: chaos.Write, Token: t2, Value: v2 + 1})
			err = reg.Write(ctx, t2, v2+1)
			wr2.Complete(chaos.Classify(err), nil)
			require.NoError(t, err)
		}
		noClaim := register == "fence-noclaim"
		if !noClaim {
			write2()
		}

		// SIGCONT: the stale write arrives, then the child learns of the
		// loss. Without a claim, the new holder has only read so far: the
		// stale write passes the fence, and the new holder's write then
		// overwrites it (a lost update).
		require.NoError(t, child.Cont())
		completeFromChild(t, ctx, wr, child)
		if noClaim {
			write2()
		}
		lost := childCall(t, ctx, child, "waitlost")
		require.True(t, strings.HasPrefix(lost, "lost "), "the resumed child must observe its lease lost: %s", lost)
		t.Logf("round %d: child token %d, new holder %d; child's write: %s; child observed: %s",
			i, t1, t2, rec.History()[lastChildWrite(rec)].Outcome, lost)
		childCall(t, ctx, child, "release") // reports the lease was not held
		require.NoError(t, lease.Release(ctx))
	}
	final := finalState(t, ctx, admin)
	h := rec.History()
	scenario := "process-pause-real-lease-" + register
	if register == "sql" {
		verdict(t, h, &chaos.CheckOpts{Name: "negative-control-" + scenario + "-unguarded", Final: &final.Value}, true)
		return h
	}
	if register == "fence-noclaim" {
		verdict(t, h, &chaos.CheckOpts{Name: "negative-control-" + scenario, Final: &final.Value}, true)
		return h
	}
	verdict(t, h, &chaos.CheckOpts{Name: scenario, Final: &final.Value, Claim: true}, false)
	return h
}

// lastChildWrite is the index of the child's last write in rec's history.
func lastChildWrite(rec *chaos.Recorder) int {
	h := rec.History()
	for i := len(h) - 1; i >= 0; i-- {
		if h[i].Kind == chaos.Write && h[i].Process == 0 {
			return i
		}
	}
	return 0
}

func TestRealLeaseProcessPauseFenced(t *testing.T) {
	t.Parallel()
	h := pausedLease(t, "fence")
	require.Equal(t, 3, countFencedKind(h, chaos.Write), "every stale write must be fenced")
}

func TestRealLeaseProcessPauseLeaseChecked(t *testing.T) {
	t.Parallel()
	h := pausedLease(t, "fence-lease")
	// Lease-checked: the stale write is rejected because its lease is gone.
	for _, op := range h {
		if op.Kind == chaos.Write && op.Process == 0 {
			require.Equal(t, chaos.Fail, op.Outcome, "%s", op)
			require.Contains(t, op.Err, "lease lost")
		}
	}
}

// Negative control for the claiming read: fenced writes alone, with plain
// reads, do not protect a read-modify-write. The new holder reads before
// the stale write arrives, which passes the fence (nobody newer has written
// yet), and then writes the same value: an update is lost.
func TestRealLeaseProcessPauseFencedWithoutClaimIsDetected(t *testing.T) {
	t.Parallel()
	h := pausedLease(t, "fence-noclaim")
	require.Zero(t, countFencedKind(h, chaos.Write), "without a claim, the stale writes pass the fence")
}

// Negative control: the same real lease, paused past its TTL, with
// unguarded writes: the stale write lands and the checker says so.
func TestRealLeaseProcessPauseUnguardedIsDetected(t *testing.T) {
	t.Parallel()
	pausedLease(t, "sql")
}

// Negative control of the model, with a real lease: a write sent through
// the proxy while it delays every chunk by 500ms, with a 200ms deadline,
// fails on the client (outcome unknown) but reaches the server and lands;
// the holder then reads it back. The fenced model (unknown operations may
// have taken effect) accepts the history; the naive model (unknown means
// failed) must flag it.
func TestRealLeaseUnknownWriteNaiveModelIsDetected(t *testing.T) {
	t.Parallel()
	ctx := ctxFor(t, time.Minute)
	db := pgtest.NewDB(t)
	p, url := newProxy(t, db)
	// One connection, so the write below runs on the connection where
	// its statement is already prepared: the delayed round trip is then
	// the write itself, not pgx's prepare.
	pool := appPool(t, ctx, url, "chaos-locker", 1, nil)
	reg, err := chaos.NewFenceRegister(ctx, pool, "chaos_register", "")
	require.NoError(t, err)
	admin, err := chaos.NewSQLRegister(ctx, db.Pool, "chaos_register", true)
	require.NoError(t, err)
	locker, err := leasetable.New(ctx, db.Pool, &leasetable.Config{TTL: 10 * time.Second})
	require.NoError(t, err)
	t.Cleanup(locker.Close)
	rec := chaos.NewRecorder()

	acq := rec.Invoke(chaos.Op{Process: 0, Kind: chaos.Acquire, Name: "r"})
	lease, err := locker.Acquire(ctx, "r", nil)
	require.NoError(t, err)
	tok := lease.Token()
	acq.Complete(chaos.Ok, func(o *chaos.Op) { o.Token = tok })
	read := func() int64 {
		rd := rec.Invoke(chaos.Op{Process: 0, Kind: chaos.Read, Token: tok})
		v, rt, err := reg.Read(ctx, tok)
		require.NoError(t, err)
		rd.Complete(chaos.Ok, func(o *chaos.Op) { o.Value, o.RowToken = v, rt })
		return v
	}
	v := read()
	wr := rec.Invoke(chaos.Op{Process: 0, Kind: chaos.Write, Token: tok, Value: v + 1})
	require.NoError(t, reg.Write(ctx, tok, v+1))
	wr.Complete(chaos.Ok, nil)
	v++

	p.SetLatency(500 * time.Millisecond)
	wr = rec.Invoke(chaos.Op{Process: 0, Kind: chaos.Write, Token: tok, Value: v + 1})
	wctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	err = reg.Write(wctx, tok, v+1)
	cancel()
	require.Error(t, err)
	outcome := chaos.Classify(err)
	wr.Complete(outcome, func(o *chaos.Op) { o.Err = err.Error() })
	require.Equal(t, chaos.Unknown, outcome, "%v", err)
	// The delayed write lands after the client gave up on it.
	for {
		s, err := admin.Final(ctx)
		require.NoError(t, err)
		if s.Value == v+1 {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatal("the delayed write never landed")
		case <-time.After(20 * time.Millisecond):
		}
	}
	p.SetLatency(0)
	require.Equal(t, v+1, read())
	require.NoError(t, lease.Release(ctx))

	h := rec.History()
	verdict(t, h, &chaos.CheckOpts{Name: "unknown-write-landed-real-lease-fenced-model", Claim: true}, false)
	naive := chaos.NaiveRegisterModel(chaos.RegisterState{})
	verdict(t, h, &chaos.CheckOpts{Name: "negative-control-naive-model-real-lease", Claim: true, Model: &naive}, true)
}
