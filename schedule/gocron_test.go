package schedule_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/leader"
	"github.com/pgfence/pgfence/leasetable"
	"github.com/pgfence/pgfence/schedule"
)

// TestGocronLocker: two schedulers locking the same job in the same slot:
// the first runs it, the second is refused because it is done.
func TestGocronLocker(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.NewDB(t)
	a, b := newReplica(t, db, "a", 5*time.Second), newReplica(t, db, "b", 5*time.Second)
	// A slot over a year long: no boundary falls between the two locks.
	const every = 10000 * time.Hour
	la := gocronAdapter{&schedule.Locker{Runner: a.runner, Every: every}}
	lb := gocronAdapter{&schedule.Locker{Runner: b.runner, Every: every}}
	lock, err := la.Lock(ctx, "job")
	require.NoError(t, err)
	require.NoError(t, lock.Unlock(ctx))
	_, err = lb.Lock(ctx, "job")
	require.ErrorIs(t, err, schedule.ErrSlotDone)
}

func TestGocronElector(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.NewDB(t)
	locker, err := leasetable.New(ctx, db.Pool, nil)
	require.NoError(t, err)
	defer locker.Close()
	e, err := leader.New(ctx, db.Pool, &leader.Config{Locker: locker, Election: "jobs"})
	require.NoError(t, err)
	defer e.Close()
	el := &schedule.Elector{E: e}
	require.ErrorIs(t, el.IsLeader(ctx), schedule.ErrNotLeader)
	term, err := e.Campaign(ctx)
	require.NoError(t, err)
	require.NoError(t, el.IsLeader(ctx))
	require.NoError(t, term.Resign(ctx))
	require.ErrorIs(t, el.IsLeader(ctx), schedule.ErrNotLeader)
}
