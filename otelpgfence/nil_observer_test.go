package otelpgfence_test

import (
	"context"
	"errors"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence"
	"github.com/pgfence/pgfence/advisory"
	"github.com/pgfence/pgfence/otelpgfence"
)

// A nil *Observer (a typed nil in a Config's Observer interface) records
// nothing and does not panic.
func TestNilObserver(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	var o *otelpgfence.Observer

	op := pgfence.Op{Kind: pgfence.OpAcquire, Strategy: pgfence.StrategyAdvisory, Name: "x"}
	require.Equal(t, ctx, o.StartOp(ctx, op))
	o.EndOp(ctx, op, errors.New("boom"))
	o.Observe(ctx, pgfence.Acquired{Lock: pgfence.Lock{Kind: pgfence.StrategyAdvisory, Name: "x"}})
	require.NoError(t, o.Close())

	locker, err := advisory.New(ctx, newPool(t, 4), &advisory.Config{Observer: o})
	require.NoError(t, err)
	t.Cleanup(locker.Close)
	o.Track(pgfence.StrategyAdvisory, locker)()
	l, err := locker.TryAcquire(ctx, "nil-observer", nil)
	require.NoError(t, err)
	require.NoError(t, l.Renew(ctx))
	require.NoError(t, l.Release(ctx))
	require.NoError(t, locker.Do(ctx, "nil-observer", nil, func(context.Context, pgfence.Lease) error { return nil }))
}
