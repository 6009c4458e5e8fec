package pgfence_test

import (
	"errors"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence"
)

// ErrMaxHold is a loss cause: existing loss handling (errors.Is with
// ErrLeaseLost) sees it, and it is told apart from the other causes.
func TestErrMaxHoldIsALoss(t *testing.T) {
	t.Parallel()
	wrapped := fmt.Errorf("lock %q held for its MaxHold of 1h: %w", "job", pgfence.ErrMaxHold)
	require.ErrorIs(t, wrapped, pgfence.ErrLeaseLost)
	require.ErrorIs(t, wrapped, pgfence.ErrMaxHold)
	for _, other := range []error{pgfence.ErrLeaseExpired, pgfence.ErrLeaseTakenOver, pgfence.ErrSessionEnded,
		pgfence.ErrNotHeld, pgfence.ErrClosed, pgfence.ErrNotAcquired} {
		require.False(t, errors.Is(wrapped, other), "not %v", other)
	}
	require.False(t, errors.Is(pgfence.ErrLeaseLost, pgfence.ErrMaxHold), "the plain sentinel names no cause")
}
