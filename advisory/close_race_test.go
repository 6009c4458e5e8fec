package advisory_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence"
	"github.com/pgfence/pgfence/advisory"
	"github.com/pgfence/pgfence/internal/pgtest"
)

// locksOfApp counts the advisory locks on keys granted to the backends
// whose application_name is appName.
func locksOfApp(t testing.TB, pool *pgxpool.Pool, appName string) int {
	t.Helper()
	var n int
	require.NoError(t, pool.QueryRow(context.Background(), `
		SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a USING (pid)
		WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1 AND a.application_name = $1`, appName).Scan(&n))
	return n
}

// closeRaceRounds runs rounds of Close racing TryAcquire and Acquire calls
// (some parked behind a key another Locker holds) and returns, per round,
// the locks the closed Locker's sessions still held when Close returned.
func closeRaceRounds(t *testing.T, rounds int, configure func(*advisory.Locker)) []int {
	db := pgtest.NewDB(t)
	ctx := context.Background()
	holder := newLocker(t, db.NewPool(t, nil), nil)
	contended := advisory.Name("contended")
	hl, err := holder.TryAcquireKey(ctx, contended, nil)
	require.NoError(t, err)
	defer func() { _ = hl.Release(ctx) }()

	left := make([]int, rounds)
	for round := range rounds {
		app := fmt.Sprintf("%s-%d", t.Name(), round) // apart from the other tests' sessions
		k, err := advisory.New(ctx, db.Pool, &advisory.Config{ApplicationName: app})
		require.NoError(t, err)
		if configure != nil {
			configure(k)
		}
		granted := make(chan struct{}, 64)
		var wg sync.WaitGroup
		for g := range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 0; ; i++ {
					var l *advisory.Lease
					var err error
					switch {
					case g == 0:
						l, err = k.AcquireKey(ctx, contended, nil) // parks
					case g%2 == 0:
						l, err = k.AcquireKey(ctx, advisory.ID(int64(g*1000+i)), nil)
					default:
						l, err = k.TryAcquireKey(ctx, advisory.ID(int64(g*1000+i)), nil)
					}
					if errors.Is(err, pgfence.ErrClosed) {
						return
					}
					if err == nil {
						select {
						case granted <- struct{}{}:
						default:
						}
						if i%2 == 0 {
							_ = l.Release(ctx) // half are kept until Close
						}
					}
				}
			}()
		}
		<-granted
		k.Close()
		left[round] = locksOfApp(t, db.Pool, app)
		wg.Wait()
	}
	return left
}

// Close racing acquires leaves no lock held in the database once it
// returns: a grant that arrives while Close runs is given back first.
func TestCloseRacingAcquire(t *testing.T) {
	t.Parallel()
	for round, n := range closeRaceRounds(t, 30, nil) {
		require.Zero(t, n, "round %d: locks still held after Close returned", round)
	}
}

// Negative control: when Close returns without waiting for its sessions
// (statements in flight, the release of their locks), the check sees
// locks still held.
func TestCloseRacingAcquireControl(t *testing.T) {
	t.Parallel()
	left := closeRaceRounds(t, 30, advisory.SetCloseNoWait)
	total := 0
	for _, n := range left {
		total += n
	}
	t.Logf("locks held as Close returned, over %d rounds: %d", len(left), total)
	require.Positive(t, total, "the check must be able to see locks left held")
}

// countingTracer counts the statements sent on the connections of a
// pool's configuration.
type countingTracer struct{ n atomic.Int64 }

func (tr *countingTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	tr.n.Add(1)
	return ctx
}

func (tr *countingTracer) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// A call whose ctx has already ended sends nothing and returns ctx's
// error; with a live ctx (the control) the same calls send statements.
func TestDoneContextSendsNothing(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDB(t)
	tracer := &countingTracer{}
	pool := db.NewPool(t, func(c *pgxpool.Config) { c.ConnConfig.Tracer = tracer })
	// Checks far apart, so that the watchdog sends nothing meanwhile.
	k := newLocker(t, pool, &advisory.Config{ApplicationName: "done-ctx", SessionCheckInterval: 4 * time.Second, QueryTimeout: time.Second})
	key := advisory.Name("done")
	before := tracer.n.Load()

	cause := errors.New("caller gave up")
	ctx, cancel := context.WithCancelCause(context.Background())
	cancel(cause)
	_, err := k.TryAcquireKey(ctx, key, nil)
	require.ErrorIs(t, err, context.Canceled)
	require.ErrorIs(t, err, cause)
	_, err = k.AcquireKey(ctx, key, nil)
	require.ErrorIs(t, err, context.Canceled)
	require.ErrorIs(t, err, cause)
	err = k.DoKey(ctx, key, nil, func(context.Context, pgfence.Lease) error { return nil })
	require.ErrorIs(t, err, context.Canceled)
	require.Equal(t, before, tracer.n.Load(), "no statement was sent")
	require.Zero(t, sessionCount(t, db.Pool, "done-ctx"), "no session was opened")

	// Another Locker can take the name at once.
	other := newLocker(t, db.NewPool(t, nil), nil)
	l, err := other.TryAcquireKey(context.Background(), key, nil)
	require.NoError(t, err)

	// Renew on an ended ctx sends nothing either.
	n := tracer.n.Load()
	mine, err := k.TryAcquireKey(context.Background(), advisory.Name("mine"), nil)
	require.NoError(t, err)
	require.Greater(t, tracer.n.Load(), n, "control: a live ctx sends statements")
	n = tracer.n.Load()
	require.ErrorIs(t, mine.Renew(ctx), context.Canceled)
	require.Equal(t, n, tracer.n.Load())
	require.NoError(t, mine.Release(context.Background()))
	require.NoError(t, l.Release(context.Background()))
}
