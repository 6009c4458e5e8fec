package patroni_test

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence/test/chaos"
)

// The suite's histories replayed through the protocol model's transition
// rules (chaos.ReplayModel), as the suite's runs are: a run the model
// allows passes; a zombie's write that lands after a newer holder's was
// acknowledged (what an asynchronous failover allows), and a token handed
// out again for another name, are rejected.
func TestReplayModelOnSuiteHistories(t *testing.T) {
	t.Parallel()
	clean := func() chaos.History {
		return history(
			grant(1, "a", 10, 0, 1),
			write(1, "a", 10, 1, 2, 3, chaos.Ok, false),
			grant(2, "a", 11, 4, 5),
			write(2, "a", 11, 2, 6, 7, chaos.Ok, false),
			grant(3, "b", 12, 8, 9),
			chaos.Op{Process: 1, Kind: chaos.Write, Name: "a", Token: 10, Value: 3, Outcome: chaos.Fail, Fenced: true, Lost: true,
				Call: 10, Return: 11},
		)
	}
	require.Empty(t, chaos.ReplayModel(clean(), nil))

	zombie := clean()
	zombie[5].Outcome, zombie[5].Fenced = chaos.Ok, false
	v := chaos.ReplayModel(zombie, nil)
	require.Contains(t, strings.Join(v, "\n"), "P3_register_monotonic: write #5 (p1) landed with token 10")

	reissued := clean()
	reissued[4].Token = 10
	v = chaos.ReplayModel(reissued, nil)
	require.Contains(t, strings.Join(v, "\n"), "P2_tokens_grow: token 10 acknowledged in two grants")
}
