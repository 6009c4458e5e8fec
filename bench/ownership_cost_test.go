package main

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestOwnershipRows(t *testing.T) {
	t.Parallel()
	ms := func(xs ...int) []time.Duration {
		out := make([]time.Duration, len(xs))
		for i, x := range xs {
			out[i] = time.Duration(x) * time.Millisecond
		}
		return out
	}
	o := &ownershipResult{Batches: 2, Cycles: 3, Rounds: 3, Arms: []ownershipArmResult{
		{Version: 11, Acquire: [][]time.Duration{ms(1, 1, 1), ms(2, 2, 2)}, Renew: [][]time.Duration{ms(1, 1, 1), ms(1, 1, 1)},
			Release: [][]time.Duration{ms(1, 1, 1), ms(1, 1, 1)}, Handover: [][]time.Duration{ms(1, 2, 3), ms(4, 5, 100)}},
		{Version: 12, Acquire: [][]time.Duration{ms(2, 2, 2), ms(3, 3, 3)}, Renew: [][]time.Duration{ms(1, 1, 1), ms(1, 1, 1)},
			Release: [][]time.Duration{ms(1, 1, 1), ms(1, 1, 1)}, Handover: [][]time.Duration{ms(2, 4, 6), ms(8, 10, 200)}},
	}}
	rows := o.rows()
	require.Len(t, rows, 5)
	// Medians over every call; paired: batch medians 2/1 and 3/2.
	require.Equal(t, ownershipRow{what: "acquire (free name)", old: 1 * time.Millisecond, new: 2 * time.Millisecond, paired: "1.75x"}, rows[0])
	require.Equal(t, "1.00x", rows[1].paired)
	require.Equal(t, ownershipRow{what: "hand-over p50", old: 3 * time.Millisecond, new: 6 * time.Millisecond, paired: "2.00x"}, rows[3])
	require.Equal(t, ownershipRow{what: "hand-over p99", old: 100 * time.Millisecond, new: 200 * time.Millisecond, paired: "n/a"}, rows[4])

	var b strings.Builder
	renderOwnershipCost(func(f string, a ...any) { fmt.Fprintf(&b, f, a...) }, &results{Ownership: o})
	require.Contains(t, b.String(), "## 13. Ownership secret cost: schema version 11 against 12")
	require.Contains(t, b.String(), "| acquire (free name) | 1.00 ms | 2.00 ms | 1.00 ms | 2.00x | 1.75x |")
	require.Contains(t, b.String(), "6 calls of each kind and 6 hand-overs per version")

	o.Later = []laterMigration{{File: "000013_x.up.sql"}, {File: "000014_y.up.sql", Redefines: []string{"pgfence_acquire"}}}
	b.Reset()
	renderOwnershipCost(func(f string, a ...any) { fmt.Fprintf(&b, f, a...) }, &results{Ownership: o})
	require.Contains(t, b.String(), "`000013_x.up.sql`, after 000012, defines none of the functions")
	require.Contains(t, b.String(), "`000014_y.up.sql`, after 000012, redefines pgfence_acquire: the newer column measures it too.")

	var none strings.Builder
	renderOwnershipCost(func(f string, a ...any) { fmt.Fprintf(&none, f, a...) }, &results{})
	require.Empty(t, none.String())
}

func TestOwnershipReleasedBy(t *testing.T) {
	t.Parallel()
	v11 := &ownershipConn{arm: ownershipArms[0]}
	latest := &ownershipConn{arm: ownershipArms[1]}
	require.True(t, v11.releasedBy("s13-handover", "s13-handover", 7))
	require.False(t, v11.releasedBy("other", "s13-handover", 7))
	require.True(t, latest.releasedBy("0a1b:7:c2d3", "s13-handover", 7))
	require.False(t, latest.releasedBy("0a1b:70:c2d3", "s13-handover", 7))
	require.False(t, latest.releasedBy("s13-handover", "s13-handover", 7))
}

func TestWithDatabase(t *testing.T) {
	t.Parallel()
	u, err := withDatabase("postgres://u:p@127.0.0.1:5432/pgfence_bench?sslmode=disable", "bench_ownership_v11")
	require.NoError(t, err)
	require.Equal(t, "postgres://u:p@127.0.0.1:5432/bench_ownership_v11?sslmode=disable", u)
	kv, err := withDatabase("host=/tmp dbname=x", "it's")
	require.NoError(t, err)
	require.Equal(t, `host=/tmp dbname=x dbname='it\'s'`, kv)
}
