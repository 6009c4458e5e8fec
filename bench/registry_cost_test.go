package main

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestRenderRegistryCost(t *testing.T) {
	t.Parallel()
	us := func(xs ...int) []time.Duration {
		out := make([]time.Duration, len(xs))
		for i, x := range xs {
			out[i] = time.Duration(x) * time.Microsecond
		}
		return out
	}
	res := &results{Registry: &registryCostResult{Batches: 3, Cycles: 200, Modes: []string{"rolled back"},
		Times: map[string][][]time.Duration{"rolled back": {us(100, 90, 110), us(120, 130, 500), us(200, 210, 190)}}}}
	var b strings.Builder
	renderRegistryCost(func(f string, a ...any) { fmt.Fprintf(&b, f, a...) }, res)
	require.Contains(t, b.String(), "## 14. Fence registry check beside a single-row UPDATE")
	require.Contains(t, b.String(), "3 batches of 200 transactions")
	require.Contains(t, b.String(), "| rolled back | pgfence_fence_check | 0.130 ms | 1.30x |")
	require.Contains(t, b.String(), "| rolled back | pgfence_fence_check + UPDATE | 0.200 ms | 2.00x |")

	var none strings.Builder
	renderRegistryCost(func(f string, a ...any) { fmt.Fprintf(&none, f, a...) }, &results{})
	require.Empty(t, none.String())
}
