package leader_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence"
	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/leader"
)

// started is one term begun in a hand-over test: who won it, and the
// channel that makes its leader resign.
type started struct {
	who    int
	term   *leader.Term
	resign chan struct{}
}

// handoverResult counts the terms after each resignation of a hand-over
// test: taken by another candidate (with the time from the resignation to
// the next term's start), or won back by the resigner.
type handoverResult struct {
	handovers, winBacks int
	times               []time.Duration
}

// resignRounds runs three candidates of one election, each in its own
// Locker (three processes): one leads, two wait. The leader resigns,
// rounds times or until the first win-back when stopAtWinBack, and the
// next term is counted. With run, each candidate is in Elector.Run and
// resigns by returning from OnStartedLeading; otherwise each runs a
// hand-written loop of Campaign and Term.Resign without a pause. With
// noHandover, the candidates campaign again at once after resigning.
func resignRounds(t *testing.T, rounds int, run, noHandover, stopAtWinBack bool) handoverResult {
	t.Helper()
	db := pgtest.NewDB(t)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	terms := make(chan started)
	begin := func(ctx context.Context, who int, term *leader.Term) <-chan struct{} {
		s := started{who: who, term: term, resign: make(chan struct{})}
		select {
		case terms <- s:
		case <-ctx.Done():
		}
		return s.resign
	}
	var cands []candidate
	done := make(chan struct{}, 3)
	for i := range 3 {
		c := newCandidate(t, db.Pool, "handover", fmt.Sprint(i), nil, nil)
		if noHandover {
			leader.DisableHandover(c.e)
		}
		cands = append(cands, c)
		go func() {
			defer func() { done <- struct{}{} }()
			if run {
				_ = c.e.Run(ctx, leader.Callbacks{OnStartedLeading: func(ctx context.Context, term *leader.Term) {
					select {
					case <-begin(ctx, i, term):
					case <-ctx.Done():
					}
				}})
				return
			}
			for {
				term, err := c.e.Campaign(ctx)
				if err != nil {
					return
				}
				select {
				case <-begin(ctx, i, term):
				case <-ctx.Done():
				}
				_ = term.Resign(ctx)
			}
		}()
	}
	defer func() {
		cancel()
		for range cands {
			<-done
		}
	}()
	next := func() started {
		select {
		case s := <-terms:
			return s
		case <-ctx.Done():
			t.Fatal("no next term")
			return started{}
		}
	}
	cur := next()
	// Both followers wait in Acquire, woken through their Lockers' LISTEN
	// connections.
	require.Eventually(t, func() bool {
		for i, c := range cands {
			if s := c.locker.Stats(); i != cur.who && (s.Waiting != 1 || !s.Listening) {
				return false
			}
		}
		return true
	}, 10*time.Second, time.Millisecond)
	var r handoverResult
	for range rounds {
		begun := time.Now()
		close(cur.resign)
		s := next()
		require.Greater(t, s.term.Token(), cur.term.Token())
		wonBack := s.who == cur.who
		if wonBack {
			r.winBacks++
		} else {
			r.handovers++
			r.times = append(r.times, time.Since(begun))
		}
		cur = s
		if wonBack && stopAtWinBack {
			break
		}
	}
	close(cur.resign)
	return r
}

func (r handoverResult) p50() time.Duration {
	if len(r.times) == 0 {
		return 0
	}
	ds := slices.Clone(r.times)
	slices.Sort(ds)
	return ds[len(ds)/2]
}

// A resigning leader leaves the next term to a waiting candidate: with
// Run (the callback returns) and with Campaign and Resign by hand.
func TestResignHandsOver(t *testing.T) {
	t.Parallel()
	for _, run := range []bool{true, false} {
		name := "campaign-resign"
		if run {
			name = "run"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			r := resignRounds(t, 100, run, false, false)
			t.Logf("%d of 100 resignations handed over, %d won back; resignation to the next term's start: p50 %v",
				r.handovers, r.winBacks, r.p50())
			require.GreaterOrEqual(t, r.handovers, 99)
		})
	}
}

// Negative control: without the hand-over's wait, the resigner races its
// followers for the next term and wins it back.
func TestResignHandsOverControl(t *testing.T) {
	t.Parallel()
	for _, run := range []bool{true, false} {
		name := "campaign-resign"
		if run {
			name = "run"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			r := resignRounds(t, 100, run, true, true)
			t.Logf("first win-back after %d hand-overs", r.handovers)
			require.Equal(t, 1, r.winBacks)
		})
	}
}

// A lone candidate that resigned leads again once HandoverTimeout has
// passed with nobody taking over.
func TestResignAloneCampaignsAgain(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDB(t)
	a := newCandidate(t, db.Pool, "alone", "a", nil, func(c *leader.Config) { c.HandoverTimeout = 50 * time.Millisecond })
	first, err := a.e.Campaign(t.Context())
	require.NoError(t, err)
	resigned := time.Now()
	require.NoError(t, first.Resign(t.Context()))
	second, err := a.e.Campaign(t.Context())
	require.NoError(t, err)
	require.GreaterOrEqual(t, time.Since(resigned), 50*time.Millisecond, "campaigned before the hand-over's bound")
	require.Greater(t, second.Token(), first.Token())
	require.NoError(t, second.Resign(t.Context()))

	_, err = leader.New(t.Context(), db.Pool, &leader.Config{Locker: a.locker, Election: "alone", HandoverTimeout: -time.Second})
	require.ErrorContains(t, err, "Config.HandoverTimeout")
}

// StepAside hands over and keeps the Elector out of the election for its
// period, even while nobody else leads; a later StepAside(0) ends it.
func TestStepAside(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	db := pgtest.NewDB(t)
	// A short hand-over bound, so that only the period holds a back.
	a := newCandidate(t, db.Pool, "aside", "a", nil, func(c *leader.Config) { c.HandoverTimeout = 10 * time.Millisecond })
	b := newCandidate(t, db.Pool, "aside", "b", nil, nil)
	ta, err := a.e.Campaign(ctx)
	require.NoError(t, err)
	wonB := make(chan *leader.Term, 1)
	go func() {
		tb, err := b.e.Campaign(ctx)
		if err != nil {
			t.Error(err)
		}
		wonB <- tb
	}()
	const period = 300 * time.Millisecond
	asideAt := time.Now()
	require.NoError(t, a.e.StepAside(ctx, period))
	require.ErrorIs(t, ta.Err(), pgfence.ErrNotHeld)
	tb := <-wonB
	require.NotNil(t, tb)
	require.Greater(t, tb.Token(), ta.Token())

	// b resigns; a does not campaign before its period ends, though the
	// election is free.
	wonA := make(chan *leader.Term, 1)
	go func() {
		t2, err := a.e.Campaign(ctx)
		if err != nil {
			t.Error(err)
		}
		wonA <- t2
	}()
	require.NoError(t, tb.Resign(ctx))
	ta2 := <-wonA
	require.NotNil(t, ta2)
	require.GreaterOrEqual(t, time.Since(asideAt), period, "led while stepping aside")
	require.Greater(t, ta2.Token(), tb.Token())

	// A long period holds a Campaign back until ctx ends; StepAside(0)
	// ends the period.
	require.NoError(t, a.e.StepAside(ctx, time.Hour))
	info, err := a.e.Leader(ctx)
	require.NoError(t, err)
	require.False(t, info.Leading, "resigned")
	wctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	_, err = a.e.Campaign(wctx)
	cancel()
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.NoError(t, a.e.StepAside(ctx, 0))
	ta3, err := a.e.Campaign(ctx)
	require.NoError(t, err)
	require.NoError(t, ta3.Resign(ctx))

	a.e.Close()
	require.ErrorIs(t, a.e.StepAside(ctx, time.Second), pgfence.ErrClosed)
}
