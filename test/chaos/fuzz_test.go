package chaos_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence/test/chaos"
)

// FuzzCheckSequentialRegister runs a sequential history, generated from the
// input, against an in-memory fenced register: the checker must accept it.
// Then it turns one fenced write into an acknowledged one, which a fenced
// register cannot produce: the checker must reject that.
func FuzzCheckSequentialRegister(f *testing.F) {
	f.Add([]byte{0, 1, 4, 5, 2, 9, 13, 1})
	f.Add([]byte{8, 9, 1, 0, 1, 6, 5})
	f.Add([]byte{3, 7, 11, 15, 19, 2, 6, 10})
	f.Fuzz(func(t *testing.T, in []byte) {
		if len(in) > 64 {
			in = in[:64]
		}
		var s chaos.RegisterState
		var h chaos.History
		// The first fenced write with no unknown operation before it: an
		// unknown operation may take effect any time after its call, so
		// one before could explain an acknowledged stale write.
		fencedWrite, sawUnknown := -1, false
		for i, b := range in {
			tok := int64(b >> 2)
			op := chaos.Op{Index: i, Process: i % 3, Token: tok, Call: int64(10*i + 1), Return: int64(10*i + 5), Outcome: chaos.Ok}
			allowed := s.Token <= tok
			switch b % 3 {
			case 0: // claim
				op.Kind = chaos.Read
				if allowed {
					s.Token = tok
					op.Value, op.RowToken = s.Value, s.Token
				} else {
					op.Outcome, op.Fenced = chaos.Fail, true
				}
			case 1: // write
				op.Kind, op.Value = chaos.Write, s.Value+1
				if allowed {
					s = chaos.RegisterState{Value: op.Value, Token: tok}
				} else {
					op.Outcome, op.Fenced = chaos.Fail, true
					if fencedWrite < 0 && !sawUnknown {
						fencedWrite = i
					}
				}
			default: // a write whose outcome is unknown and that did land
				op.Kind, op.Value, op.Outcome = chaos.Write, s.Value+1, chaos.Unknown
				sawUnknown = true
				if allowed {
					s = chaos.RegisterState{Value: op.Value, Token: tok}
				}
			}
			h = append(h, op)
		}
		r, err := chaos.Check(h, &chaos.CheckOpts{Name: "fuzz", Claim: true, Dir: t.TempDir()})
		require.NoError(t, err)
		require.True(t, r.OK(), "%s", r)
		if fencedWrite < 0 {
			return
		}
		h[fencedWrite].Outcome, h[fencedWrite].Fenced = chaos.Ok, false
		// Follow it by a read of the row, so even a write that happens to
		// restore the value is observed through its token.
		n := len(h)
		h = append(h, chaos.Op{Index: n, Process: 0, Kind: chaos.Read, Token: 1 << 40, Value: s.Value, RowToken: 1 << 40,
			Call: int64(10*n + 1), Return: int64(10*n + 5), Outcome: chaos.Ok})
		r, err = chaos.Check(h, &chaos.CheckOpts{Name: "fuzz-negative", Claim: true, Dir: t.TempDir()})
		require.NoError(t, err)
		require.Equal(t, "violation detected", r.Verdict())
	})
}
