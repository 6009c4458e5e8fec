package leader_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence"
	"github.com/pgfence/pgfence/fence"
	"github.com/pgfence/pgfence/internal/notifier"
	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/leader"
	"github.com/pgfence/pgfence/leasetable"
)

func TestNewValidatesConfig(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDB(t)
	k, err := leasetable.New(t.Context(), db.Pool, nil)
	require.NoError(t, err)
	t.Cleanup(k.Close)
	tests := []struct {
		name string
		cfg  *leader.Config
		want string
	}{
		{"nil config", nil, "Config is nil"},
		{"no locker", &leader.Config{Election: "e"}, "Config.Locker"},
		{"no election", &leader.Config{Locker: k}, "Config.Election is empty"},
		{"long election", &leader.Config{Locker: k, Election: strings.Repeat("e", leasetable.MaxNameLength+1)}, "Config.Election"},
		{"control character", &leader.Config{Locker: k, Election: "a\nb"}, "control character"},
		{"bad utf-8", &leader.Config{Locker: k, Election: "\xff"}, "UTF-8"},
		{"long value", &leader.Config{Locker: k, Election: "e", Value: strings.Repeat("v", leader.MaxValueLength+1)}, "Config.Value"},
		{"nul in value", &leader.Config{Locker: k, Election: "e", Value: "a\x00"}, "NUL"},
		{"short ttl", &leader.Config{Locker: k, Election: "e", TTL: time.Millisecond}, "Config.TTL"},
		{"negative ttl", &leader.Config{Locker: k, Election: "e", TTL: -time.Second}, "Config.TTL"},
		{"short observe interval", &leader.Config{Locker: k, Election: "e", ObserveInterval: time.Millisecond}, "Config.ObserveInterval"},
		{"negative retry", &leader.Config{Locker: k, Election: "e", RetryInterval: -1}, "Config.RetryInterval"},
	}
	for _, tt := range tests {
		_, err := leader.New(t.Context(), db.Pool, tt.cfg)
		require.ErrorContains(t, err, tt.want, tt.name)
	}
	_, err = leader.New(t.Context(), nil, &leader.Config{Locker: k, Election: "e"})
	require.ErrorContains(t, err, "pool is nil")
	// Control: a valid Config.
	e, err := leader.New(t.Context(), db.Pool, &leader.Config{Locker: k, Election: "e", Value: "a\tb"})
	require.NoError(t, err)
	e.Close()
}

func TestCampaignResignHandsOver(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	db := pgtest.NewDB(t)
	a := newCandidate(t, db.Pool, "scheduler", "10.0.0.1:8080", nil, nil)
	b := newCandidate(t, db.Pool, "scheduler", "10.0.0.2:8080", nil, nil)

	info, err := b.e.Leader(ctx)
	require.NoError(t, err)
	require.Equal(t, leader.TermInfo{Election: "scheduler"}, info, "nobody leads yet")

	ta, err := a.e.Campaign(ctx)
	require.NoError(t, err)
	require.Equal(t, "scheduler", ta.Election())
	require.Equal(t, "10.0.0.1:8080", ta.Value())
	require.Same(t, ta, a.e.Term())
	require.NoError(t, ta.Err())
	info, err = b.e.Leader(ctx)
	require.NoError(t, err)
	require.True(t, info.Leading)
	require.True(t, info.Proclaimed)
	require.Equal(t, ta.Token(), info.Token)
	require.Equal(t, "10.0.0.1:8080", info.Value)
	require.Equal(t, a.locker.Owner(), info.Owner)
	require.Equal(t, ta.BeganAt(), info.BeganAt)
	require.True(t, info.ExpiresAt.After(info.BeganAt))

	_, err = a.e.Campaign(ctx)
	require.ErrorIs(t, err, leader.ErrAlreadyLeading)
	require.ErrorIs(t, err, pgfence.ErrAlreadyHeld)

	won := make(chan *leader.Term, 1)
	go func() {
		tb, err := b.e.Campaign(ctx)
		if err != nil {
			t.Error(err)
		}
		won <- tb
	}()
	select {
	case <-won:
		t.Fatal("b leads while a does")
	case <-time.After(50 * time.Millisecond):
	}
	require.NoError(t, ta.Resign(ctx))
	require.ErrorIs(t, ta.Err(), pgfence.ErrNotHeld)
	require.Nil(t, a.e.Term())
	tb := <-won
	require.NotNil(t, tb)
	require.Greater(t, tb.Token(), ta.Token())
	info, err = a.e.Leader(ctx)
	require.NoError(t, err)
	require.Equal(t, tb.Token(), info.Token)
	require.Equal(t, "10.0.0.2:8080", info.Value)
	require.Equal(t, b.locker.Owner(), info.Owner)
	// Resign is idempotent.
	require.NoError(t, ta.Resign(ctx))
	require.NoError(t, b.e.Resign(ctx))
	require.NoError(t, b.e.Resign(ctx), "no term: nothing to resign")
}

// Two Electors on one Locker (one process): the Locker never holds the
// lease twice, so the second leads only after the first resigned.
func TestSharedLockerOneTermAtATime(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	db := pgtest.NewDB(t)
	a := newCandidate(t, db.Pool, "one", "a", nil, nil)
	b, err := leader.New(ctx, db.Pool, &leader.Config{Locker: a.locker, Election: "one", Value: "b"})
	require.NoError(t, err)
	t.Cleanup(b.Close)
	ta, err := a.e.Campaign(ctx)
	require.NoError(t, err)
	wctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	_, err = b.Campaign(wctx)
	cancel()
	require.ErrorIs(t, err, context.DeadlineExceeded)
	won := make(chan *leader.Term, 1)
	go func() {
		tb, err := b.Campaign(ctx)
		if err != nil {
			t.Error(err)
		}
		won <- tb
	}()
	require.NoError(t, ta.Resign(ctx))
	tb := <-won
	require.Greater(t, tb.Token(), ta.Token())
	require.Equal(t, "b", tb.Value())
	// A campaign under the term's own context is refused at once.
	_, err = a.e.Campaign(tb.Context())
	require.ErrorIs(t, err, pgfence.ErrAlreadyHeld)
}

// A term whose lease is force-released ends (cause ErrLeaseLost) by its
// next renewal, its fenced writes are rejected once the next term wrote,
// and a follower takes over.
func TestTermLostFencedAndTakenOver(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	db := pgtest.NewDB(t)
	_, err := db.Pool.Exec(ctx, `CREATE TABLE jobs (id int PRIMARY KEY, runs int NOT NULL, fence_token bigint NOT NULL DEFAULT 0);
		INSERT INTO jobs VALUES (1, 0)`)
	require.NoError(t, err)
	lcfg := &leasetable.Config{TTL: 300 * time.Millisecond}
	a := newCandidate(t, db.Pool, "relay", "a", lcfg, nil)
	b := newCandidate(t, db.Pool, "relay", "b", lcfg, nil)
	ta, err := a.e.Campaign(ctx)
	require.NoError(t, err)
	run := fence.Update("jobs").Set("runs = runs + 1").Where("id = 1")
	_, err = run.Exec(ctx, db.Pool, ta.Token())
	require.NoError(t, err)

	_, err = a.locker.ForceRelease(ctx, "relay", "test")
	require.NoError(t, err)
	tb, err := b.e.Campaign(ctx)
	require.NoError(t, err)
	require.Greater(t, tb.Token(), ta.Token())
	_, err = run.Exec(ctx, db.Pool, tb.Token())
	require.NoError(t, err)
	select {
	case <-ta.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("the old term did not end")
	}
	require.ErrorIs(t, ta.Err(), pgfence.ErrLeaseLost)
	_, err = run.Exec(ctx, db.Pool, ta.Token())
	require.ErrorIs(t, err, pgfence.ErrFenced, "the old leader's write is rejected")
	require.ErrorIs(t, ta.Proclaim(ctx, "again"), pgfence.ErrLeaseLost)
	require.ErrorIs(t, ta.Resign(ctx), pgfence.ErrNotHeld)
	var runs int
	require.NoError(t, db.Pool.QueryRow(ctx, "SELECT runs FROM jobs").Scan(&runs))
	require.Equal(t, 2, runs)
}

func TestProclaim(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	db := pgtest.NewDB(t)
	a := newCandidate(t, db.Pool, "p", "first", nil, nil)
	ta, err := a.e.Campaign(ctx)
	require.NoError(t, err)
	require.NoError(t, ta.Proclaim(ctx, "second"))
	require.Equal(t, "second", ta.Value())
	info, err := a.e.Leader(ctx)
	require.NoError(t, err)
	require.Equal(t, "second", info.Value)
	require.Equal(t, ta.Token(), info.Token)
	require.ErrorContains(t, ta.Proclaim(ctx, "bad\xff"), "UTF-8")
	require.NoError(t, ta.Resign(ctx))
	require.ErrorIs(t, ta.Proclaim(ctx, "third"), pgfence.ErrNotHeld)
}

// A lease of the election's name taken without this package is a leader
// that proclaimed nothing.
func TestLeaderUnproclaimed(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	db := pgtest.NewDB(t)
	a := newCandidate(t, db.Pool, "plain", "a", nil, nil)
	l, err := a.locker.TryAcquire(ctx, "plain", nil)
	require.NoError(t, err)
	info, err := a.e.Leader(ctx)
	require.NoError(t, err)
	require.True(t, info.Leading)
	require.False(t, info.Proclaimed)
	require.Equal(t, l.Token(), info.Token)
	// An observer reports it too, without a value, once no proclamation
	// came within its grace.
	octx, stop := context.WithCancel(ctx)
	defer stop()
	i := next(t, a.e.Observe(octx))
	require.True(t, i.Leading)
	require.False(t, i.Proclaimed)
	require.Equal(t, l.Token(), i.Token)
	require.NoError(t, l.Release(ctx))
}

// next receives from ch within a few seconds.
func next(t *testing.T, ch <-chan leader.TermInfo) leader.TermInfo {
	t.Helper()
	select {
	case i, ok := <-ch:
		require.True(t, ok, "Observe's channel closed")
		return i
	case <-time.After(10 * time.Second):
		t.Fatal("no change observed")
	}
	return leader.TermInfo{}
}

func TestObserve(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	db := pgtest.NewDB(t)
	lcfg := &leasetable.Config{TTL: time.Second}
	// A long ObserveInterval: changes must come from notifications and
	// expiries, not from the fallback.
	slow := func(c *leader.Config) { c.ObserveInterval = time.Hour }
	a := newCandidate(t, db.Pool, "obs", "a", lcfg, slow)
	b := newCandidate(t, db.Pool, "obs", "b", lcfg, slow)
	o := newCandidate(t, db.Pool, "obs", "observer", lcfg, slow)
	octx, stop := context.WithCancel(ctx)
	ch := o.e.Observe(octx)
	require.False(t, next(t, ch).Leading, "first the current state: nobody leads")

	ta, err := a.e.Campaign(ctx)
	require.NoError(t, err)
	i := next(t, ch)
	require.True(t, i.Proclaimed, "a new term is reported with its value")
	require.Equal(t, ta.Token(), i.Token)
	require.Equal(t, "a", i.Value)

	require.NoError(t, ta.Proclaim(ctx, "a2"))
	require.Equal(t, "a2", next(t, ch).Value)

	// Resign: the release's notification.
	require.NoError(t, ta.Resign(ctx))
	require.False(t, next(t, ch).Leading)

	tb, err := b.e.Campaign(ctx)
	require.NoError(t, err)
	i = next(t, ch)
	require.True(t, i.Proclaimed)
	require.Equal(t, tb.Token(), i.Token)
	require.Equal(t, "b", i.Value)

	// A leader that keeps renewing is no change: the observer re-reads
	// at each expiry the lease had when read, and finds the same term.
	select {
	case i := <-ch:
		t.Fatalf("a change while the leader renews: %+v", i)
	case <-time.After(1500 * time.Millisecond): // past the expiry the lease had when read
	}
	stop()
	for range ch {
	}
	_ = tb.Resign(ctx)
}

// TestObserveSeesResignation: a resignation reaches an observer at once by
// its notification, long before the lease's one-minute TTL or the hour's
// ObserveInterval: the observer's LISTEN connection holds the election's
// interest key. Negative control: without it the resignation notifies no
// one (releases notify only names someone waits for). The control counts
// the election's notifications up to a marker notified after the
// resignation, in commit order: a re-read of the observer's own (its
// LISTEN connection reconnecting on a loaded machine) does not count.
func TestObserveSeesResignation(t *testing.T) {
	t.Parallel()
	for _, interest := range []bool{true, false} {
		t.Run(fmt.Sprintf("interest=%t", interest), func(t *testing.T) {
			t.Parallel()
			ctx := t.Context()
			db := pgtest.NewDB(t)
			lcfg := &leasetable.Config{TTL: time.Minute}
			slow := func(c *leader.Config) { c.ObserveInterval = time.Hour }
			a := newCandidate(t, db.Pool, "resign", "a", lcfg, slow)
			o := newCandidate(t, db.NewPool(t, nil), "resign", "observer", lcfg, slow)
			if !interest {
				leader.DisableInterest(o.e)
			}
			watch := notificationsOf(t, db, "resign")
			ta, err := a.e.Campaign(ctx)
			require.NoError(t, err)
			octx, stop := context.WithCancel(ctx)
			defer stop()
			ch := o.e.Observe(octx)
			require.Equal(t, ta.Token(), next(t, ch).Token)
			require.Eventually(t, func() bool { return leader.Listening(o.e) }, 30*time.Second, 5*time.Millisecond)
			before := watch()
			require.NoError(t, ta.Resign(ctx))
			if interest {
				require.False(t, next(t, ch).Leading)
				require.Greater(t, watch(), before, "the resignation was notified")
				return
			}
			require.Equal(t, before, watch(), "control: the resignation notified no one")
		})
	}
}

// notificationsOf LISTENs, on a session of db, to the channels an election's
// observers listen to, and returns a function that sends a marker through
// db's pool and returns how many notifications for election arrived before
// the marker (all, since notifications arrive in commit order).
func notificationsOf(t *testing.T, db *pgtest.DB, election string) func() int {
	t.Helper()
	ctx := t.Context()
	key, err := notifier.LoadKey(ctx, db.Pool, `"pgfence"`)
	require.NoError(t, err)
	conn, err := pgx.Connect(ctx, db.URL)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	for _, ch := range []string{leader.NotifyChannel, leasetable.NotifyChannel} {
		_, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{ch}.Sanitize())
		require.NoError(t, err)
	}
	tag := key.Tag(election)
	seen, marks := 0, 0
	return func() int {
		t.Helper()
		marks++
		marker := fmt.Sprintf("marker %d", marks)
		_, err := db.Pool.Exec(ctx, "SELECT pg_notify($1, $2)", leasetable.NotifyChannel, marker)
		require.NoError(t, err)
		wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		for {
			n, err := conn.WaitForNotification(wctx)
			require.NoError(t, err)
			if n.Payload == marker {
				return seen
			}
			if got, _, ok := key.Verify(n.Payload); ok && got == tag {
				seen++
			}
		}
	}
}

// An observer whose leader crashed (its lease is never renewed, and no
// notification comes) sees the vacancy at the lease's expiry, not after
// ObserveInterval.
func TestObserveSeesExpiry(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	db := pgtest.NewDB(t)
	o := newCandidate(t, db.Pool, "exp", "observer", nil, func(c *leader.Config) {
		c.ObserveInterval = time.Hour
		c.DisableListen = true // no notification at all: only the expiry re-read
	})
	// The crashed leader's term: a lease of 300ms, proclaimed, never
	// renewed.
	var token int64
	var secret string
	require.NoError(t, db.Pool.QueryRow(ctx,
		"SELECT fence, secret FROM pgfence.pgfence_acquire(ARRAY['exp'], 'crashed', ARRAY[300000::bigint]) WHERE acquired").Scan(&token, &secret))
	var held bool
	require.NoError(t, db.Pool.QueryRow(ctx, "SELECT pgfence.pgfence_leader_proclaim('exp', $1, $2, 'addr')", token, secret).Scan(&held))
	require.True(t, held)
	octx, stop := context.WithCancel(ctx)
	defer stop()
	ch := o.e.Observe(octx)
	i := next(t, ch)
	require.True(t, i.Leading)
	require.Equal(t, token, i.Token)
	start := time.Now()
	require.False(t, next(t, ch).Leading, "the vacancy is seen at expiry")
	t.Logf("vacancy seen %v after the first read (lease TTL 300ms)", time.Since(start).Round(time.Millisecond))
}

func TestRunOneTermAtATime(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDB(t)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	var active, maxActive, started atomic.Int32
	var mu sync.Mutex
	var tokens []int64
	var seen []leader.TermInfo
	const replicas, terms = 3, 9
	var wg sync.WaitGroup
	errs := make(chan error, replicas)
	for r := 0; r < replicas; r++ {
		c := newCandidate(t, db.Pool, "run", string(rune('a'+r)), nil, nil)
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- c.e.Run(ctx, leader.Callbacks{
				OnStartedLeading: func(ctx context.Context, term *leader.Term) {
					n := active.Add(1)
					for {
						m := maxActive.Load()
						if n <= m || maxActive.CompareAndSwap(m, n) {
							break
						}
					}
					mu.Lock()
					tokens = append(tokens, term.Token())
					mu.Unlock()
					time.Sleep(5 * time.Millisecond)
					active.Add(-1)
					if started.Add(1) >= terms {
						cancel()
					}
					// Returning early hands the election over.
				},
				OnStoppedLeading: func(term *leader.Term) {
					if !errors.Is(term.Err(), pgfence.ErrNotHeld) {
						t.Errorf("term %d ended with %v, want a resignation", term.Token(), term.Err())
					}
				},
				OnNewLeader: func(info leader.TermInfo) {
					mu.Lock()
					seen = append(seen, info)
					mu.Unlock()
				},
			})
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.ErrorIs(t, err, context.Canceled)
	}
	require.Equal(t, int32(1), maxActive.Load(), "never two terms at once")
	require.GreaterOrEqual(t, len(tokens), terms)
	for i := 1; i < len(tokens); i++ {
		require.Greater(t, tokens[i], tokens[i-1], "terms in token order")
	}
	require.NotEmpty(t, seen)
}

func TestRunRetriesAndClose(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDB(t)
	c := newCandidate(t, db.Pool, "close", "a", nil, nil)
	require.ErrorContains(t, c.e.Run(t.Context(), leader.Callbacks{}), "OnStartedLeading is nil")
	started := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- c.e.Run(t.Context(), leader.Callbacks{OnStartedLeading: func(ctx context.Context, _ *leader.Term) {
			close(started)
			<-ctx.Done()
		}})
	}()
	<-started
	require.ErrorContains(t, c.e.Run(t.Context(), leader.Callbacks{OnStartedLeading: func(context.Context, *leader.Term) {}}), "already running")
	c.e.Close()
	require.ErrorIs(t, <-done, pgfence.ErrClosed)
	_, err := c.e.Campaign(t.Context())
	require.ErrorIs(t, err, pgfence.ErrClosed)
	_, err = c.e.Leader(t.Context())
	require.ErrorIs(t, err, pgfence.ErrClosed)
	// Close resigned: another candidate leads at once.
	d := newCandidate(t, db.Pool, "close", "d", nil, nil)
	term, err := d.e.Campaign(t.Context())
	require.NoError(t, err)
	require.NoError(t, term.Resign(t.Context()))
}

func TestCloseEndsCampaign(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDB(t)
	a := newCandidate(t, db.Pool, "busy", "a", nil, nil)
	b := newCandidate(t, db.Pool, "busy", "b", nil, nil)
	ta, err := a.e.Campaign(t.Context())
	require.NoError(t, err)
	done := make(chan error, 1)
	go func() {
		_, err := b.e.Campaign(t.Context())
		done <- err
	}()
	// Close while b's Campaign waits in its Locker's Acquire.
	require.Eventually(t, func() bool { return b.locker.Stats().Waiting == 1 }, 10*time.Second, time.Millisecond)
	b.e.Close()
	require.ErrorIs(t, <-done, pgfence.ErrClosed)
	require.NoError(t, ta.Resign(t.Context()))
}

func TestListAndTerms(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	db := pgtest.NewDB(t)
	// A lone candidate that resigns leads again after its HandoverTimeout.
	short := func(c *leader.Config) { c.HandoverTimeout = time.Millisecond }
	a := newCandidate(t, db.Pool, "ls-a", "addr-a", nil, short)
	b := newCandidate(t, db.Pool, "ls-b", "addr-b", nil, nil)
	var last *leader.Term
	for i := 0; i < 12; i++ {
		term, err := a.e.Campaign(ctx)
		require.NoError(t, err)
		last = term
		if i < 11 {
			require.NoError(t, term.Resign(ctx))
		}
	}
	tb, err := b.e.Campaign(ctx)
	require.NoError(t, err)
	require.NoError(t, tb.Resign(ctx))

	list, err := leader.List(ctx, db.Pool, "")
	require.NoError(t, err)
	require.Len(t, list, 2)
	require.Equal(t, "ls-a", list[0].Election)
	require.True(t, list[0].Leading)
	require.Equal(t, last.Token(), list[0].Token)
	require.Equal(t, "addr-a", list[0].Value)
	require.Equal(t, leader.TermInfo{Election: "ls-b"}, list[1], "resigned: nobody leads")

	terms, err := leader.Terms(ctx, db.Pool, "")
	require.NoError(t, err)
	require.Len(t, terms, 11, "ten terms kept of ls-a, one of ls-b")
	require.Equal(t, last.Token(), terms[0].Token)
	require.True(t, terms[0].Leading)
	require.False(t, terms[1].Leading)
	require.True(t, terms[0].ExpiresAt.After(terms[0].BeganAt))
	require.True(t, terms[1].ExpiresAt.IsZero())
	require.Equal(t, "ls-b", terms[10].Election)
	require.NoError(t, last.Resign(ctx))

	_, err = leader.List(ctx, db.Pool, strings.Repeat("s", 64))
	require.Error(t, err)
}

// New checks the install through its pool: a pool on a database without
// pgfence is refused with ErrNotInstalled.
func TestNewChecksInstall(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDB(t)
	k, err := leasetable.New(t.Context(), db.Pool, nil)
	require.NoError(t, err)
	t.Cleanup(k.Close)
	other := pgtest.NewDB(t)
	_, err = other.Pool.Exec(t.Context(), "DROP SCHEMA pgfence CASCADE")
	require.NoError(t, err)
	_, err = leader.New(t.Context(), other.Pool, &leader.Config{Locker: k, Election: "e"})
	require.ErrorIs(t, err, pgfence.ErrNotInstalled)
	// Control: the Locker's database.
	e, err := leader.New(t.Context(), db.Pool, &leader.Config{Locker: k, Election: "e"})
	require.NoError(t, err)
	e.Close()
}

// Run campaigns again after a loss: a term force-released while its
// callback runs ends with ErrLeaseLost (its ctx too), OnStoppedLeading
// sees it, and Run wins the next term.
func TestRunCampaignsAgainAfterLoss(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDB(t)
	c := newCandidate(t, db.Pool, "again", "a", &leasetable.Config{TTL: 300 * time.Millisecond}, nil)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	started := make(chan *leader.Term, 2)
	stopped := make(chan error, 2)
	causes := make(chan error, 2)
	done := make(chan error, 1)
	go func() {
		done <- c.e.Run(ctx, leader.Callbacks{
			OnStartedLeading: func(ctx context.Context, term *leader.Term) {
				started <- term
				<-ctx.Done()
				causes <- context.Cause(ctx)
			},
			OnStoppedLeading: func(term *leader.Term) { stopped <- term.Err() },
		})
	}()
	first := <-started
	_, err := c.locker.ForceRelease(t.Context(), "again", "test")
	require.NoError(t, err)
	require.ErrorIs(t, <-causes, pgfence.ErrLeaseLost)
	require.ErrorIs(t, <-stopped, pgfence.ErrLeaseLost)
	second := <-started
	require.Greater(t, second.Token(), first.Token())
	cancel()
	require.ErrorIs(t, <-causes, context.Canceled)
	require.ErrorIs(t, <-stopped, pgfence.ErrNotHeld, "Run resigned the term when its ctx ended")
	require.ErrorIs(t, <-done, context.Canceled)
}
