package schedule_test

import (
	"context"
	"errors"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence"
	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/leasetable"
	"github.com/pgfence/pgfence/schedule"
)

func TestMain(m *testing.M) {
	if os.Getenv(envHelper) != "" {
		os.Exit(helperMain())
	}
	pgtest.Main(m)
}

// effectsDDL is the job's own table: one row per run that committed.
const effectsDDL = `CREATE TABLE effects (slot text NOT NULL, who text NOT NULL)`

// events records a Runner's events.
type events struct {
	mu  sync.Mutex
	all []pgfence.Event
}

func (e *events) Observe(_ context.Context, ev pgfence.Event) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.all = append(e.all, ev)
}

func (e *events) list() []pgfence.Event {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]pgfence.Event(nil), e.all...)
}

// replica is one process's Runner: its own pool, Locker and owner.
type replica struct {
	name   string
	pool   *pgxpool.Pool
	runner *schedule.Runner
	events *events
}

func newReplica(t *testing.T, db *pgtest.DB, name string, ttl time.Duration) *replica {
	t.Helper()
	return newReplicaCfg(t, db, name, ttl, 0)
}

func newReplicaCfg(t *testing.T, db *pgtest.DB, name string, ttl time.Duration, catchUp int) *replica {
	t.Helper()
	pool := db.NewPool(t, nil)
	locker, err := leasetable.New(context.Background(), pool, &leasetable.Config{TTL: ttl, Owner: name})
	require.NoError(t, err)
	t.Cleanup(locker.Close)
	ev := &events{}
	r, err := schedule.New(pool, &schedule.Config{Locker: locker, Observer: ev, CatchUp: catchUp})
	require.NoError(t, err)
	return &replica{name: name, pool: pool, runner: r, events: ev}
}

// effects returns how many committed runs each slot had.
func effects(t *testing.T, pool *pgxpool.Pool) map[string]int {
	t.Helper()
	rows, err := pool.Query(context.Background(), `SELECT slot, count(*)::int FROM effects GROUP BY slot`)
	require.NoError(t, err)
	out := map[string]int{}
	var slot string
	var n int
	_, err = pgx.ForEachRow(rows, []any{&slot, &n}, func() error { out[slot] = n; return nil })
	require.NoError(t, err)
	return out
}

func insertEffect(ctx context.Context, tx pgx.Tx, s *schedule.Slot, who string) error {
	_, err := tx.Exec(ctx, `INSERT INTO effects (slot, who) VALUES ($1, $2)`, s.Key(), who)
	return err
}

func TestRunOnceThenSkip(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.NewDB(t)
	a, b := newReplica(t, db, "a", 5*time.Second), newReplica(t, db, "b", 5*time.Second)

	calls := 0
	fn := func(ctx context.Context, s *schedule.Slot) error {
		calls++
		require.Equal(t, "report", s.Job())
		require.Equal(t, "2026-01-02", s.Key())
		require.Equal(t, 1, s.Attempt())
		require.Equal(t, schedule.LeasePrefix+"report", s.Lease().Name())
		return nil
	}
	require.NoError(t, a.runner.Run(ctx, "report", "2026-01-02", nil, fn))
	err := b.runner.Run(ctx, "report", "2026-01-02", nil, fn)
	require.ErrorIs(t, err, schedule.ErrSlotDone)
	var done *schedule.DoneError
	require.ErrorAs(t, err, &done)
	require.Equal(t, "a", done.Owner)
	require.Equal(t, 1, calls)

	recs, err := b.runner.History(ctx, "report", 10)
	require.NoError(t, err)
	require.Len(t, recs, 1)
	require.Equal(t, "done", recs[0].State)
	require.Equal(t, "a", recs[0].Owner)
	require.Equal(t, done.Token, recs[0].Token)
	require.False(t, recs[0].FinishedAt.Before(recs[0].StartedAt))

	require.IsType(t, pgfence.SlotDone{}, a.events.list()[0])
	sk := b.events.list()[0].(pgfence.SlotSkipped)
	require.Equal(t, "a", sk.DoneBy)
	require.Equal(t, pgfence.StrategySchedule, sk.Strategy())
	require.Equal(t, schedule.Stats{Done: 1}, a.runner.Stats())
	require.Equal(t, schedule.Stats{Skipped: 1}, b.runner.Stats())
}

func TestFailedSlotRunsAgain(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.NewDB(t)
	a := newReplica(t, db, "a", 5*time.Second)
	boom := errors.New("boom")
	err := a.runner.Run(ctx, "j", "s", nil, func(context.Context, *schedule.Slot) error { return boom })
	require.ErrorIs(t, err, boom)
	recs, err := a.runner.History(ctx, "j", 1)
	require.NoError(t, err)
	require.Equal(t, "failed", recs[0].State)
	require.Equal(t, "boom", recs[0].Error)

	var attempt int
	require.NoError(t, a.runner.Run(ctx, "j", "s", nil, func(_ context.Context, s *schedule.Slot) error { attempt = s.Attempt(); return nil }))
	require.Equal(t, 2, attempt)
	evs := a.events.list()
	require.Len(t, evs, 3)
	require.ErrorIs(t, evs[0].(pgfence.SlotFailed).Err, boom)
	re := evs[1].(pgfence.SlotRetried)
	require.Equal(t, "failed", re.PrevState)
	require.Equal(t, 2, re.Attempt)
	require.IsType(t, pgfence.SlotDone{}, evs[2])
	require.Equal(t, schedule.Stats{Done: 1, Failed: 1, Retried: 1}, a.runner.Stats())
}

// TestRunTxRollsBackWithFailure: fn's writes commit with the done record,
// or not at all.
func TestRunTxRollsBackWithFailure(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.NewDB(t)
	_, err := db.Pool.Exec(ctx, effectsDDL)
	require.NoError(t, err)
	a := newReplica(t, db, "a", 5*time.Second)
	boom := errors.New("boom")
	err = a.runner.RunTx(ctx, "j", "s", nil, func(ctx context.Context, tx pgx.Tx, s *schedule.Slot) error {
		require.NoError(t, insertEffect(ctx, tx, s, "a"))
		return boom
	})
	require.ErrorIs(t, err, boom)
	require.Empty(t, effects(t, db.Pool))
	require.NoError(t, a.runner.RunTx(ctx, "j", "s", nil, func(ctx context.Context, tx pgx.Tx, s *schedule.Slot) error {
		var presented string
		require.NoError(t, tx.QueryRow(ctx, `SELECT current_setting('pgfence.token')`).Scan(&presented))
		require.NotEmpty(t, presented)
		return insertEffect(ctx, tx, s, "a")
	}))
	require.Equal(t, map[string]int{"s": 1}, effects(t, db.Pool))
	require.ErrorIs(t, a.runner.RunTx(ctx, "j", "s", nil, nil), schedule.ErrSlotDone)
}

// TestSlotRecordIsFenced: the functions refuse a stale or forged lease; a
// slot finished by a newer token cannot be finished or restarted by an
// older one; the app role cannot write the table directly.
func TestSlotRecordIsFenced(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.NewDB(t)
	pool := db.Pool
	locker, err := leasetable.New(ctx, pool, &leasetable.Config{TTL: 5 * time.Second})
	require.NoError(t, err)
	defer locker.Close()

	acquire := func() *leasetable.Lease {
		l, err := locker.TryAcquire(ctx, schedule.LeasePrefix+"j", nil)
		require.NoError(t, err)
		return l.(*leasetable.Lease)
	}
	begin := func(l *leasetable.Lease, secret string) string {
		var out string
		require.NoError(t, pool.QueryRow(ctx, `SELECT outcome FROM pgfence.pgfence_slot_begin('j', 's', $1, $2)`, l.Token(), secret).Scan(&out))
		return out
	}
	finish := func(l *leasetable.Lease, secret string) bool {
		var ok bool
		require.NoError(t, pool.QueryRow(ctx, `SELECT pgfence.pgfence_slot_finish('j', 's', $1, $2, 'done', NULL)`, l.Token(), secret).Scan(&ok))
		return ok
	}
	old := acquire()
	require.Equal(t, "lost", begin(old, "forged"))
	require.Equal(t, "run", begin(old, old.Secret().Reveal()))
	require.Equal(t, "run", begin(old, old.Secret().Reveal()), "the same token again: idempotent")
	oldSecret := old.Secret().Reveal()
	// The old holder is taken over (as after a pause past its TTL).
	_, err = locker.ForceRelease(ctx, schedule.LeasePrefix+"j", "test")
	require.NoError(t, err)
	<-old.Done()
	require.False(t, finish(old, oldSecret), "a holder whose lease was taken over cannot mark the slot done")
	require.Equal(t, "lost", begin(old, oldSecret))

	cur := acquire()
	require.Equal(t, "retry", begin(cur, cur.Secret().Reveal()))
	require.False(t, finish(old, oldSecret))
	require.True(t, finish(cur, cur.Secret().Reveal()))
	require.NoError(t, cur.Release(ctx))
	again := acquire()
	require.Equal(t, "done", begin(again, again.Secret().Reveal()))
	require.NoError(t, again.Release(ctx))

	var state string
	var token int64
	require.NoError(t, pool.QueryRow(ctx, `SELECT state, token FROM pgfence.pgfence_slots WHERE job = 'j' AND slot = 's'`).Scan(&state, &token))
	require.Equal(t, "done", state)
	require.Equal(t, cur.Token(), token)
}

// TestSkewedReplicas: three replicas whose clocks differ by up to
// 1.1s (injected: Go reads the clock through the vDSO, which libfaketime
// does not reach) tick every 250ms on their own clocks and name each slot
// from it, or ask the database for it: every slot runs exactly once. The
// negative control, the
// hand-written AtLeast pattern, runs slots twice under the same skew.
func TestSkewedReplicas(t *testing.T) {
	t.Parallel()
	const every, ticks = 250 * time.Millisecond, 10
	offsets := []time.Duration{-400 * time.Millisecond, 0, 700 * time.Millisecond}
	db := pgtest.NewDB(t)

	t.Run("slots", func(t *testing.T) {
		runs := tickReplicas(t, offsets, every, ticks, func(i int) runFunc {
			r := newReplica(t, db, string(rune('a'+i)), 5*time.Second)
			return func(ctx context.Context, slot string, fn func(string)) {
				err := r.runner.Run(ctx, "skewed", slot, nil, func(_ context.Context, s *schedule.Slot) error { fn(s.Key()); return nil })
				if err != nil && !errors.Is(err, schedule.ErrSlotDone) {
					t.Error(err)
				}
			}
		})
		require.NotEmpty(t, runs)
		for slot, n := range runs {
			require.Equal(t, 1, n, "slot %s", slot)
		}
		t.Logf("%d slots, each run once", len(runs))
	})
	t.Run("database clock slots", func(t *testing.T) {
		// The same skewed ticks, each asking the database for the slot.
		runs := tickReplicas(t, offsets, every, ticks, func(i int) runFunc {
			r := newReplica(t, db, string(rune('a'+i)), 5*time.Second)
			return func(ctx context.Context, _ string, fn func(string)) {
				slot, err := r.runner.Current(ctx, every)
				require.NoError(t, err)
				err = r.runner.Run(ctx, "database", slot, nil, func(_ context.Context, s *schedule.Slot) error { fn(s.Key()); return nil })
				if err != nil && !errors.Is(err, schedule.ErrSlotDone) {
					t.Error(err)
				}
			}
		})
		require.NotEmpty(t, runs)
		for slot, n := range runs {
			require.Equal(t, 1, n, "slot %s", slot)
		}
		t.Logf("%d slots, each run once", len(runs))
	})
	t.Run("control: AtLeast alone", func(t *testing.T) {
		runs := tickReplicas(t, offsets, every, ticks, func(i int) runFunc {
			pool := db.NewPool(t, nil)
			locker, err := leasetable.New(context.Background(), pool, &leasetable.Config{TTL: 5 * time.Second})
			require.NoError(t, err)
			t.Cleanup(locker.Close)
			// AtLeast shorter than the skew: the lease outlives the run, not the skew.
			return atLeastScheduler(locker, "skewed-control", 20*time.Millisecond)
		})
		double := 0
		for _, n := range runs {
			if n > 1 {
				double++
			}
		}
		t.Logf("AtLeast alone: %d of %d slots ran more than once", double, len(runs))
		require.NotZero(t, double, "the AtLeast pattern should run some slot twice under skew: %v", runs)
	})
}

// atLeastScheduler is the hand-written pattern: take the job's lock for at
// least atLeast, run, release.
func atLeastScheduler(locker *leasetable.Locker, job string, atLeast time.Duration) runFunc {
	return func(ctx context.Context, slot string, fn func(string)) {
		l, err := locker.TryAcquire(ctx, job, &pgfence.AcquireOpts{AtLeast: atLeast})
		if err != nil {
			return
		}
		fn(slot)
		_ = l.Release(ctx)
	}
}

// runFunc runs the job for the slot a replica's clock names; fn counts a
// run of the slot it is given.
type runFunc func(ctx context.Context, slot string, fn func(slot string))

// tickReplicas runs one replica per offset: each ticks at the slot
// boundaries of its own clock (time.Now()+offset) and calls run with the
// slot its clock names, ticks times. It returns how often each slot's fn
// ran.
func tickReplicas(t *testing.T, offsets []time.Duration, every time.Duration, ticks int,
	newRun func(i int) runFunc) map[string]int {
	t.Helper()
	ctx := context.Background()
	var mu sync.Mutex
	runs := map[string]int{}
	start := time.Now()
	var wg sync.WaitGroup
	for i, off := range offsets {
		run := newRun(i)
		clock := func() time.Time { return time.Now().Add(off) }
		wg.Add(1)
		go func() {
			defer wg.Done()
			first := schedule.SlotStart(start.Add(off), every).Add(2 * every)
			for k := range ticks {
				at := first.Add(time.Duration(k) * every)
				time.Sleep(at.Sub(clock()))
				slot := schedule.SlotKey(schedule.SlotStart(clock(), every), every)
				run(ctx, slot, func(slot string) {
					mu.Lock()
					runs[slot]++
					mu.Unlock()
					time.Sleep(5 * time.Millisecond)
				})
			}
		}()
	}
	wg.Wait()
	return runs
}
