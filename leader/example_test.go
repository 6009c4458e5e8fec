package leader_test

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence/fence"
	"github.com/pgfence/pgfence/leader"
	"github.com/pgfence/pgfence/leasetable"
)

// must panics on err, to keep the Examples short.
func must(err error) {
	if err != nil {
		panic(err)
	}
}

// A singleton worker among three replicas of a service: they elect one
// to run the outbox relay, which must run in one place only, and each
// proclaims its address so that the others know where the leader is.
// When the leader shuts down, another replica takes over at once.
func Example() {
	databaseURL, drop := exampleDatabase() // a database with pgfence's migrations applied
	defer drop()
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	pool, err := pgxpool.New(ctx, databaseURL)
	must(err)
	defer pool.Close()
	_, err = pool.Exec(ctx, `CREATE TABLE relay (
		id int PRIMARY KEY, batches int NOT NULL, fence_token bigint NOT NULL DEFAULT 0);
		INSERT INTO relay VALUES (1, 0)`)
	must(err)
	// The leader's work, fenced with the term's token and checked against
	// the election's lease: rejected once the term has ended.
	relayBatch := fence.Update("relay").Set("batches = batches + 1").Where("id = 1")
	ran := make(chan int64, 1000) // the token of each batch, for this example to follow

	replicas := map[string]*leader.Elector{}
	var wg sync.WaitGroup
	for _, addr := range []string{"10.0.0.1:8080", "10.0.0.2:8080", "10.0.0.3:8080"} {
		// Each replica (each process) has its own Locker and Elector.
		locker, err := leasetable.New(ctx, pool, nil)
		must(err)
		defer locker.Close()
		e, err := leader.New(ctx, pool, &leader.Config{Locker: locker, Election: "outbox-relay", Value: addr})
		must(err)
		defer e.Close()
		replicas[addr] = e
		wg.Add(1)
		go func() {
			defer wg.Done()
			_ = e.Run(ctx, leader.Callbacks{
				OnStartedLeading: func(ctx context.Context, t *leader.Term) {
					// The singleton work, until the term ends. A leader
					// whose term ended without its noticing (a pause)
					// cannot write after its successor.
					for ctx.Err() == nil {
						if _, err := relayBatch.UnderLease("outbox-relay", t.Lease().Secret()).Exec(ctx, pool, t.Token()); err != nil {
							return
						}
						select {
						case ran <- t.Token():
						default:
						}
						time.Sleep(10 * time.Millisecond)
					}
				},
			})
		}()
	}

	// Any replica can tell who leads.
	first := leaderAfter(ctx, replicas["10.0.0.1:8080"], 0)
	fmt.Println("elected a leader:", first.Value != "")
	waitFor(ran, first.Token)

	// The leader shuts down: Close resigns, and another replica leads.
	replicas[first.Value].Close()
	delete(replicas, first.Value)
	var follower *leader.Elector
	for _, e := range replicas {
		follower = e
	}
	second := leaderAfter(ctx, follower, first.Token)
	fmt.Println("another replica took over:", second.Value != first.Value, second.Token > first.Token)
	waitFor(ran, second.Token)

	stop()
	wg.Wait()
	var batches int
	must(pool.QueryRow(context.Background(), "SELECT batches FROM relay").Scan(&batches))
	fmt.Println("relay batches ran under both leaders:", batches >= 2)
	// Output:
	// elected a leader: true
	// another replica took over: true true
	// relay batches ran under both leaders: true
}

// waitFor waits until a batch with token ran.
func waitFor(ran <-chan int64, token int64) {
	for t := range ran {
		if t == token {
			return
		}
	}
}

// leaderAfter waits until e observes a proclaimed term newer than token.
func leaderAfter(ctx context.Context, e *leader.Elector, token int64) leader.TermInfo {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	for info := range e.Observe(ctx) {
		if info.Leading && info.Proclaimed && info.Token > token {
			return info
		}
	}
	panic("no leader observed")
}

// Campaign and Resign by hand: one term, its fenced writes, and the
// hand-over to the candidate waiting in Campaign.
func ExampleElector_Campaign() {
	databaseURL, drop := exampleDatabase()
	defer drop()
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, databaseURL)
	must(err)
	defer pool.Close()
	var closers []func()
	defer func() {
		for _, c := range closers {
			c()
		}
	}()

	newElector := func(addr string) *leader.Elector {
		locker, err := leasetable.New(ctx, pool, nil) // one per process
		must(err)
		e, err := leader.New(ctx, pool, &leader.Config{Locker: locker, Election: "scheduler", Value: addr})
		must(err)
		closers = append(closers, e.Close, locker.Close)
		return e
	}
	a, b := newElector("10.0.0.1:8080"), newElector("10.0.0.2:8080")

	term, err := a.Campaign(ctx)
	must(err)
	info, err := b.Leader(ctx)
	must(err)
	fmt.Println("leader:", info.Value, "token is the term's:", info.Token == term.Token())

	next := make(chan *leader.Term)
	go func() {
		t, err := b.Campaign(ctx) // waits while a leads
		must(err)
		next <- t
	}()
	must(term.Resign(ctx)) // hands over at once
	fmt.Println("a's term ended:", term.Context().Err() != nil)
	t := <-next
	fmt.Println("b leads, with a newer token:", t.Value(), t.Token() > term.Token())
	must(t.Resign(ctx))
	// Output:
	// leader: 10.0.0.1:8080 token is the term's: true
	// a's term ended: true
	// b leads, with a newer token: 10.0.0.2:8080 true
}
