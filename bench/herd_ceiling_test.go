package main

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestChainTurns: a player's waits end when the other queues or takes,
// and every wait ends when the run's context does.
func TestChainTurns(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	turns := newChainTurns(ctx)

	queued := make(chan struct{})
	go func() { turns.waitQueued(1); close(queued) }()
	select {
	case <-queued:
		t.Fatal("waitQueued returned before player 1 queued")
	case <-time.After(50 * time.Millisecond):
	}
	turns.queue(1)
	<-queued

	n := turns.take(1)
	require.Equal(t, int64(1), n)
	taken := make(chan struct{})
	go func() { turns.waitTaken(n); close(taken) }()
	select {
	case <-taken:
		t.Fatal("waitTaken returned before another acquisition")
	case <-time.After(50 * time.Millisecond):
	}
	require.Equal(t, int64(2), turns.take(0))
	<-taken

	// Player 1 took last and has not queued again: this wait lasts until
	// the run ends.
	ended := make(chan struct{})
	go func() { turns.waitQueued(1); turns.waitTaken(2); close(ended) }()
	cancel()
	<-ended
}
