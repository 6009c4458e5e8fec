package chaos_test

import (
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence/test/chaos"
)

// seq builds a history whose operations run one after another: op i is
// invoked at 10*i and returns at 10*i+5, unless it sets Call or Return.
func seq(ops ...chaos.Op) chaos.History {
	h := make(chaos.History, len(ops))
	for i, op := range ops {
		op.Index = i
		if op.Call == 0 && op.Return == 0 {
			op.Call, op.Return = int64(10*i+1), int64(10*i+5)
		}
		h[i] = op
	}
	return h
}

func grant(p int, name string, tok int64) chaos.Op {
	return chaos.Op{Process: p, Kind: chaos.Acquire, Name: name, Token: tok, Outcome: chaos.Ok}
}

func claim(p int, tok, val int64) chaos.Op {
	return chaos.Op{Process: p, Kind: chaos.Read, Token: tok, Value: val, RowToken: tok, Outcome: chaos.Ok}
}

func write(p int, tok, val int64, o chaos.Outcome) chaos.Op {
	return chaos.Op{Process: p, Kind: chaos.Write, Token: tok, Value: val, Outcome: o, Fenced: o == chaos.Fail}
}

func TestCheckTokensUnique(t *testing.T) {
	t.Parallel()
	require.Empty(t, chaos.CheckTokensUnique(seq(grant(0, "a", 1), grant(1, "b", 2), grant(0, "a", 3))))
	// Negative control: the same token granted for two names.
	v := chaos.CheckTokensUnique(seq(grant(0, "a", 1), grant(1, "b", 1)))
	require.Len(t, v, 1)
	require.Contains(t, v[0], "token 1 granted twice")
	// A failed grant's token does not count.
	failed := grant(1, "a", 1)
	failed.Outcome = chaos.Fail
	require.Empty(t, chaos.CheckTokensUnique(seq(grant(0, "a", 1), failed)))
}

func TestCheckTokensIncreasing(t *testing.T) {
	t.Parallel()
	require.Empty(t, chaos.CheckTokensIncreasing(seq(grant(0, "a", 1), grant(1, "a", 5), grant(0, "b", 2))))
	// Negative control: a later grant of the same name with a lower token.
	v := chaos.CheckTokensIncreasing(seq(grant(0, "a", 5), grant(1, "a", 3)))
	require.Len(t, v, 1)
	require.Contains(t, v[0], `lock "a"`)
	// Equal tokens are not increasing either.
	require.Len(t, chaos.CheckTokensIncreasing(seq(grant(0, "a", 5), grant(1, "a", 5))), 1)
	// Concurrent grants are not ordered.
	a, b := grant(0, "a", 5), grant(1, "a", 3)
	a.Call, a.Return, b.Call, b.Return = 1, 10, 2, 11
	require.Empty(t, chaos.CheckTokensIncreasing(chaos.History{a, b}))
}

func TestCheckRowTokenMonotonic(t *testing.T) {
	t.Parallel()
	require.Empty(t, chaos.CheckRowTokenMonotonic(seq(
		claim(0, 1, 0), write(0, 1, 1, chaos.Ok), claim(1, 2, 1), write(1, 2, 2, chaos.Ok))))
	// Negative control: a stale write lands (unguarded), a later read sees
	// the older token.
	read := chaos.Op{Process: 2, Kind: chaos.Read, Value: 1, RowToken: 1, Outcome: chaos.Ok}
	v := chaos.CheckRowTokenMonotonic(seq(write(1, 2, 1, chaos.Ok), write(0, 1, 1, chaos.Ok), read))
	require.Len(t, v, 1)
	require.Contains(t, v[0], "row token moved backwards")
	// An unknown write sets no floor.
	require.Empty(t, chaos.CheckRowTokenMonotonic(seq(write(1, 2, 1, chaos.Unknown), read)))
}

func TestCheckNoLostUpdate(t *testing.T) {
	t.Parallel()
	h := seq(claim(0, 1, 0), write(0, 1, 1, chaos.Ok), claim(1, 2, 1), write(1, 2, 2, chaos.Unknown))
	require.Empty(t, chaos.CheckNoLostUpdate(h, 0, 1))
	require.Empty(t, chaos.CheckNoLostUpdate(h, 0, 2))
	// Negative controls: fewer than acknowledged, more than possible.
	require.Contains(t, chaos.CheckNoLostUpdate(h, 0, 0)[0], "lost update")
	require.Contains(t, chaos.CheckNoLostUpdate(h, 0, 3)[0], "phantom update")
}

// lostUpdate is the classic history of two overlapping holders with
// unguarded writes: both read 0 and both write 1.
func lostUpdate() chaos.History {
	ops := []chaos.Op{
		grant(0, "r", 1),
		{Process: 0, Kind: chaos.Read, Token: 1, Value: 0, RowToken: 0, Outcome: chaos.Ok},
		grant(1, "r", 2),
		{Process: 1, Kind: chaos.Read, Token: 2, Value: 0, RowToken: 0, Outcome: chaos.Ok},
		write(1, 2, 1, chaos.Ok),
		write(0, 1, 1, chaos.Ok),
	}
	return seq(ops...)
}

func TestCheckFlagsLostUpdate(t *testing.T) {
	t.Parallel()
	final := int64(1)
	r, err := chaos.Check(lostUpdate(), &chaos.CheckOpts{Name: "negative-lost-update", Final: &final, Dir: t.TempDir()})
	require.NoError(t, err)
	require.False(t, r.OK())
	require.Equal(t, "violation detected", r.Verdict())
	t.Log(r.Summary())
	require.NotEmpty(t, r.Visualization)
	b, err := os.ReadFile(r.Visualization)
	require.NoError(t, err)
	require.Contains(t, string(b), "<html")
	s := r.String()
	require.Contains(t, s, "lost update")
	require.Contains(t, s, "visualisation: "+r.Visualization)
	require.Contains(t, s, "history:")
	require.Equal(t, "Illegal", string(r.Linearizability))
}

func TestCheckAcceptsFencedHistory(t *testing.T) {
	t.Parallel()
	// The stale holder (token 1) overlaps the new one (token 2), but its
	// write is fenced, and its claim happened before the new claim.
	h := chaos.History{
		{Index: 0, Process: 0, Kind: chaos.Acquire, Name: "r", Token: 1, Outcome: chaos.Ok, Call: 1, Return: 2},
		{Index: 1, Process: 0, Kind: chaos.Read, Token: 1, Value: 0, RowToken: 1, Outcome: chaos.Ok, Call: 3, Return: 4},
		{Index: 2, Process: 1, Kind: chaos.Acquire, Name: "r", Token: 2, Outcome: chaos.Ok, Call: 5, Return: 6},
		{Index: 3, Process: 1, Kind: chaos.Read, Token: 2, Value: 0, RowToken: 2, Outcome: chaos.Ok, Call: 7, Return: 8},
		{Index: 4, Process: 0, Kind: chaos.Write, Token: 1, Value: 1, Outcome: chaos.Fail, Fenced: true, Call: 9, Return: 12},
		{Index: 5, Process: 1, Kind: chaos.Write, Token: 2, Value: 1, Outcome: chaos.Ok, Call: 10, Return: 11},
	}
	final := int64(1)
	r, err := chaos.Check(h, &chaos.CheckOpts{Name: "fenced", Final: &final, Claim: true, Dir: t.TempDir()})
	require.NoError(t, err)
	require.True(t, r.OK(), r.String())
	require.Equal(t, "linearizable", r.Verdict())
	require.Empty(t, r.Visualization)

	// Negative control: the same history where the stale write was
	// acknowledged instead of fenced is not linearizable.
	h[4].Outcome, h[4].Fenced = chaos.Ok, false
	final = 1
	r, err = chaos.Check(h, &chaos.CheckOpts{Name: "stale-ack", Final: &final, Claim: true, Dir: t.TempDir()})
	require.NoError(t, err)
	require.Equal(t, "violation detected", r.Verdict())

	// Negative control: a fenced outcome the register could not have given
	// (no newer token existed) is flagged too.
	bogus := chaos.History{
		{Index: 0, Process: 0, Kind: chaos.Write, Token: 3, Value: 1, Outcome: chaos.Fail, Fenced: true, Call: 1, Return: 2},
	}
	r, err = chaos.Check(bogus, &chaos.CheckOpts{Name: "bogus-fence", Dir: t.TempDir()})
	require.NoError(t, err)
	require.Equal(t, "violation detected", r.Verdict())
}

// TestNaiveModelFlagsUnknownWrite: a write whose connection broke after the
// statement was sent landed; a checker that treats unknown as failed (a
// model that omits the fault) must report the history as a violation, the
// correct model must accept it.
func TestNaiveModelFlagsUnknownWrite(t *testing.T) {
	t.Parallel()
	h := chaos.History{
		{Index: 0, Process: 0, Kind: chaos.Read, Token: 1, Value: 0, RowToken: 1, Outcome: chaos.Ok, Call: 1, Return: 2},
		{Index: 1, Process: 0, Kind: chaos.Write, Token: 1, Value: 1, Outcome: chaos.Unknown, Call: 3, Err: "conn reset"},
		{Index: 2, Process: 1, Kind: chaos.Read, Token: 2, Value: 1, RowToken: 2, Outcome: chaos.Ok, Call: 10, Return: 11},
		{Index: 3, Process: 1, Kind: chaos.Write, Token: 2, Value: 2, Outcome: chaos.Ok, Call: 12, Return: 13},
	}
	final := int64(2)
	r, err := chaos.Check(h, &chaos.CheckOpts{Name: "unknown-landed", Final: &final, Claim: true, Dir: t.TempDir()})
	require.NoError(t, err)
	require.True(t, r.OK(), r.String())

	naive := chaos.NaiveRegisterModel(chaos.RegisterState{})
	r, err = chaos.Check(h, &chaos.CheckOpts{Name: "naive-model", Final: &final, Claim: true, Model: &naive, Dir: t.TempDir()})
	require.NoError(t, err)
	require.Equal(t, "violation detected", r.Verdict())
	t.Log(r.Summary())
	require.True(t, strings.HasPrefix(r.Summary(), "chaos: scenario=naive-model ops=4 verdict=violation detected"))
}

func TestCheckRequiresName(t *testing.T) {
	t.Parallel()
	_, err := chaos.Check(nil, nil)
	require.ErrorContains(t, err, "Name is required")
}

func TestCheckMutualExclusion(t *testing.T) {
	t.Parallel()
	rel := func(p int, name string) chaos.Op {
		return chaos.Op{Process: p, Kind: chaos.Release, Name: name, Outcome: chaos.Ok}
	}
	require.Empty(t, chaos.CheckMutualExclusion(seq(grant(0, "a", 0), rel(0, "a"), grant(1, "a", 0), rel(1, "a"), grant(0, "b", 0))))
	// Negative control: a second grant while the first is not released.
	v := chaos.CheckMutualExclusion(seq(grant(0, "a", 0), grant(1, "a", 0), rel(0, "a")))
	require.Len(t, v, 1)
	require.Contains(t, v[0], `lock "a" held by p0 (#0) and p1 (#1)`)
	r, err := chaos.Check(seq(grant(0, "a", 0), grant(1, "a", 0)), &chaos.CheckOpts{Name: "excl", Exclusive: true, Dir: t.TempDir()})
	require.NoError(t, err)
	require.Equal(t, "violation detected", r.Verdict())
	// Token 0 is "no token", never a duplicate.
	require.Empty(t, chaos.CheckTokensUnique(seq(grant(0, "a", 0), grant(1, "a", 0))))
}

func release(p int, name string, tok int64, o chaos.Outcome) chaos.Op {
	return chaos.Op{Process: p, Kind: chaos.Release, Name: name, Token: tok, Outcome: o}
}

// A transaction-scoped grant whose transaction did not commit may see its
// token drawn again after a crash; with TxScoped the token checks leave it
// out, and only it.
func TestWithoutUncommittedGrants(t *testing.T) {
	t.Parallel()
	h := seq(
		grant(0, "a", 7), release(0, "a", 7, chaos.Unknown), // crashed before the commit was known
		grant(1, "a", 7), release(1, "a", 7, chaos.Ok), // the same token, drawn again
		grant(0, "a", 9), release(0, "a", 9, chaos.Ok),
		grant(1, "a", 8), // never released: not known to have committed
	)
	kept := chaos.WithoutUncommittedGrants(h)
	var tokens []int64
	for _, op := range kept {
		if op.Kind == chaos.Acquire {
			tokens = append(tokens, op.Token)
		}
	}
	require.Equal(t, []int64{7, 9}, tokens)
	require.Empty(t, chaos.CheckTokensUnique(kept))
	require.Empty(t, chaos.CheckTokensIncreasing(kept))

	// Negative control: a token granted twice to committed transactions is
	// still reported, and so is the reissue without TxScoped.
	twice := seq(grant(0, "a", 7), release(0, "a", 7, chaos.Ok), grant(1, "a", 7), release(1, "a", 7, chaos.Ok))
	require.Len(t, chaos.CheckTokensUnique(chaos.WithoutUncommittedGrants(twice)), 1)
	require.Len(t, chaos.CheckTokensUnique(h), 1)
}
