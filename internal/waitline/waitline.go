// Package waitline queues the waiting calls of one Locker per lock, so that
// a release or a notification wakes one of them, not all: the head of a
// lock's [Line] retries and listens, the others block until they take the
// turn, in about the order they joined.
package waitline

import (
	"context"
	"math"
	"sync"
)

// Lines holds one Locker's lines, by lock; use [New]. Safe for concurrent
// use.
type Lines[K comparable] struct {
	mu    sync.Mutex
	lines map[K]*Line
	// open makes every call the head at once (the tests' negative control).
	open bool
}

// Line is the queue of one lock's waiting calls.
type Line struct {
	turn    chan struct{} // capacity 1 (or unbounded when open): sent to by the head
	members int           // calls in the line, head included; guarded by Lines.mu
}

// New returns an empty set of lines. When open is set (a test hook), every
// call is the head of its line at once, as if there were no line.
func New[K comparable](open bool) *Lines[K] {
	return &Lines[K]{lines: make(map[K]*Line), open: open}
}

// Join returns key's line with the caller counted in it. Every Join must be
// matched by one Leave.
func (ls *Lines[K]) Join(key K) *Line {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	ln := ls.lines[key]
	if ln == nil {
		size := 1
		if ls.open {
			size = math.MaxInt32
		}
		ln = &Line{turn: make(chan struct{}, size)}
		ls.lines[key] = ln
	}
	ln.members++
	return ln
}

// Head makes the caller the head of ln. It returns waited false when the
// turn was free (nobody was ahead), true after it waited for the calls
// ahead. It returns stopped true, without the turn, when ctx ends or
// closing closes first.
func (ln *Line) Head(ctx context.Context, closing <-chan struct{}) (waited, stopped bool) {
	select {
	case ln.turn <- struct{}{}:
		return false, false
	default:
	}
	select {
	case ln.turn <- struct{}{}:
		return true, false
	case <-ctx.Done():
	case <-closing:
	}
	return true, true
}

// Leave takes the caller out of key's line ln, giving up the turn when head
// is true. It reports whether the caller was the last to leave: the line is
// then gone, and a later Join makes a new one.
func (ls *Lines[K]) Leave(key K, ln *Line, head bool) (last bool) {
	if head {
		<-ln.turn
	}
	ls.mu.Lock()
	defer ls.mu.Unlock()
	ln.members--
	if ln.members > 0 {
		return false
	}
	if ls.lines[key] == ln {
		delete(ls.lines, key)
	}
	return true
}

// Members returns the number of calls in key's line, head included.
func (ls *Lines[K]) Members(key K) int {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	if ln := ls.lines[key]; ln != nil {
		return ln.members
	}
	return 0
}
