package waitline

import (
	"context"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestLineOrder: calls take the head in the order they queued for it, one
// at a time; the first finds the turn free.
func TestLineOrder(t *testing.T) {
	ls := New[string](false)
	first := ls.Join("a")
	if waited, stopped := first.Head(context.Background(), nil); waited || stopped {
		t.Fatalf("first call: waited %v, stopped %v; want a free turn", waited, stopped)
	}
	const n = 5
	order := make(chan int, n)
	var lasts atomic.Int32 // Leave calls that reported the last
	var wg sync.WaitGroup
	for i := range n {
		ln := ls.Join("a")
		wg.Add(1)
		go func() {
			defer wg.Done()
			waited, stopped := ln.Head(context.Background(), nil)
			if !waited || stopped {
				t.Errorf("call %d: waited %v, stopped %v; want it to wait for its turn", i, waited, stopped)
			}
			order <- i
			if ls.Leave("a", ln, true) {
				lasts.Add(1)
			}
		}()
		// Let it block on the turn before the next one queues.
		waitBlocked(t, i+1)
	}
	if got := ls.Members("a"); got != n+1 {
		t.Fatalf("Members = %d, want %d", got, n+1)
	}
	if len(order) > 0 {
		t.Fatal("a call took the head while the first held it")
	}
	// The head gives up its turn before it is counted out, so the calls
	// behind it may all leave before it does: any one Leave may be the
	// last, but exactly one is.
	if ls.Leave("a", first, true) {
		lasts.Add(1)
	}
	for want := range n {
		if got := <-order; got != want {
			t.Fatalf("call %d took the head in place %d", got, want)
		}
	}
	wg.Wait()
	if got := ls.Members("a"); got != 0 {
		t.Fatalf("Members after all left = %d", got)
	}
	if got := lasts.Load(); got != 1 {
		t.Fatalf("%d Leave calls reported the last, want 1", got)
	}
}

// waitBlocked waits until n goroutines are blocked in Head's select on a
// turn, as the runtime's goroutine dump shows them.
func waitBlocked(t *testing.T, n int) {
	t.Helper()
	buf := make([]byte, 1<<20)
	deadline := time.Now().Add(10 * time.Second)
	for {
		dump := string(buf[:runtime.Stack(buf, true)])
		got := 0
		for _, g := range strings.Split(dump, "\n\n") {
			if strings.Contains(g, "[select") && strings.Contains(g, "waitline.(*Line).Head") {
				got++
			}
		}
		if got == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d goroutines blocked in Head, want %d", got, n)
		}
		runtime.Gosched()
	}
}

// TestLineStop: a call waiting for the turn leaves when its ctx ends or
// closing closes, without the turn; the lines of different keys do not
// meet.
func TestLineStop(t *testing.T) {
	ls := New[int](false)
	head := ls.Join(1)
	head.Head(context.Background(), nil)

	other := ls.Join(2)
	if waited, _ := other.Head(context.Background(), nil); waited {
		t.Fatal("a call on another key waited behind key 1's head")
	}

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	ln := ls.Join(1)
	if waited, stopped := ln.Head(ctx, nil); !waited || !stopped {
		t.Fatalf("cancelled: waited %v, stopped %v", waited, stopped)
	}
	ls.Leave(1, ln, false)

	closing := make(chan struct{})
	close(closing)
	ln = ls.Join(1)
	if _, stopped := ln.Head(context.Background(), closing); !stopped {
		t.Fatal("closing did not stop the wait")
	}
	if ls.Leave(1, ln, false) {
		t.Fatal("last reported while the head is still in line")
	}
	if !ls.Leave(1, head, true) {
		t.Fatal("the head leaving last was not reported last")
	}
	if again := ls.Join(1); again == head {
		t.Fatal("a Join after the last Leave returned the old line")
	}
}

// TestLineOpen is the negative control: with open set, every call is a head
// at once, as if there were no line.
func TestLineOpen(t *testing.T) {
	ls := New[string](true)
	for i := range 100 {
		ln := ls.Join("a")
		if waited, stopped := ln.Head(context.Background(), nil); waited || stopped {
			t.Fatalf("call %d waited in an open line", i)
		}
	}
	if got := ls.Members("a"); got != 100 {
		t.Fatalf("Members = %d, want 100", got)
	}
}
