package schedule_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/leasetable"
	"github.com/pgfence/pgfence/schedule"
)

// Three replicas ask for the same daily slot: it runs once, the others are
// told it is done.
func ExampleRunner_Run() {
	db, drop := pgtest.ExampleDB()
	defer drop()
	ctx := context.Background()

	for _, replica := range []string{"replica-1", "replica-2", "replica-3"} {
		locker, err := leasetable.New(ctx, db.Pool, &leasetable.Config{Owner: replica})
		if err != nil {
			panic(err)
		}
		runner, err := schedule.New(db.Pool, &schedule.Config{Locker: locker})
		if err != nil {
			panic(err)
		}
		err = runner.Run(ctx, "daily-report", "2026-01-02", nil, func(ctx context.Context, s *schedule.Slot) error {
			fmt.Println(replica, "runs", s.Key(), "attempt", s.Attempt())
			return nil
		})
		var done *schedule.DoneError
		if errors.As(err, &done) {
			fmt.Println(replica, "skips: done by", done.Owner)
		}
		locker.Close()
	}
	// Output:
	// replica-1 runs 2026-01-02 attempt 1
	// replica-2 skips: done by replica-1
	// replica-3 skips: done by replica-1
}

// A once-per-minute job: every replica runs the same lines; each minute
// of the database clock runs once, a minute whose holder died runs again.
func ExampleRunner_Every() {
	everyMinute := func(ctx context.Context, pool *pgxpool.Pool, sendReport func(context.Context, string) error) error {
		locker, err := leasetable.New(ctx, pool, nil)
		if err != nil {
			return err
		}
		defer locker.Close()
		runner, err := schedule.New(pool, &schedule.Config{Locker: locker, MaxHold: 5 * time.Minute})
		if err != nil {
			return err
		}
		return runner.Every(ctx, "report", time.Minute, nil, func(ctx context.Context, s *schedule.Slot) error {
			return sendReport(ctx, s.Key())
		})
	}
	_ = everyMinute
}

// gocronLock, gocronLocker and gocronElector are gocron v2's interfaces,
// copied: the adapters are checked against them without the dependency.
type (
	gocronLock interface {
		Unlock(ctx context.Context) error
	}
	gocronLocker interface {
		Lock(ctx context.Context, key string) (gocronLock, error)
	}
	gocronElector interface{ IsLeader(context.Context) error }
)

// gocronAdapter is the wrapper an application writes with gocron imported,
// returning gocron.Lock.
type gocronAdapter struct{ l *schedule.Locker }

func (a gocronAdapter) Lock(ctx context.Context, key string) (gocronLock, error) {
	l, err := a.l.Lock(ctx, key)
	if err != nil {
		return nil, err
	}
	return l, nil
}

var (
	_ gocronLocker  = gocronAdapter{}
	_ gocronElector = (*schedule.Elector)(nil)
)
