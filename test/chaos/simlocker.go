package chaos

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/pgfence/pgfence"
)

// nextTokenSQL draws a fencing token the way both pgfence lockers do; the
// function makes the drawing transaction commit durably.
const nextTokenSQL = `SELECT pgfence.pgfence_next_token()`

// NextToken draws a fencing token from pgfence_next_token() on db, in the
// default schema (pgfence.DefaultSchema) that the fault suite installs.
func NextToken(ctx context.Context, db pgfence.DB) (int64, error) {
	var t int64
	if err := db.QueryRow(ctx, nextTokenSQL).Scan(&t); err != nil {
		return 0, fmt.Errorf("chaos: draw token: %w", err)
	}
	return t, nil
}

// SimLocker is a test-only [Locker] standing in for a lease: one holder per
// name at a time, but a grant lapses TTL after it was made even if its
// holder is still running, as a lease does when its holder pauses. Holders
// that sleep longer than TTL therefore overlap with the next one, which is
// the situation fencing must make safe. Tokens are drawn from
// pgfence_next_token() while the grant is serialised, so they increase in
// grant order.
//
// It is not a lock implementation: it lives in one process and exists so
// the workload, register and checkers can be tested before the real lockers
// are wired in.
type SimLocker struct {
	db  pgfence.DB
	ttl time.Duration

	mu    sync.Mutex
	names map[string]*simGrant
}

type simGrant struct {
	until    time.Time
	released chan struct{}
}

// NewSimLocker returns a SimLocker drawing tokens on db whose grants lapse
// after ttl.
func NewSimLocker(db pgfence.DB, ttl time.Duration) (*SimLocker, error) {
	if db == nil || ttl <= 0 {
		return nil, errors.New("chaos: NewSimLocker needs a db and a positive ttl")
	}
	return &SimLocker{db: db, ttl: ttl, names: map[string]*simGrant{}}, nil
}

// Acquire implements [Locker]: it waits until name is free or its grant
// lapsed, then draws a token.
func (l *SimLocker) Acquire(ctx context.Context, name string) (Holder, error) {
	for {
		l.mu.Lock()
		g := l.names[name]
		if g == nil || !time.Now().Before(g.until) {
			ng := &simGrant{until: time.Now().Add(l.ttl), released: make(chan struct{})}
			tok, err := NextToken(ctx, l.db)
			if err != nil {
				l.mu.Unlock()
				return nil, err
			}
			l.names[name] = ng
			l.mu.Unlock()
			return &simHolder{l: l, name: name, g: ng, token: tok}, nil
		}
		l.mu.Unlock()
		t := time.NewTimer(time.Until(g.until))
		select {
		case <-g.released:
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return nil, ctx.Err()
		}
		t.Stop()
	}
}

type simHolder struct {
	l     *SimLocker
	name  string
	g     *simGrant
	token int64
	once  sync.Once
}

func (h *simHolder) Token() int64 { return h.token }

func (h *simHolder) Release(context.Context) error {
	h.once.Do(func() {
		h.l.mu.Lock()
		defer h.l.mu.Unlock()
		if h.l.names[h.name] == h.g {
			delete(h.l.names, h.name)
		}
		close(h.g.released)
	})
	return nil
}
