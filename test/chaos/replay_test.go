package chaos_test

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence/test/chaos"
)

// Two holders one after another, the first a zombie fenced out: every
// step is one the model allows.
func replayable() chaos.History {
	return seq(
		grant(0, "a", 1), claim(0, 1, 0), write(0, 1, 1, chaos.Ok), release(0, "a", 1, chaos.Ok),
		grant(1, "a", 1025), grant(0, "b", 2049), claim(1, 1025, 1), write(1, 1025, 2, chaos.Ok),
		write(0, 1, 2, chaos.Fail), release(1, "a", 1025, chaos.Ok))
}

func TestReplayModel(t *testing.T) {
	t.Parallel()
	require.Empty(t, chaos.ReplayModel(replayable(), &chaos.CheckOpts{Claim: true}))

	// Negative controls: doctored copies of that history, each a step the
	// model forbids.
	doctor := func(edit func(h chaos.History)) chaos.History {
		h := append(chaos.History(nil), replayable()...)
		edit(h)
		return h
	}
	cases := []struct {
		name string
		h    chaos.History
		want string
	}{
		{"token reissued", doctor(func(h chaos.History) { h[5].Token = 1 }), "P2_tokens_grow: token 1 acknowledged in two grants"},
		// Per name the tokens grow ("b" has one grant): only the model's
		// one sequence orders grants across names.
		{"token below one of another name", doctor(func(h chaos.History) { h[5].Token = 1024 }), "P2_tokens_grow: grant #5"},
		{"forged token", doctor(func(h chaos.History) { h[7].Token = 4000 }), "P1_guard_sound: write #7 (p1) landed with token 4000, not granted"},
		{"no token", doctor(func(h chaos.History) { h[2].Token = 0 }), "P1_guard_sound: write #2 (p0) landed with token 0"},
		{"stale write landed", doctor(func(h chaos.History) { h[8].Outcome, h[8].Fenced = chaos.Ok, false }), "P3_register_monotonic: write #8 (p0) landed with token 1"},
		{"release of another's token", doctor(func(h chaos.History) { h[3].Token = 1025 }), "release: #3 (p0 \"a\") released with token 1025"},
	}
	for _, tc := range cases {
		v := chaos.ReplayModel(tc.h, &chaos.CheckOpts{Claim: true})
		require.NotEmpty(t, v, "%s: the replay accepted a step the model forbids", tc.name)
		require.Contains(t, strings.Join(v, "\n"), tc.want, tc.name)
	}
	// The cross-name case is the model's own: the suite's per-name check
	// passes it.
	require.Empty(t, chaos.CheckTokensIncreasing(cases[1].h))

	// An unknown write may or may not have landed: it is not checked, and
	// an uncommitted transaction's grant may come back (TxScoped).
	h := doctor(func(h chaos.History) { h[8].Outcome, h[8].Fenced = chaos.Unknown, false })
	require.Empty(t, chaos.ReplayModel(h, &chaos.CheckOpts{Claim: true}))
	tx := seq(grant(0, "a", 1), release(0, "a", 1, chaos.Fail),
		grant(1, "a", 1), release(1, "a", 1, chaos.Ok))
	require.NotEmpty(t, chaos.ReplayModel(tx, nil))
	require.Empty(t, chaos.ReplayModel(tx, &chaos.CheckOpts{TxScoped: true}))
}
