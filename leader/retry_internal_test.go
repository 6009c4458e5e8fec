package leader

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestRetryWait(t *testing.T) {
	t.Parallel()
	const base = time.Second
	tests := []struct {
		failures int
		nominal  time.Duration
	}{
		{1, base},
		{2, 2 * base},
		{3, 4 * base},
		{5, 16 * base},
		{6, 30 * base}, // 32s, capped
		{100, 30 * base},
	}
	for _, tt := range tests {
		for i := 0; i < 50; i++ {
			d := retryWait(base, tt.failures)
			require.GreaterOrEqual(t, d, tt.nominal-tt.nominal/10, "failures %d", tt.failures)
			require.LessOrEqual(t, d, tt.nominal+tt.nominal/10, "failures %d", tt.failures)
		}
	}
}
