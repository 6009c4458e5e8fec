package patroni_test

import (
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence/test/chaos"
	"github.com/pgfence/pgfence/test/patroni"
)

// The checks of the Patroni suite, on hand-written histories: each must
// stay silent on a correct run and report the violation it names (these
// are their negative controls; the suite's asynchronous run is the one on
// a real cluster).

// history builds a history from ops, numbering them; times are ms.
func history(ops ...chaos.Op) chaos.History {
	h := make(chaos.History, len(ops))
	for i, op := range ops {
		op.Index = i
		op.Call *= int64(time.Millisecond)
		op.Return *= int64(time.Millisecond)
		h[i] = op
	}
	return h
}

func grant(p int, name string, token, call, ret int64) chaos.Op {
	return chaos.Op{Process: p, Kind: chaos.Acquire, Name: name, Token: token, Outcome: chaos.Ok, Call: call, Return: ret}
}

// write is a write of id (Value) by p under token; lost marks a zombie.
func write(p int, name string, token, id, call, ret int64, o chaos.Outcome, lost bool) chaos.Op {
	return chaos.Op{Process: p, Kind: chaos.Write, Name: name, Token: token, Value: id, Outcome: o, Lost: lost, Call: call, Return: ret}
}

func audit(id int64, token, val int64, zombie bool) patroni.AuditRow {
	return patroni.AuditRow{WriteID: id, Resource: 1, Token: token, Val: val, Zombie: zombie}
}

func final(rows ...patroni.AuditRow) *patroni.Final {
	return &patroni.Final{Audit: rows, Rows: map[int][2]int64{1: {int64(len(rows)), 0}}}
}

var resources = map[string]int{"a": 1}

func TestCheckCleanRun(t *testing.T) {
	t.Parallel()
	h := history(
		grant(1, "a", 10, 0, 1),
		write(1, "a", 10, 1, 2, 3, chaos.Ok, false),
		grant(2, "a", 11, 4, 5),
		write(2, "a", 11, 2, 6, 7, chaos.Ok, false),
		// p1 lost its lock; its zombie write after p2's is fenced.
		chaos.Op{Process: 1, Kind: chaos.Write, Name: "a", Token: 10, Value: 3, Outcome: chaos.Fail, Fenced: true, Lost: true,
			Call: 8, Return: 9},
	)
	holds := []patroni.Hold{
		{Process: 1, Name: "a", Token: 10, From: 1, To: 4},
		{Process: 2, Name: "a", Token: 11, From: 5, To: 10},
	}
	v := patroni.Check(h, holds, final(audit(1, 10, 1, false), audit(2, 11, 2, false)), resources, nil)
	require.Zero(t, v.Total(), v.String())
}

func TestCheckReportsEachViolation(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		h     chaos.History
		holds []patroni.Hold
		final *patroni.Final
		kind  func(*patroni.Violations) []string
		// others are the violations of other kinds the history has too.
		others int
	}{{
		name: "token granted twice",
		h:    history(grant(1, "a", 10, 0, 1), grant(2, "b", 10, 2, 3)),
		kind: func(v *patroni.Violations) []string { return v.TokensTwice },
	}, {
		name: "tokens not increasing",
		h:    history(grant(1, "a", 10, 0, 1), grant(2, "a", 9, 2, 3)),
		kind: func(v *patroni.Violations) []string { return v.TokensNotIncreasing },
	}, {
		name: "overlapping holds",
		holds: []patroni.Hold{
			{Process: 1, Name: "a", Token: 10, From: 1, To: math.MaxInt64},
			{Process: 2, Name: "a", Token: 11, From: 5, To: 10},
		},
		kind: func(v *patroni.Violations) []string { return v.OverlappingHolds },
	}, {
		name: "acknowledged write lost",
		h: history(grant(1, "a", 10, 0, 1), write(1, "a", 10, 1, 2, 3, chaos.Ok, false),
			write(1, "a", 10, 2, 4, 5, chaos.Ok, false)),
		final: final(audit(1, 10, 1, false)),
		kind:  func(v *patroni.Violations) []string { return v.AckedLost },
	}, {
		name: "accepted below an acknowledged token",
		h: history(grant(2, "a", 11, 0, 1), write(2, "a", 11, 1, 2, 3, chaos.Ok, false),
			write(1, "a", 10, 2, 4, 5, chaos.Ok, false)),
		final: final(audit(1, 11, 1, false), audit(2, 10, 2, false)),
		kind:  func(v *patroni.Violations) []string { return v.AcceptedBelowAcked },
	}, {
		name: "zombie accepted below an acknowledged token",
		h: history(grant(2, "a", 11, 0, 1), write(2, "a", 11, 1, 2, 3, chaos.Ok, false),
			write(1, "a", 10, 2, 4, 5, chaos.Ok, true)),
		final: final(audit(1, 11, 1, false), audit(2, 10, 2, true)),
		kind:  func(v *patroni.Violations) []string { return v.ZombiesAccepted },
	}, {
		// After an asynchronous failover the later holder's token is a
		// reissued, smaller one: token order says nothing is wrong, real
		// time does.
		name: "zombie accepted over a later holder's write",
		h: history(grant(1, "a", 20, 0, 1), grant(2, "a", 15, 5, 6), write(2, "a", 15, 1, 7, 8, chaos.Ok, false),
			write(1, "a", 20, 2, 9, 10, chaos.Ok, true)),
		final:  final(audit(1, 15, 1, false), audit(2, 20, 2, true)),
		kind:   func(v *patroni.Violations) []string { return v.ZombiesAccepted },
		others: 1, // the reissued token: tokens not increasing
	}, {
		name:  "failed write present",
		h:     history(grant(1, "a", 10, 0, 1), write(1, "a", 10, 1, 2, 3, chaos.Fail, false)),
		final: final(audit(1, 10, 1, false)),
		kind:  func(v *patroni.Violations) []string { return v.FailedPresent },
	}, {
		name:  "row disagreeing with its audit trail",
		final: &patroni.Final{Rows: map[int][2]int64{1: {3, 0}}},
		kind:  func(v *patroni.Violations) []string { return v.RowMismatch },
	}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f := tc.final
			if f == nil {
				f = final()
			}
			v := patroni.Check(tc.h, tc.holds, f, resources, nil)
			require.Len(t, tc.kind(v), 1, v.String())
			require.Equal(t, 1+tc.others, v.Total(), v.String())
		})
	}
}

func TestCheckOverlappingHoldsAdvisoryCutOffByAFault(t *testing.T) {
	t.Parallel()
	holds := []patroni.Hold{
		// p1's session was ended by the fault at 10; it learned at 30,
		// after p2 was granted the lock at 20.
		{Process: 1, Strategy: "advisory", Name: "a", Token: 1, From: 1, To: 30, LostAt: 30},
		{Process: 2, Strategy: "advisory", Name: "a", Token: 2, From: 20, To: 40},
	}
	v, lag := patroni.CheckOverlappingHolds(holds, []time.Duration{10})
	require.Empty(t, v)
	require.Len(t, lag, 1)

	// The negative controls: without the fault, or with p2 granted before
	// the fault struck, or for a lease, it is a violation.
	v, _ = patroni.CheckOverlappingHolds(holds, nil)
	require.Len(t, v, 1)
	v, _ = patroni.CheckOverlappingHolds(holds, []time.Duration{25})
	require.Len(t, v, 1)
	holds[0].Strategy, holds[1].Strategy = "leasetable", "leasetable"
	v, _ = patroni.CheckOverlappingHolds(holds, []time.Duration{10})
	require.Len(t, v, 1)
}

func TestCheckToldBefore(t *testing.T) {
	t.Parallel()
	holds := []patroni.Hold{
		{Process: 1, Strategy: "advisory", Name: "a", Token: 1, From: 1, To: 10},              // told before writable (20)
		{Process: 2, Strategy: "advisory", Name: "b", Token: 2, From: 1, To: 3},               // ended before the fault
		{Process: 3, Strategy: "leasetable", Name: "c", Token: 3, From: 1, To: math.MaxInt64}, // another strategy
	}
	r := patroni.CheckToldBefore(holds, "advisory", 5, 20)
	require.Equal(t, 1, r.Held)
	require.Equal(t, 1, r.Told)
	require.Equal(t, time.Duration(10), r.MinMargin)
	require.Empty(t, r.Late)

	// The negative control: a holder that still believed it held its
	// lock when the new primary was writable.
	holds = append(holds, patroni.Hold{Process: 4, Strategy: "advisory", Name: "d", Token: 4, From: 2, To: 25})
	r = patroni.CheckToldBefore(holds, "advisory", 5, 20)
	require.Equal(t, 2, r.Held)
	require.Equal(t, 1, r.Told)
	require.Len(t, r.Late, 1)
}

func TestZombies(t *testing.T) {
	t.Parallel()
	h := history(
		write(1, "a", 10, 1, 0, 1, chaos.Fail, true), // a retry of the same zombie
		chaos.Op{Process: 1, Kind: chaos.Write, Name: "a", Token: 10, Value: 2, Outcome: chaos.Fail, Fenced: true, Lost: true},
		write(2, "a", 11, 3, 0, 1, chaos.Ok, true),
		write(3, "a", 12, 4, 0, 1, chaos.Ok, false), // not a zombie
	)
	z := patroni.Zombies(h)
	require.Equal(t, 2, z.Zombies)
	require.Equal(t, 1, z.Fenced)
	require.Equal(t, 1, z.Accepted)
	require.Zero(t, z.Other)
}
