package chaos_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence/test/chaos"
)

func TestCheckPermitCap(t *testing.T) {
	t.Parallel()
	op := func(i, p int, k chaos.Kind, name string, tok, call, ret int64) chaos.Op {
		return chaos.Op{Index: i, Process: p, Kind: k, Name: name, Token: tok, Call: call, Return: ret, Outcome: chaos.Ok}
	}
	h := chaos.History{
		op(0, 1, chaos.Acquire, "s\x1f0", 10, 0, 1),
		op(1, 2, chaos.Acquire, "s\x1f1", 11, 0, 2),
		// p1 pauses past its TTL: p3 takes permit 0 with a newer token,
		// which fences p1 out; two valid permits, not three.
		op(2, 3, chaos.Acquire, "s\x1f0", 12, 3, 4),
		op(3, 2, chaos.Release, "s\x1f1", 11, 5, 6),
		op(4, 1, chaos.Release, "s\x1f0", 10, 7, 8),
		op(5, 3, chaos.Release, "s\x1f0", 12, 9, 10),
	}
	require.Empty(t, chaos.CheckPermitCap(h, 2))
	require.Len(t, chaos.CheckPermitCap(h, 1), 2, "two at once with a cap of one, at #1 and at #2")
	// A third permit while both are valid: the cap off by one.
	h = append(h[:3:3], op(6, 4, chaos.Acquire, "s\x1f2", 13, 4, 5))
	require.Len(t, chaos.CheckPermitCap(h, 2), 1)
}
