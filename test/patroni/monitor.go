package patroni

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
)

// Clock is the suite's time base: durations since its start, on the
// monotonic clock. The monitor, the workload and the checks share one, so
// their times compare.
type Clock struct{ start time.Time }

// NewClock starts a clock now.
func NewClock() *Clock { return &Clock{start: time.Now()} }

// Now returns the time since the clock started.
func (c *Clock) Now() time.Duration { return time.Since(c.start) }

// Sample is one poll of a node: whether it answered and whether it was
// writable (pg_is_in_recovery() false). Call and Return bound when the
// server looked.
type Sample struct {
	Node         int
	Call, Return time.Duration
	Up, Writable bool
}

// Monitor polls every node's PostgreSQL directly, about every 50ms, and
// keeps the samples: it tells when a node became writable.
type Monitor struct {
	clock *Clock
	mu    sync.Mutex
	samp  []Sample
	stop  context.CancelFunc
	wg    sync.WaitGroup
}

// pollSQL asks whether the server is a standby (or a primary being
// promoted, until the promotion ends).
const pollSQL = `SELECT pg_catalog.pg_is_in_recovery()`

// StartMonitor starts polling c's nodes.
func StartMonitor(c *Cluster, clock *Clock) *Monitor {
	ctx, cancel := context.WithCancel(context.Background())
	m := &Monitor{clock: clock, stop: cancel}
	for i, n := range c.Nodes {
		m.wg.Add(1)
		go m.poll(ctx, i, n)
	}
	return m
}

func (m *Monitor) poll(ctx context.Context, i int, n *Node) {
	defer m.wg.Done()
	var conn *pgx.Conn
	defer func() {
		if conn != nil {
			_ = conn.Close(context.Background())
		}
	}()
	for ctx.Err() == nil {
		s := Sample{Node: i, Call: m.clock.Now()}
		qctx, cancel := context.WithTimeout(ctx, time.Second)
		if conn == nil {
			conn, _ = pgx.Connect(qctx, n.URL("postgres"))
		}
		if conn != nil {
			var inRecovery bool
			if err := conn.QueryRow(qctx, pollSQL).Scan(&inRecovery); err == nil {
				s.Up, s.Writable = true, !inRecovery
			} else {
				_ = conn.Close(context.Background())
				conn = nil
			}
		}
		cancel()
		s.Return = m.clock.Now()
		if ctx.Err() != nil {
			return
		}
		m.mu.Lock()
		m.samp = append(m.samp, s)
		m.mu.Unlock()
		_ = sleepCtx(ctx, 50*time.Millisecond)
	}
}

// Stop stops polling and waits for the pollers.
func (m *Monitor) Stop() {
	m.stop()
	m.wg.Wait()
}

// Writable is the first sample, invoked after from, in which a node other
// than exclude (-1: any node) was writable, and the last sample of that node
// before it that was not (the promotion ended between the two).
type Writable struct {
	Node int
	// Before is the Return of the node's last unwritable (or unanswered)
	// poll before Seen: the node became writable after Before and at the
	// latest at Seen.Return.
	Before time.Duration
	Seen   Sample
}

// FirstWritable returns the first writable sample after from (see
// [Writable]); ok is false if there is none yet.
func (m *Monitor) FirstWritable(from time.Duration, exclude int) (w Writable, ok bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	last := map[int]time.Duration{}
	for _, s := range m.samp {
		if s.Call < from {
			if !s.Writable {
				last[s.Node] = s.Return
			}
			continue
		}
		if !s.Writable {
			last[s.Node] = s.Return
			continue
		}
		if s.Node == exclude {
			continue
		}
		return Writable{Node: s.Node, Before: last[s.Node], Seen: s}, true
	}
	return Writable{}, false
}

// WaitWritable waits until FirstWritable finds a sample, or ctx ends.
func (m *Monitor) WaitWritable(ctx context.Context, from time.Duration, exclude int) (Writable, error) {
	for {
		if w, ok := m.FirstWritable(from, exclude); ok {
			return w, nil
		}
		if err := sleepCtx(ctx, 20*time.Millisecond); err != nil {
			return Writable{}, fmt.Errorf("patroni: no writable node after %v: %w", from, err)
		}
	}
}

// WritableNodes returns the nodes seen writable in polls made within
// [from, to], in the order first seen.
func (m *Monitor) WritableNodes(from, to time.Duration) []int {
	m.mu.Lock()
	defer m.mu.Unlock()
	seen := map[int]bool{}
	var out []int
	for _, s := range m.samp {
		if s.Call >= from && s.Return <= to && s.Writable && !seen[s.Node] {
			seen[s.Node] = true
			out = append(out, s.Node)
		}
	}
	return out
}
