package pgfence

import "time"

// StrategySchedule is the strategy of package schedule's events.
const StrategySchedule = "schedule"

// Slot identifies the schedule slot an event is about: the job, the slot's
// key, and the token of the lease that ran or checked it (0 when a done
// slot was seen without taking the lease).
type Slot struct {
	Job   string
	Key   string
	Token int64
}

// Strategy returns StrategySchedule.
func (Slot) Strategy() string { return StrategySchedule }

// SlotDone is sent when a slot's run ended and was recorded done.
type SlotDone struct {
	Slot
	Attempt  int
	Duration time.Duration
}

// SlotFailed is sent when a slot's run failed: Err is the function's
// error, or matches [ErrLeaseLost] when the outcome could not be recorded
// (the slot stays running and another holder runs it again).
type SlotFailed struct {
	Slot
	Attempt  int
	Duration time.Duration
	Err      error
}

// SlotSkipped is sent when a slot was not run because it is done, by
// DoneBy with DoneToken.
type SlotSkipped struct {
	Slot
	DoneBy    string
	DoneToken int64
}

// SlotRetried is sent when a slot is run again: it was left running by
// PrevOwner (PrevState "running": its holder died or lost the lease) or
// had failed (PrevState "failed"). Attempt counts runs from 1.
type SlotRetried struct {
	Slot
	Attempt   int
	PrevState string
	PrevOwner string
	PrevToken int64
}

func (SlotDone) event()    {}
func (SlotFailed) event()  {}
func (SlotSkipped) event() {}
func (SlotRetried) event() {}
