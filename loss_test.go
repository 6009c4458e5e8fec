package pgfence_test

import (
	"errors"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence"
)

func TestLossCausesMatchErrLeaseLost(t *testing.T) {
	t.Parallel()
	causes := []error{pgfence.ErrLeaseExpired, pgfence.ErrLeaseTakenOver, pgfence.ErrSessionEnded}
	for i, c := range causes {
		wrapped := fmt.Errorf("lease %q (token 3): %w", "job", c)
		require.ErrorIs(t, wrapped, pgfence.ErrLeaseLost, "%v", c)
		require.ErrorIs(t, wrapped, c)
		for j, other := range causes {
			if i != j {
				require.False(t, errors.Is(wrapped, other), "%v is not %v", c, other)
			}
		}
		require.False(t, errors.Is(pgfence.ErrLeaseLost, c), "the plain sentinel names no cause")
	}
}
