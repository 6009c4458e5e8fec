package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence/bench/internal/harness"
	"github.com/pgfence/pgfence/bench/internal/systems"
	"github.com/pgfence/pgfence/leasetable"
)

// Scenario 14: pgfence beside a NOTIFY-heavy neighbour. Every committing
// transaction with a pending NOTIFY holds one cluster-wide lock through its
// commit (WAL flush included), so notifying transactions of every
// application on the server run one at a time. The "before" arm makes
// pgfence_notify_waiters notify whether or not anyone waits (what schema
// version 1's releases did); "after" is migration 000002 as installed.

// neighbourClients is how many connections of the neighbour commit, each
// an INSERT and a pg_notify in one durable transaction, in a loop (as a
// job queue that notifies its workers does).
const neighbourClients = 4

// neighbourPgfenceClients is how many clients run pgfence's uncontended
// acquire+release cycles, each on its own name.
const neighbourPgfenceClients = 4

// neighbourCycles is how many uncontended cycles are counted for the
// notifications they send.
const neighbourCycles = 1000

// neighbourArms are the release versions compared.
var neighbourArms = []string{"before", "after"}

// neighbourPoint is one measurement of scenario 16.
type neighbourPoint struct {
	Arm              string  // before or after
	NotesPer1000     float64 // notifications per 1,000 uncontended cycles
	PgfenceAlone     float64 // cycles/s without the neighbour
	PgfenceBeside    float64 // cycles/s with the neighbour committing
	NeighbourAlone   float64 // neighbour commits/s without pgfence
	NeighbourBeside  float64 // neighbour commits/s with pgfence cycling
	HandoverAlone    time.Duration
	HandoverBeside   time.Duration
	HandoverAloneN   int
	HandoverBesideN  int
	HandoverErrors   int64
	NeighbourErrors  int64
	NeighbourFirstEr string
}

// notifyWaitersSQL reads the installed pgfence_notify_waiters.
const notifyWaitersSQL = `SELECT pg_catalog.pg_get_functiondef('pgfence.pgfence_notify_waiters(pg_catalog.text, pg_catalog.int8)'::pg_catalog.regprocedure)`

// neighbour is scenario 16.
func (r *runner) neighbour(ctx context.Context) error {
	fmt.Printf("scenario 16: pgfence beside a NOTIFY-heavy neighbour (%d connections), releases that always notify (before) and only to waiters (after), %v per point\n",
		neighbourClients, r.cfg.Duration)
	owner, err := pgx.Connect(ctx, r.env.DatabaseURL)
	if err != nil {
		return err
	}
	defer owner.Close(context.WithoutCancel(ctx))
	var after string
	if err := owner.QueryRow(ctx, notifyWaitersSQL).Scan(&after); err != nil {
		return fmt.Errorf("read pgfence_notify_waiters (schema version 2 needed): %w", err)
	}
	before := strings.Replace(after, "IF pg_catalog.pg_try_advisory_xact_lock(", "IF false AND pg_catalog.pg_try_advisory_xact_lock(", 1)
	if before == after {
		return errors.New("pgfence_notify_waiters has no interest test to switch off")
	}
	defer func() { _, _ = owner.Exec(context.WithoutCancel(ctx), after) }()
	if _, err := owner.Exec(ctx, `CREATE TABLE IF NOT EXISTS s14_neighbour (id bigserial PRIMARY KEY, v int8 NOT NULL)`); err != nil {
		return err
	}
	for round := 1; round <= r.cfg.Rounds; round++ {
		for _, arm := range neighbourArms {
			def := map[string]string{"before": before, "after": after}[arm]
			if _, err := owner.Exec(ctx, def); err != nil {
				return err
			}
			p, err := r.neighbourPoint(ctx, arm)
			if err != nil {
				return fmt.Errorf("%s: %w", arm, err)
			}
			fmt.Printf("  [14] %-6s notifications/1000 uncontended cycles=%-6.0f pgfence %5.0f -> %5.0f cycles/s beside the neighbour; neighbour %5.0f -> %5.0f commits/s beside pgfence; hand-over p50 %v -> %v (n=%d/%d)\n",
				arm, p.NotesPer1000, p.PgfenceAlone, p.PgfenceBeside, p.NeighbourAlone, p.NeighbourBeside,
				p.HandoverAlone.Round(time.Microsecond), p.HandoverBeside.Round(time.Microsecond), p.HandoverAloneN, p.HandoverBesideN)
			if p.HandoverErrors > 0 || p.NeighbourErrors > 0 {
				r.note("14 %s: %d hand-over errors, %d neighbour errors (first: %v)", arm, p.HandoverErrors, p.NeighbourErrors, p.NeighbourFirstEr)
			}
			r.res.Neighbour = append(r.res.Neighbour, p)
		}
	}
	return nil
}

func (r *runner) neighbourPoint(ctx context.Context, arm string) (neighbourPoint, error) {
	p := neighbourPoint{Arm: arm}
	n, err := r.countReleaseNotes(ctx)
	if err != nil {
		return p, err
	}
	p.NotesPer1000 = float64(n) * 1000 / neighbourCycles

	cycles := func(ctx context.Context) (float64, error) {
		ns := names("s14-", neighbourPgfenceClients)
		sys, err := r.open(ctx, systems.Leasetable, neighbourPgfenceClients, ns)
		if err != nil {
			return 0, err
		}
		defer sys.Close()
		res := harness.RunCycles(ctx, sys, harness.CycleConfig{Clients: neighbourPgfenceClients, Warmup: r.cfg.Warmup, Duration: r.cfg.Duration,
			Name: func(w, _ int) string { return ns[w] }})
		if res.FirstErr != nil {
			return 0, res.FirstErr
		}
		return res.Throughput(), nil
	}
	handover := func(ctx context.Context) (harness.HandoverResult, error) {
		sys, err := r.open(ctx, systems.Leasetable, 3, []string{"s14-h"})
		if err != nil {
			return harness.HandoverResult{}, err
		}
		defer sys.Close()
		return harness.RunHandover(ctx, sys.(harness.Waiter), harness.HandoverConfig{Waiters: 1, Name: "s14-h", Hold: r.cfg.HoldShort,
			Duration: r.cfg.Duration + r.cfg.Warmup, MinHandovers: r.cfg.HandoversMin, Timeout: r.cfg.LongDuration}), nil
	}

	if p.PgfenceAlone, err = cycles(ctx); err != nil {
		return p, err
	}
	h, err := handover(ctx)
	if err != nil {
		return p, err
	}
	p.HandoverAlone, p.HandoverAloneN, p.HandoverErrors = h.Latency.P50, h.Latency.N, h.Errors
	nb, err := r.runNeighbour(ctx, r.cfg.Warmup+r.cfg.Duration, nil)
	if err != nil {
		return p, err
	}
	p.NeighbourAlone = nb.rate

	var pg float64
	var pgErr error
	nb, err = r.runNeighbour(ctx, r.cfg.Warmup+r.cfg.Duration, func(ctx context.Context) { pg, pgErr = cycles(ctx) })
	if err != nil {
		return p, err
	}
	if pgErr != nil {
		return p, pgErr
	}
	p.PgfenceBeside, p.NeighbourBeside, p.NeighbourErrors = pg, nb.rate, nb.errors
	if nb.firstErr != nil {
		p.NeighbourFirstEr = nb.firstErr.Error()
	}
	var hErr error
	_, err = r.runNeighbour(ctx, r.cfg.Warmup+r.cfg.Duration, func(ctx context.Context) { h, hErr = handover(ctx) })
	if err != nil {
		return p, err
	}
	if hErr != nil {
		return p, hErr
	}
	p.HandoverBeside, p.HandoverBesideN, p.HandoverErrors = h.Latency.P50, h.Latency.N, p.HandoverErrors+h.Errors
	return p, nil
}

// countReleaseNotes runs neighbourCycles uncontended acquire+release
// cycles of one leasetable.Locker and returns how many notifications they
// sent on leasetable.NotifyChannel (a LISTEN session counts them up to a
// marker of its own; LISTEN probes are not counted).
func (r *runner) countReleaseNotes(ctx context.Context) (int, error) {
	listen, err := pgx.Connect(ctx, r.env.DatabaseURL)
	if err != nil {
		return 0, err
	}
	defer listen.Close(context.WithoutCancel(ctx))
	if _, err := listen.Exec(ctx, "LISTEN "+leasetable.NotifyChannel); err != nil {
		return 0, err
	}
	pool, err := pgxpool.New(ctx, r.env.AppURL())
	if err != nil {
		return 0, err
	}
	defer pool.Close()
	k, err := leasetable.New(ctx, pool, nil)
	if err != nil {
		return 0, err
	}
	defer k.Close()
	for i := range neighbourCycles {
		l, err := k.TryAcquire(ctx, fmt.Sprintf("s14-count-%d", i%10), nil)
		if err != nil {
			return 0, err
		}
		if err := l.Release(ctx); err != nil {
			return 0, err
		}
	}
	const marker = "s14-marker"
	if _, err := pool.Exec(ctx, "SELECT pg_catalog.pg_notify($1, $2)", leasetable.NotifyChannel, marker); err != nil {
		return 0, err
	}
	n := 0
	for {
		msg, err := listen.WaitForNotification(ctx)
		if err != nil {
			return 0, err
		}
		switch {
		case msg.Payload == marker:
			return n, nil
		case !strings.HasPrefix(msg.Payload, "\x1fpgfence-listen-probe "):
			n++
		}
	}
}

// neighbourRun is what runNeighbour measured.
type neighbourRun struct {
	rate     float64 // commits/s
	errors   int64
	firstErr error
}

// neighbourSQL commits a row and a notification in one durable
// transaction.
const neighbourSQL = `WITH i AS (INSERT INTO s14_neighbour (v) VALUES ($1) RETURNING id) SELECT pg_catalog.pg_notify('s14_neighbour', i.id::pg_catalog.text) FROM i`

// runNeighbour runs the neighbour for d (its listener draining the queue)
// and, when beside is set, beside for the same time; it returns the
// neighbour's rate over d.
func (r *runner) runNeighbour(ctx context.Context, d time.Duration, beside func(context.Context)) (neighbourRun, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	listen, err := pgx.Connect(ctx, r.env.DatabaseURL)
	if err != nil {
		return neighbourRun{}, err
	}
	defer listen.Close(context.WithoutCancel(ctx))
	if _, err := listen.Exec(ctx, "LISTEN s14_neighbour"); err != nil {
		return neighbourRun{}, err
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { // drains the queue
		defer wg.Done()
		for ctx.Err() == nil {
			if _, err := listen.WaitForNotification(ctx); err != nil {
				return
			}
		}
	}()
	pool, err := pgxpool.New(ctx, r.env.DatabaseURL)
	if err != nil {
		return neighbourRun{}, err
	}
	defer pool.Close()
	var commits, errs atomic.Int64
	var firstErr atomic.Value
	stop := make(chan struct{})
	for c := range neighbourClients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := int64(0); ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				if _, err := pool.Exec(ctx, neighbourSQL, int64(c)<<32|i); err != nil {
					if ctx.Err() != nil {
						return
					}
					if errs.Add(1) == 1 {
						firstErr.Store(err)
					}
					continue
				}
				commits.Add(1)
			}
		}()
	}
	var besideDone chan struct{}
	if beside != nil {
		besideDone = make(chan struct{})
		go func() { defer close(besideDone); beside(ctx) }()
	}
	start := time.Now()
	before := commits.Load()
	timer := time.NewTimer(d)
	select {
	case <-timer.C:
	case <-ctx.Done():
		timer.Stop()
	}
	got := commits.Load() - before
	elapsed := time.Since(start)
	if besideDone != nil {
		<-besideDone // ends at its own bound, d
	}
	close(stop)
	cancel()
	wg.Wait()
	out := neighbourRun{rate: float64(got) / elapsed.Seconds(), errors: errs.Load()}
	if e, ok := firstErr.Load().(error); ok {
		out.firstErr = e
	}
	return out, nil
}
