package schedule

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/pgfence/pgfence/leader"
)

// ErrNotLeader is returned by [Elector.IsLeader] when this process does
// not lead.
var ErrNotLeader = errors.New("pgfence: schedule: not the leader")

// Elector has the method set of gocron v2's Elector: IsLeader is nil while
// E leads (something else, such as E's Campaign loop, makes it lead).
type Elector struct {
	E *leader.Elector
}

// IsLeader returns nil while the Elector holds a live term, else
// [ErrNotLeader].
func (e *Elector) IsLeader(context.Context) error {
	if t := e.E.Term(); t != nil && t.Context().Err() == nil {
		return nil
	}
	return ErrNotLeader
}

// Locker has the shape of gocron v2's Locker: Lock(ctx, key) starts the
// current slot of length Every (on the database clock) of job key, and
// the returned [*SlotLock]'s Unlock records it done. Lock returns an error
// (gocron then skips the run) when the slot is done ([ErrSlotDone]), or
// when another replica still runs it after a wait of Every. Wrap it to
// return gocron.Lock; see docs/schedule.md.
type Locker struct {
	Runner *Runner
	Every  time.Duration
}

// SlotLock is a started slot, with gocron v2's Lock method set.
type SlotLock struct{ s *Slot }

// Slot returns the slot being run.
func (l *SlotLock) Slot() *Slot { return l.s }

// Unlock records the slot done and releases its lease; it returns
// [Slot.Finish]'s errors.
func (l *SlotLock) Unlock(ctx context.Context) error { return l.s.Finish(ctx, nil) }

// Lock starts the current slot of job key; it returns [Runner.Begin]'s
// errors.
func (l *Locker) Lock(ctx context.Context, key string) (*SlotLock, error) {
	slot, err := l.Runner.Current(ctx, l.Every)
	if err != nil {
		return nil, err
	}
	s, err := l.Runner.Begin(ctx, key, slot, &RunOpts{WaitTimeout: l.Every})
	if err != nil {
		return nil, fmt.Errorf("pgfence: schedule: gocron lock %q: %w", key, err)
	}
	return &SlotLock{s}, nil
}
