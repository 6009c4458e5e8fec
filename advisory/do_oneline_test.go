package advisory_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence"
	"github.com/pgfence/pgfence/advisory"
	"github.com/pgfence/pgfence/internal/hold"
	"github.com/pgfence/pgfence/internal/pgtest"
)

// Do's error joining fn's error with the loss is one line, and matches
// every part.
func TestDoErrorOneLine(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.NewDB(t)
	k := newLocker(t, db.Pool, fastConfig("do-oneline"))
	fnErr := errors.New("job failed")
	fn := func(ctx context.Context, _ pgfence.Lease) error {
		<-ctx.Done() // ended by MaxHold
		return fnErr
	}
	opts := &advisory.AcquireOpts{MaxHold: 50 * time.Millisecond}

	err := k.Do(ctx, "oneline", opts, fn)
	require.ErrorIs(t, err, fnErr)
	require.ErrorIs(t, err, pgfence.ErrLeaseLost)
	require.ErrorIs(t, err, pgfence.ErrMaxHold)
	require.NotContains(t, err.Error(), "\n")
	require.Contains(t, err.Error(), "job failed; pgfence: advisory: ")

	// Control: the shared helper's own error, for the same outcome,
	// spans two lines.
	raw := hold.Do(ctx, k, "oneline", "pgfence: advisory", func(ctx context.Context) (pgfence.Lease, error) {
		return k.Acquire(ctx, "oneline", opts)
	}, fn)
	require.ErrorIs(t, raw, fnErr)
	require.Equal(t, 1, strings.Count(raw.Error(), "\n"))

	// fn's error alone keeps its message.
	err = k.Do(ctx, "oneline", nil, func(context.Context, pgfence.Lease) error { return fnErr })
	require.ErrorIs(t, err, fnErr)
	require.EqualError(t, err, "job failed")
}
