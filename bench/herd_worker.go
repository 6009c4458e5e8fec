package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence"
	"github.com/pgfence/pgfence/advisory"
	"github.com/pgfence/pgfence/leasetable"
)

// Scenario 11's worker processes. The benchmark starts its own binary
// again (os.Executable: the built binary under `go run .`, the test binary
// under `go test`, whose TestMain dispatches the same way) with
// herdWorkerEnv set to "herd". The protocol, one JSON value or word per
// line:
//
//	parent → stdin:  herdJob, later "go"
//	worker → stdout: {"ready":true} once its Lockers are open (or {"error":...}),
//	                 then herdWorkerResult once its run has ended
//
// The worker exits by itself after writing its result, at the job's
// deadline whatever it is doing, and as soon as its stdin closes (the
// benchmark ended or died); on Linux it is also killed with its parent
// (its parent-death signal, internal/sysproc).

// herdWorkerEnv selects the worker mode of the bench binary.
const herdWorkerEnv = "PGFENCE_BENCH_WORKER"

// herdJob is a worker's part of one point.
type herdJob struct {
	Strategy string `json:"strategy"` // "leasetable" or "advisory"
	URL      string `json:"url"`
	Lockers  int    `json:"lockers"`   // Lockers this process opens, each on a pool of its own
	Prefix   string `json:"prefix"`    // lock names are Prefix + name index
	Names    int    `json:"names"`     // names of the point (slots of the counters file)
	Counters string `json:"counters"`  // the shared counters file (herdCounters)
	Process  int    `json:"process"`   // this worker's index
	Procs    int    `json:"processes"` // the point's worker processes
	// Roles are the waiter goroutines of this process.
	Roles []herdRole      `json:"roles"`
	Hold  time.Duration   `json:"hold"`
	Run   time.Duration   `json:"run"`      // from "go" until the goroutines stop queueing
	Hard  int64           `json:"deadline"` // UnixNano: the worker exits by then
	Opts  *herdLockerOpts `json:"opts,omitempty"`
	// Trace asks for the lock and unlock statements' times
	// (herd_stages.go).
	Trace bool `json:"trace,omitempty"`
}

// herdLockerOpts are Config fields a job may set; zero values keep the
// strategies' defaults, which scenario 11 measures.
type herdLockerOpts struct {
	PoolConns int `json:"pool_conns,omitempty"`
}

// herdRole is one waiter goroutine: its id across the point, the index of
// the name it waits for, and which of the process's Lockers it uses.
type herdRole struct {
	ID     int `json:"g"`
	Name   int `json:"n"`
	Locker int `json:"l"`
}

// herdHold is one hold of a lock, as wall-clock UnixNano times: when the
// goroutine called Acquire, when Acquire returned, and when it started to
// release; and the fencing token.
type herdHold struct {
	G, N      int
	Wait, Acq int64
	Rel       int64
	Token     int64
}

// MarshalJSON writes a hold as a compact array.
func (h herdHold) MarshalJSON() ([]byte, error) {
	return json.Marshal([6]int64{int64(h.G), int64(h.N), h.Wait, h.Acq, h.Rel, h.Token})
}

// UnmarshalJSON reads the array MarshalJSON writes.
func (h *herdHold) UnmarshalJSON(b []byte) error {
	var a [6]int64
	if err := json.Unmarshal(b, &a); err != nil {
		return err
	}
	*h = herdHold{G: int(a[0]), N: int(a[1]), Wait: a[2], Acq: a[3], Rel: a[4], Token: a[5]}
	return nil
}

// herdWorkerResult is what a worker reports at the end of its run.
type herdWorkerResult struct {
	Ready    bool       `json:"ready,omitempty"`
	Error    string     `json:"error,omitempty"` // the worker could not run
	Holds    []herdHold `json:"holds,omitempty"`
	Stmts    []herdStmt `json:"stmts,omitempty"` // with herdJob.Trace
	Errors   int64      `json:"errors"`
	FirstErr string     `json:"first_err,omitempty"`
	// CPU of the whole process from "go" until its run ended (getrusage).
	UserCPU time.Duration `json:"user_cpu"`
	SysCPU  time.Duration `json:"sys_cpu"`
}

// herdWorkerMain is the worker mode's main; it returns the exit code.
func herdWorkerMain() int {
	out := json.NewEncoder(os.Stdout)
	in := bufio.NewReader(os.Stdin)
	fail := func(err error) int {
		_ = out.Encode(herdWorkerResult{Error: err.Error()})
		return 1
	}
	line, err := in.ReadBytes('\n')
	if err != nil {
		return fail(fmt.Errorf("read job: %w", err))
	}
	var job herdJob
	if err := json.Unmarshal(line, &job); err != nil {
		return fail(fmt.Errorf("job: %w", err))
	}
	hard := time.Unix(0, job.Hard)
	time.AfterFunc(time.Until(hard), func() {
		fmt.Fprintln(os.Stderr, "herd worker: deadline passed, exiting")
		os.Exit(3)
	})
	ctx, cancel := context.WithDeadline(context.Background(), hard)
	defer cancel()
	w, err := openHerdWorker(ctx, &job)
	if err != nil {
		return fail(err)
	}
	defer w.close()
	if err := out.Encode(herdWorkerResult{Ready: true}); err != nil {
		return 1
	}
	word, err := in.ReadString('\n')
	if err != nil || word != "go\n" {
		return 4 // the benchmark gave up before the start
	}
	// From now on stdin only closes: when it does, the benchmark is gone.
	go func() {
		_, _ = io.Copy(io.Discard, in)
		fmt.Fprintln(os.Stderr, "herd worker: stdin closed, exiting")
		os.Exit(4)
	}()
	res := w.run(ctx, &job)
	if err := out.Encode(res); err != nil {
		return 1
	}
	return 0
}

// herdWorker is a worker's Lockers and the shared counters.
type herdWorker struct {
	pools    []*pgxpool.Pool
	lockers  []pgfence.Locker
	counters *herdCounters
	tracer   *stmtTracer // with herdJob.Trace
}

func openHerdWorker(ctx context.Context, job *herdJob) (*herdWorker, error) {
	w := &herdWorker{}
	fail := func(err error) (*herdWorker, error) {
		w.close()
		return nil, err
	}
	if job.Trace {
		w.tracer = &stmtTracer{}
	}
	var err error
	if w.counters, err = mapHerdCounters(job.Counters, job.Names, job.Procs, job.Process); err != nil {
		return fail(err)
	}
	for i := range job.Lockers {
		pool, k, err := openHerdLocker(ctx, job, w.tracer)
		if err != nil {
			return fail(fmt.Errorf("Locker %d: %w", i, err))
		}
		w.pools, w.lockers = append(w.pools, pool), append(w.lockers, k)
		// One acquire+release on a name of its own, so that the
		// Locker's first connections are open before the start.
		l, err := k.TryAcquire(ctx, job.Prefix+"warm-"+strconv.Itoa(os.Getpid())+"-"+strconv.Itoa(i), nil)
		if err != nil {
			return fail(fmt.Errorf("Locker %d: warm-up acquire: %w", i, err))
		}
		if err := l.Release(ctx); err != nil {
			return fail(fmt.Errorf("Locker %d: warm-up release: %w", i, err))
		}
	}
	return w, nil
}

// openHerdLocker opens a pool and a Locker of the job's strategy with the
// default Config, on that pool; tracer, when not nil, traces the pool's
// connections and the advisory Locker's sessions.
func openHerdLocker(ctx context.Context, job *herdJob, tracer *stmtTracer) (*pgxpool.Pool, pgfence.Locker, error) {
	pcfg, err := pgxpool.ParseConfig(job.URL)
	if err != nil {
		return nil, nil, err
	}
	if tracer != nil {
		pcfg.ConnConfig.Tracer = tracer
	}
	switch job.Strategy {
	case "leasetable":
		// Acquires and releases of one Locker are combined into one
		// statement each; a few connections suffice.
		pcfg.MaxConns = 4
	case "advisory":
		// The Locker dials its own sessions; its pool only checks the
		// install in New.
		pcfg.MaxConns = 1
	default:
		return nil, nil, fmt.Errorf("unknown strategy %q", job.Strategy)
	}
	if job.Opts != nil && job.Opts.PoolConns > 0 {
		pcfg.MaxConns = int32(job.Opts.PoolConns)
	}
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return nil, nil, err
	}
	var k pgfence.Locker
	if job.Strategy == "leasetable" {
		k, err = leasetable.New(ctx, pool, nil)
	} else {
		k, err = advisory.New(ctx, pool, nil)
	}
	if err != nil {
		pool.Close()
		return nil, nil, err
	}
	return pool, k, nil
}

func (w *herdWorker) close() {
	for _, k := range w.lockers {
		k.Close()
	}
	for _, p := range w.pools {
		p.Close()
	}
	if w.counters != nil {
		w.counters.close()
	}
}

// run runs the job's goroutines: each waits in Acquire on its name, holds
// the lock for job.Hold and until another goroutine (of any process) waits
// in Acquire for the name, releases it, then waits until another goroutine
// took the name before it queues again (herdCounters). Acquires still
// waiting when job.Run has passed are cancelled, and holds end without
// waiting then.
func (w *herdWorker) run(ctx context.Context, job *herdJob) herdWorkerResult {
	u0, s0 := processCPU()
	end := time.Now().Add(job.Run)
	runCtx, cancel := context.WithDeadline(ctx, end)
	defer cancel()
	var (
		mu  sync.Mutex
		res herdWorkerResult
		wg  sync.WaitGroup
	)
	for _, role := range job.Roles {
		wg.Add(1)
		go func() {
			defer wg.Done()
			k := w.lockers[role.Locker]
			name := job.Prefix + strconv.Itoa(role.Name)
			var holds []herdHold
			var errs int64
			var firstErr error
			fail := func(err error) {
				errs++
				if firstErr == nil {
					firstErr = err
				}
			}
			for runCtx.Err() == nil {
				// Wait is read before entering, so that a holder that
				// saw this goroutine in Acquire releases after Wait.
				wait := time.Now().UnixNano()
				w.counters.enter(role.Name)
				l, err := k.Acquire(runCtx, name, nil)
				acq := time.Now().UnixNano()
				w.counters.leave(role.Name)
				if err != nil {
					if runCtx.Err() == nil {
						fail(err)
						time.Sleep(10 * time.Millisecond) // do not spin on a broken server
					}
					continue
				}
				seen := w.counters.taken(role.Name)
				time.Sleep(job.Hold)
				w.counters.waitQueued(role.Name, runCtx.Done())
				rel := time.Now().UnixNano()
				relCtx, relCancel := context.WithTimeout(ctx, 10*time.Second)
				err = l.Release(relCtx)
				relCancel()
				holds = append(holds, herdHold{G: role.ID, N: role.Name, Wait: wait, Acq: acq, Rel: rel, Token: l.Token()})
				if err != nil {
					fail(fmt.Errorf("release: %w", err))
				}
				w.counters.waitMoved(role.Name, seen, runCtx.Done())
			}
			mu.Lock()
			defer mu.Unlock()
			res.Holds = append(res.Holds, holds...)
			res.Errors += errs
			if firstErr != nil && res.FirstErr == "" {
				res.FirstErr = firstErr.Error()
			}
		}()
	}
	wg.Wait()
	u1, s1 := processCPU()
	res.UserCPU, res.SysCPU = u1-u0, s1-s0
	res.Stmts = w.tracer.take()
	return res
}
