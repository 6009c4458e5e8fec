package demo

import (
	"fmt"
	"io"
	"sync"
	"time"
)

// Timeline prints the demo's events, one line each, with the time elapsed
// since it began and the actor:
//
//	+0.012s  worker-1   acquired account:42 with token 7
//
// It is safe for concurrent use.
type Timeline struct {
	w     io.Writer
	now   func() time.Time
	start time.Time
	width int

	mu sync.Mutex
}

// NewTimeline returns a timeline writing to w that begins now. now is the
// clock (time.Now when nil); actorWidth pads actor names to line events up.
func NewTimeline(w io.Writer, now func() time.Time, actorWidth int) *Timeline {
	if now == nil {
		now = time.Now
	}
	return &Timeline{w: w, now: now, start: now(), width: actorWidth}
}

// Event prints one event by actor; format and args are as fmt.Sprintf's.
func (t *Timeline) Event(actor, format string, args ...any) {
	t.mu.Lock()
	defer t.mu.Unlock()
	elapsed := t.now().Sub(t.start)
	fmt.Fprintf(t.w, "%+8.3fs  %-*s  %s\n", elapsed.Seconds(), t.width, actor, fmt.Sprintf(format, args...))
}
