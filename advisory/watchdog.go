package advisory

import (
	"context"
	"fmt"
	"time"

	"github.com/pgfence/pgfence"
	"github.com/pgfence/pgfence/internal/events"
)

// sessionPeekInterval is how often the watchdog looks whether an idle
// session's socket has anything to read.
const sessionPeekInterval = 50 * time.Millisecond

// watch is the watchdog of s. Every SessionCheckInterval it checks s, when
// idle, with a round trip; in between, every peek (sessionPeekInterval), it looks
// without one whether the idle socket has anything to read (the server is
// ending the session) and then checks at once. A session in use is checked
// by its statement. A session without locks for SessionIdleTimeout is
// closed.
func (s *session) watch(peek time.Duration) {
	k := s.k
	defer k.wg.Done()
	every := k.cfg.SessionCheckInterval
	if peek > 0 && peek < every {
		every = peek
	}
	perCheck := int((k.cfg.SessionCheckInterval + every - 1) / every) // ticks per check
	t := time.NewTicker(every)
	defer t.Stop()
	idleSince := time.Now()
	ticks := 0
	for {
		select {
		case <-s.stop:
			return
		case <-t.C:
		}
		ticks++
		due := ticks >= perCheck
		select {
		case s.sem <- struct{}{}:
		default:
			continue // in use: checked once idle
		}
		if !due {
			if ready, _ := readable(s.conn.PgConn().Conn()); !ready {
				<-s.sem
				continue
			}
		}
		ticks = 0
		if due && s.retireIfIdle(&idleSince) {
			<-s.sem
			return
		}
		s.check()
		<-s.sem
	}
}

// check is one watchdog check of s, the renewal of its locks: an OpRenew
// covering every lock on s, with the values of the ctx that acquired the
// oldest. On success each lock is Renewed; on failure s fails. The caller
// has the turn.
func (s *session) check() {
	k := s.k
	k.mu.Lock()
	if s.dead {
		k.mu.Unlock()
		return
	}
	var first *Lease
	var leases []*Lease // with an Observer only
	for l := range s.locks {
		if !l.out {
			continue
		}
		if first == nil || l.acquired.Before(first.acquired) {
			first = l
		}
		if k.ev != nil {
			leases = append(leases, l)
		}
	}
	k.mu.Unlock()
	values := context.Background()
	if first != nil {
		values = first.values
	}
	ctx, stop := events.Values(values, k.closeCtx)
	defer stop()
	var op pgfence.Op
	if k.ev != nil && first != nil {
		op = pgfence.Op{Kind: pgfence.OpRenew, Strategy: pgfence.StrategyAdvisory, Batch: len(leases)}
		if len(leases) == 1 {
			op.Name = first.Name()
		} else {
			op.Links = make([]context.Context, 0, len(leases)-1)
			for _, l := range leases {
				if l != first {
					op.Links = append(op.Links, context.WithoutCancel(l.values))
				}
			}
		}
		ctx = k.ev.StartOp(ctx, op)
	}
	err := s.ping(ctx)
	if err != nil {
		err = fmt.Errorf("pgfence: advisory: liveness check failed: %w", err)
	}
	if k.ev != nil && first != nil {
		k.ev.EndOp(ctx, op, err)
	}
	if err != nil {
		s.fail(ctx, err)
		return
	}
	for _, l := range leases {
		if l.Err() == nil {
			k.ev.Async(context.WithoutCancel(l.values), pgfence.Renewed{Lock: l.lock()})
		}
	}
}

// retireIfIdle closes s when it has had no lock and nothing in flight for
// SessionIdleTimeout. The caller has the turn.
func (s *session) retireIfIdle(idleSince *time.Time) bool {
	k := s.k
	k.mu.Lock()
	if s.dead || s.load() > 0 {
		*idleSince = time.Now()
		k.mu.Unlock()
		return false
	}
	if time.Since(*idleSince) < k.cfg.SessionIdleTimeout {
		k.mu.Unlock()
		return false
	}
	s.closeEmptyLocked(context.Background(), "pgfence: advisory: idle lock session closed")
	return true
}
