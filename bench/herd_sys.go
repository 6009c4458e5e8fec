package main

import (
	"fmt"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"
)

// herdCounters are scenario 11's per-name counters, in a file every worker
// process maps shared. For each name: how many times it was acquired, and
// how many goroutines are inside Acquire for it. A holder releases only
// once its hold has passed and someone waits in Acquire for its name, and
// after releasing it queues again only once someone else took the name
// (as scenario 2's harness does within one process): so every hand-over
// goes to a waiter that was already waiting, however late a starved
// process schedules its goroutines.
//
// Waiting does not poll: a process that has a goroutine waiting on name n
// counts it in waiting[n][process], and whoever changes n's counters rings
// the doorbell of each such process (a futex word shared across
// processes); one watcher goroutine per process sleeps on its doorbell and,
// on a ring (or every 2ms, in case a ring raced a registration), wakes the
// goroutines whose condition holds. The file holds, as uint32 words: names
// acquisition counters, names in-Acquire counts, names*processes waiting
// counts, processes doorbells.
type herdCounters struct {
	mem       []byte
	names     int
	processes int
	process   int // this process's index

	mu      sync.Mutex
	waits   []*herdWait
	stop    chan struct{}
	stopped chan struct{}
}

// herdWait is one goroutine waiting for a condition on a name's counters.
type herdWait struct {
	n    int
	cond func() bool
	ch   chan struct{} // closed when cond held
	done bool          // ch closed
	gone bool          // unregistered
}

// herdCountersSize is the file's size for names and processes.
func herdCountersSize(names, processes int) int { return 4 * (2*names + names*processes + processes) }

// createHerdCounters makes the file.
func createHerdCounters(path string, names, processes int) error {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	defer f.Close()
	return f.Truncate(int64(herdCountersSize(names, processes)))
}

// mapHerdCounters maps the file as process (of processes) and starts its
// watcher.
func mapHerdCounters(path string, names, processes, process int) (*herdCounters, error) {
	if process < 0 || process >= processes {
		return nil, fmt.Errorf("process %d of %d", process, processes)
	}
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	mem, err := syscall.Mmap(int(f.Fd()), 0, herdCountersSize(names, processes), syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("mmap %s: %w", path, err)
	}
	c := &herdCounters{mem: mem, names: names, processes: processes, process: process,
		stop: make(chan struct{}), stopped: make(chan struct{})}
	go c.watch()
	return c, nil
}

// word returns the i-th uint32 of the mapping, which is page aligned.
func (c *herdCounters) word(i int) *uint32 { return (*uint32)(unsafe.Pointer(&c.mem[i*4])) }

func (c *herdCounters) counter(n int) *uint32    { return c.word(n) }
func (c *herdCounters) inAcquire(n int) *uint32  { return c.word(c.names + n) }
func (c *herdCounters) waiting(n, p int) *uint32 { return c.word(2*c.names + n*c.processes + p) }
func (c *herdCounters) bell(p int) *uint32       { return c.word(2*c.names + c.names*c.processes + p) }

// ring wakes the processes that wait on name n.
func (c *herdCounters) ring(n int) {
	for p := range c.processes {
		if atomic.LoadUint32(c.waiting(n, p)) > 0 {
			atomic.AddUint32(c.bell(p), 1)
			futex(c.bell(p), futexWake, 1, 0)
		}
	}
}

// taken counts an acquisition of name n and returns the new count.
func (c *herdCounters) taken(n int) uint32 {
	v := atomic.AddUint32(c.counter(n), 1)
	c.ring(n)
	return v
}

// enter counts a goroutine going into Acquire for name n; leave counts it
// out.
func (c *herdCounters) enter(n int) {
	atomic.AddUint32(c.inAcquire(n), 1)
	c.ring(n)
}

func (c *herdCounters) leave(n int) { atomic.AddUint32(c.inAcquire(n), ^uint32(0)) }

// waitMoved waits until name n's acquisition counter differs from seen, or
// until done closes.
func (c *herdCounters) waitMoved(n int, seen uint32, done <-chan struct{}) {
	c.waitFor(n, func() bool { return atomic.LoadUint32(c.counter(n)) != seen }, done)
}

// waitQueued waits until a goroutine is inside Acquire for name n, or
// until done closes.
func (c *herdCounters) waitQueued(n int, done <-chan struct{}) {
	c.waitFor(n, func() bool { return atomic.LoadUint32(c.inAcquire(n)) > 0 }, done)
}

func (c *herdCounters) waitFor(n int, cond func() bool, done <-chan struct{}) {
	if cond() {
		return
	}
	w := &herdWait{n: n, cond: cond, ch: make(chan struct{})}
	c.mu.Lock()
	c.waits = append(c.waits, w)
	atomic.AddUint32(c.waiting(n, c.process), 1)
	c.mu.Unlock()
	// A change made before we registered rang nobody.
	if !cond() {
		select {
		case <-w.ch:
		case <-done:
		}
	}
	c.mu.Lock()
	if !w.gone {
		w.gone = true
		atomic.AddUint32(c.waiting(n, c.process), ^uint32(0))
		c.waits = slices.DeleteFunc(c.waits, func(x *herdWait) bool { return x == w })
	}
	c.mu.Unlock()
}

// watch wakes the goroutines whose condition holds, when the doorbell
// rings and every 2ms.
func (c *herdCounters) watch() {
	defer close(c.stopped)
	bell := c.bell(c.process)
	for {
		select {
		case <-c.stop:
			return
		default:
		}
		rung := atomic.LoadUint32(bell)
		c.mu.Lock()
		for _, w := range c.waits {
			if !w.done && w.cond() {
				w.done = true
				close(w.ch)
			}
		}
		c.mu.Unlock()
		futex(bell, futexWait, rung, 2*time.Millisecond)
	}
}

func (c *herdCounters) close() {
	close(c.stop)
	<-c.stopped
	_ = syscall.Munmap(c.mem)
}

// The futex operations scenario 11 uses, on words shared between
// processes (so not FUTEX_PRIVATE_FLAG).
const (
	futexWait = 0
	futexWake = 1
)

// futex runs futex(2) on addr; a wait returns when woken, when *addr no
// longer holds val, or after timeout. Errors (EAGAIN, ETIMEDOUT, EINTR)
// only end the wait early.
func futex(addr *uint32, op int, val uint32, timeout time.Duration) {
	var ts *syscall.Timespec
	if op == futexWait {
		t := syscall.NsecToTimespec(int64(timeout))
		ts = &t
	}
	_, _, _ = syscall.Syscall6(syscall.SYS_FUTEX, uintptr(unsafe.Pointer(addr)), uintptr(op), uintptr(val),
		uintptr(unsafe.Pointer(ts)), 0, 0)
}

// processCPU returns this process's user and system CPU time so far.
func processCPU() (user, sys time.Duration) {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0, 0
	}
	return time.Duration(ru.Utime.Nano()), time.Duration(ru.Stime.Nano())
}
