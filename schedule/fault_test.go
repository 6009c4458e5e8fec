package schedule_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence"
	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/leasetable"
	"github.com/pgfence/pgfence/schedule"
)

// The holder subprocess: it runs slot envSlot of job "faulty" on database
// envURL, says "inside" once its write is made, waits for a line on stdin,
// and exits 0 when the slot was recorded done, 3 when its lease was lost,
// 1 otherwise. With envPlain it takes the plain lease instead, and writes
// after the line, unfenced: the negative control.
const (
	envHelper = "PGFENCE_SCHEDULE_HELPER"
	envURL    = "PGFENCE_SCHEDULE_URL"
	envSlot   = "PGFENCE_SCHEDULE_SLOT"
	envPlain  = "PGFENCE_SCHEDULE_PLAIN"
)

const helperTTL = time.Second

func helperMain() int {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv(envURL))
	if err != nil {
		fmt.Println("result:", err)
		return 1
	}
	defer pool.Close()
	locker, err := leasetable.New(ctx, pool, &leasetable.Config{TTL: helperTTL, Owner: "helper"})
	if err != nil {
		fmt.Println("result:", err)
		return 1
	}
	defer locker.Close()
	wait := func() { _, _ = bufio.NewReader(os.Stdin).ReadString('\n') }
	slot := os.Getenv(envSlot)
	if os.Getenv(envPlain) != "" {
		err = locker.Do(ctx, schedule.LeasePrefix+"faulty", nil, func(context.Context, pgfence.Lease) error {
			fmt.Println("inside")
			wait()
			_, err := pool.Exec(ctx, `INSERT INTO effects (slot, who) VALUES ($1, 'helper')`, slot)
			return err
		})
	} else {
		r, _ := schedule.New(pool, &schedule.Config{Locker: locker})
		err = r.RunTx(ctx, "faulty", slot, nil, func(ctx context.Context, tx pgx.Tx, s *schedule.Slot) error {
			if err := insertEffect(ctx, tx, s, "helper"); err != nil {
				return err
			}
			fmt.Println("inside")
			wait() // paused or killed here; its lease's ctx is ignored, as a zombie's would be
			return nil
		})
	}
	fmt.Println("result:", err)
	switch {
	case err == nil:
		return 0
	case errors.Is(err, pgfence.ErrLeaseLost):
		return 3
	}
	return 1
}

// holder is a running holder subprocess.
type holder struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	out   *bufio.Reader
}

func startHolder(t *testing.T, url, slot string, plain bool) *holder {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), envHelper+"=1", envURL+"="+url, envSlot+"="+slot)
	if plain {
		cmd.Env = append(cmd.Env, envPlain+"=1")
	}
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	require.NoError(t, err)
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	h := &holder{cmd: cmd, stdin: stdin, out: bufio.NewReader(stdout)}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	line, err := h.out.ReadString('\n')
	require.NoError(t, err)
	require.Equal(t, "inside\n", line)
	return h
}

// finish lets the holder go on and returns its last line and exit status.
func (h *holder) finish(t *testing.T) (string, int) {
	t.Helper()
	_, err := io.WriteString(h.stdin, "go\n")
	require.NoError(t, err)
	rest, _ := io.ReadAll(h.out)
	_ = h.cmd.Wait()
	return strings.TrimSpace(string(rest)), h.cmd.ProcessState.ExitCode()
}

func faultDB(t *testing.T) *pgtest.DB {
	db := pgtest.NewDB(t)
	_, err := db.Pool.Exec(context.Background(), effectsDDL)
	require.NoError(t, err)
	return db
}

func record(t *testing.T, r *replica, job, slot string) schedule.Record {
	t.Helper()
	recs, err := r.runner.History(context.Background(), job, 1000)
	require.NoError(t, err)
	for _, rec := range recs {
		if rec.Slot == slot {
			return rec
		}
	}
	t.Fatalf("no record of slot %s", slot)
	return schedule.Record{}
}

// TestHolderKilledMidJob: the holder is killed (SIGKILL) inside its job;
// another replica runs the slot again after the lease's TTL, and the slot
// is done once, with the dead holder's write gone with its transaction.
func TestHolderKilledMidJob(t *testing.T) {
	t.Parallel()
	db := faultDB(t)
	h := startHolder(t, db.URL, "s1", false)
	require.NoError(t, h.cmd.Process.Signal(syscall.SIGKILL))
	_ = h.cmd.Wait()

	b := newReplica(t, db, "b", 5*time.Second)
	require.NoError(t, b.runner.RunTx(context.Background(), "faulty", "s1", nil, func(ctx context.Context, tx pgx.Tx, s *schedule.Slot) error {
		return insertEffect(ctx, tx, s, "b")
	}))
	require.Equal(t, map[string]int{"s1": 1}, effects(t, db.Pool))
	rec := record(t, b, "faulty", "s1")
	require.Equal(t, "done", rec.State)
	require.Equal(t, "b", rec.Owner)
	require.Equal(t, 2, rec.Attempts)
	re := b.events.list()[0].(pgfence.SlotRetried)
	require.Equal(t, "running", re.PrevState)
	require.Equal(t, "helper", re.PrevOwner)
}

// TestHolderPausedPastTTL: the holder is stopped (SIGSTOP) inside its job
// past its TTL; another replica takes the slot over and completes it; the
// holder, resumed, can neither mark it done nor commit its write. The
// negative control: a holder under the plain lease writes after its pause,
// and the slot's effect lands twice.
func TestHolderPausedPastTTL(t *testing.T) {
	t.Parallel()
	for _, plain := range []bool{false, true} {
		t.Run(map[bool]string{false: "slot", true: "control: plain lease"}[plain], func(t *testing.T) {
			db := faultDB(t)
			h := startHolder(t, db.URL, "s1", plain)
			require.NoError(t, h.cmd.Process.Signal(syscall.SIGSTOP))

			b := newReplica(t, db, "b", 5*time.Second)
			require.NoError(t, b.runner.RunTx(context.Background(), "faulty", "s1", nil, func(ctx context.Context, tx pgx.Tx, s *schedule.Slot) error {
				return insertEffect(ctx, tx, s, "b")
			}))
			require.NoError(t, h.cmd.Process.Signal(syscall.SIGCONT))
			last, status := h.finish(t)
			if plain {
				require.Equal(t, map[string]int{"s1": 2}, effects(t, db.Pool), "the control's late write lands: %s", last)
				return
			}
			require.Equal(t, 3, status, last)
			require.Contains(t, last, "is not held with fencing token")
			require.Equal(t, map[string]int{"s1": 1}, effects(t, db.Pool))
			rec := record(t, b, "faulty", "s1")
			require.Equal(t, "done", rec.State)
			require.Equal(t, "b", rec.Owner)
		})
	}
}

// everyReplicas runs n replicas' Every loops on db, each slot's job writing
// one effect in its transaction, until stop returns true, and returns the
// replicas.
func everyReplicas(t *testing.T, db *pgtest.DB, n, catchUp int, every time.Duration, during func(rs []*replica)) []*replica {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	var rs []*replica
	for i := range n {
		rs = append(rs, newReplicaCfg(t, db, fmt.Sprintf("r%d", i), time.Second, catchUp))
	}
	var wg sync.WaitGroup
	for _, r := range rs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_ = r.runner.EveryTx(ctx, "every", every, nil, func(ctx context.Context, tx pgx.Tx, s *schedule.Slot) error {
				return insertEffect(ctx, tx, s, r.name)
			})
		}()
	}
	during(rs)
	cancel()
	wg.Wait()
	return rs
}

// requireContiguous checks that the done slots of job "every" follow each
// other with no gap, each with one effect, and returns how many there are.
func requireContiguous(t *testing.T, db *pgtest.DB, r *replica, every time.Duration) int {
	t.Helper()
	done, lost := slotGaps(t, db, r, every)
	require.Zero(t, lost, "slots lost")
	return done
}

// slotGaps returns how many slots of job "every" are done, each with one
// effect, and how many between the first and the last are not.
func slotGaps(t *testing.T, db *pgtest.DB, r *replica, every time.Duration) (done, lost int) {
	t.Helper()
	recs, err := r.runner.History(context.Background(), "every", 100000)
	require.NoError(t, err)
	var keys []string
	for _, rec := range recs {
		if rec.State == "done" {
			keys = append(keys, rec.Slot)
		}
	}
	sort.Strings(keys)
	require.NotEmpty(t, keys)
	fx := effects(t, db.Pool)
	prev := time.Time{}
	for _, k := range keys {
		at, err := time.Parse(time.RFC3339Nano, k)
		require.NoError(t, err)
		if !prev.IsZero() {
			lost += int(at.Sub(prev)/every) - 1
		}
		prev = at
		require.Equal(t, 1, fx[k], "slot %s", k)
	}
	require.Len(t, fx, len(keys), "an effect without a done slot")
	return len(keys), lost
}

func waitDone(t *testing.T, r *replica, n int) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for time.Now().Before(deadline) {
		recs, err := r.runner.History(context.Background(), "every", 100000)
		if err == nil {
			done := 0
			for _, rec := range recs {
				if rec.State == "done" {
					done++
				}
			}
			if done >= n {
				return
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("fewer than %d slots done within a minute", n)
}

// TestEveryReplicasNoneLost: three replicas' Every loops run every slot
// exactly once, with none lost.
func TestEveryReplicasNoneLost(t *testing.T) {
	t.Parallel()
	db := faultDB(t)
	const every = 200 * time.Millisecond
	rs := everyReplicas(t, db, 3, 0, every, func(rs []*replica) { waitDone(t, rs[0], 8) })
	require.GreaterOrEqual(t, requireContiguous(t, db, rs[0], every), 8)
}

// TestServerRestart: the server stops for a while under three replicas'
// Every loops and starts again; every slot, those of the outage included,
// ends done exactly once. The negative control, CatchUp 1, loses the
// outage's slots.
func TestServerRestart(t *testing.T) {
	t.Parallel()
	cluster, server := pgtest.NewCluster(t, nil)
	const every = 200 * time.Millisecond
	for _, control := range []bool{false, true} {
		db := server.NewDB(t)
		_, err := db.Pool.Exec(context.Background(), effectsDDL)
		require.NoError(t, err)
		catchUp := map[bool]int{false: 100, true: 1}[control]
		rs, before := restartUnder(t, cluster, db, catchUp, every)
		done, lost := slotGaps(t, db, rs[0], every)
		require.GreaterOrEqual(t, done, before+6)
		if control {
			require.NotZero(t, lost, "CatchUp 1 should lose the outage's slots")
		} else {
			require.Zero(t, lost, "slots lost")
		}
	}
}

// restartUnder runs three replicas' EveryTx on db while cluster stops for
// a second and starts again, and returns them with the number of slot
// records before the restart.
func restartUnder(t *testing.T, cluster *pgtest.Cluster, db *pgtest.DB, catchUp int, every time.Duration) ([]*replica, int) {
	var before int
	rs := everyReplicas(t, db, 3, catchUp, every, func(rs []*replica) {
		waitDone(t, rs[0], 4)
		require.NoError(t, cluster.Stop())
		time.Sleep(time.Second) // the outage
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		require.NoError(t, cluster.Start(ctx))
		recs, err := rs[0].runner.History(context.Background(), "every", 100000)
		require.NoError(t, err)
		before = len(recs)
		waitDone(t, rs[0], before+6)
	})
	return rs, before
}

// TestEveryResumesAfterEveryReplicaStopped: the only replica stops for a
// few slots; the next Every to start runs the slots passed since the
// job's newest record, so none is lost. The negative control, CatchUp 1,
// loses them.
func TestEveryResumesAfterEveryReplicaStopped(t *testing.T) {
	t.Parallel()
	const every = 200 * time.Millisecond
	for _, catchUp := range []int{100, 1} {
		db := faultDB(t)
		rs := everyReplicas(t, db, 1, catchUp, every, func(rs []*replica) { waitDone(t, rs[0], 3) })
		time.Sleep(5 * every) // no replica runs
		everyReplicas(t, db, 1, catchUp, every, func([]*replica) { waitDone(t, rs[0], 10) })
		done, lost := slotGaps(t, db, rs[0], every)
		require.GreaterOrEqual(t, done, 10)
		if catchUp == 1 {
			require.NotZero(t, lost, "CatchUp 1 should lose the stopped slots")
		} else {
			require.Zero(t, lost, "slots lost")
		}
	}
}
