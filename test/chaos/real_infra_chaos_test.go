//go:build chaos

package chaos_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence"
	"github.com/pgfence/pgfence/advisory"
	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/leasetable"
	"github.com/pgfence/pgfence/test/chaos"
)

// tryLeases records a TryAcquire of each name on k as an Acquire of
// process p: Ok with the token, or Fail when the lease is held elsewhere.
func tryLeases(t *testing.T, ctx context.Context, rec *chaos.Recorder, k *leasetable.Locker, p int, names []string) (held int) {
	t.Helper()
	for _, name := range names {
		op := rec.Invoke(chaos.Op{Process: p, Kind: chaos.Acquire, Name: name})
		l, err := k.TryAcquire(ctx, name, nil)
		if errors.Is(err, pgfence.ErrNotAcquired) {
			op.Complete(chaos.Fail, func(o *chaos.Op) { o.Err = err.Error() })
			continue
		}
		require.NoError(t, err)
		held++
		op.Complete(chaos.Ok, func(o *chaos.Op) { o.Token = l.Token() })
	}
	return held
}

func names(prefix string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("%s-%d", prefix, i)
	}
	return out
}

// leaseFailover: a leasetable Locker takes leases (TTL 1 minute) on the
// primary; the primary is crashed (SIGKILL) and the standby promoted; a
// Locker on the promoted standby tries to take the same leases, and new
// ones. Synchronous standby: every lease is still held (TryAcquire fails),
// and every new token is greater than every token granted before. The
// asynchronous standby, cut off before the leases were taken, shows the
// documented danger: the leases are granted a second time while their first
// holders never released them, and tokens are reissued.
func leaseFailover(t *testing.T, synchronous bool) {
	ctx := ctxFor(t, 3*time.Minute)
	f := newFailoverPair(t, synchronous)

	cfg := &leasetable.Config{TTL: time.Minute, QueryTimeout: 200 * time.Millisecond}
	primaryPool := appPool(t, ctx, f.primary.URL(f.db.Name), "chaos-primary", 4, nil)
	onPrimary, err := leasetable.New(ctx, primaryPool, cfg)
	require.NoError(t, err)
	t.Cleanup(onPrimary.Close)
	rec := chaos.NewRecorder()
	// More than 32 grants: a sequence logs 32 values ahead, so fewer could
	// hide a rollback.
	leases := names("lease", 40)
	if f.proxy != nil {
		require.Equal(t, 3, tryLeases(t, ctx, rec, onPrimary, 0, names("before", 3)))
		f.cutReplication(t, ctx, connectURL(t, ctx, f.primary.URL(f.db.Name)))
	}
	require.Equal(t, len(leases), tryLeases(t, ctx, rec, onPrimary, 0, leases))

	f.crashAndPromote(t, ctx)
	standbyPool := appPool(t, ctx, f.standby.URL(f.db.Name), "chaos-standby", 4, nil)
	onStandby, err := leasetable.New(ctx, standbyPool, cfg)
	require.NoError(t, err)
	t.Cleanup(onStandby.Close)
	regranted := tryLeases(t, ctx, rec, onStandby, 1, leases)
	tryLeases(t, ctx, rec, onStandby, 1, names("after", 40))

	h := rec.History()
	name := "failover-sync-standby-leasetable"
	if !synchronous {
		name = "failover-async-standby-leasetable"
	}
	r, err := chaos.Check(h, &chaos.CheckOpts{Name: name, Exclusive: true, Dir: t.TempDir()})
	require.NoError(t, err)
	t.Log(r.Summary())
	t.Logf("%s: %d leases held on the primary at the crash; %d granted again on the promoted standby", name, len(leases), regranted)
	if synchronous {
		require.True(t, r.OK(), "%s", r)
		require.Zero(t, regranted, "leases must survive a failover to a synchronous standby")
		var maxBefore, minAfter int64 = 0, 1 << 62
		for _, op := range h {
			if op.Kind == chaos.Acquire && op.Outcome == chaos.Ok {
				if op.Process == 0 {
					maxBefore = max(maxBefore, op.Token)
				} else {
					minAfter = min(minAfter, op.Token)
				}
			}
		}
		require.Greater(t, minAfter, maxBefore, "every token after the failover is newer than every token before")
		t.Logf("sync standby: all %d leases preserved; newest token before %d, oldest after %d", len(leases), maxBefore, minAfter)
		return
	}
	require.Equal(t, "violation detected", r.Verdict())
	require.Equal(t, len(leases), regranted)
	reissued := chaos.CheckTokensUnique(h)
	require.NotEmpty(t, reissued)
	t.Logf("async standby danger shown: %d leases granted twice (mutual exclusion: %d violations), %d tokens reissued (first: %s)",
		regranted, len(chaos.CheckMutualExclusion(h)), len(reissued), reissued[0])
}

func TestRealLeaseFailoverSynchronousStandby(t *testing.T) {
	t.Parallel()
	leaseFailover(t, true)
}

func TestRealLeaseFailoverAsynchronousStandbyShowsDanger(t *testing.T) {
	t.Parallel()
	leaseFailover(t, false)
}

// Tokens of the real lockers (leasetable grants, advisory session and
// transaction locks) across crashes of a server running with
// synchronous_commit=off: pgfence_next_token() makes each grant durable, so
// no token returned before a crash is returned again after it.
func TestRealLockersTokensSurviveCrashSyncCommitOff(t *testing.T) {
	t.Parallel()
	ctx := ctxFor(t, 3*time.Minute)
	c, s := pgtest.NewCluster(t, &pgtest.ClusterOptions{Settings: map[string]string{
		"synchronous_commit": "off", "wal_writer_delay": "10s", "autovacuum": "off",
	}})
	db := s.NewDB(t)
	rec := chaos.NewRecorder()
	const rounds, perRound = 4, 12
	for i := 0; i < rounds; i++ {
		pool := appPool(t, ctx, c.URL(db.Name), "chaos-locker", 2, nil)
		lt, err := leasetable.New(ctx, pool, &leasetable.Config{TTL: time.Minute, QueryTimeout: 200 * time.Millisecond})
		require.NoError(t, err)
		require.Equal(t, perRound, tryLeases(t, ctx, rec, lt, 0, names(fmt.Sprintf("r%d", i), perRound)))
		al, err := advisory.New(ctx, pool, nil)
		require.NoError(t, err)
		for j := 0; j < perRound; j++ {
			op := rec.Invoke(chaos.Op{Process: 1, Kind: chaos.Acquire, Name: fmt.Sprintf("adv-%d-%d", i, j)})
			lk, err := al.TryAcquire(ctx, fmt.Sprintf("adv-%d-%d", i, j), nil)
			require.NoError(t, err)
			op.Complete(chaos.Ok, func(o *chaos.Op) { o.Token = lk.Token() })
			op = rec.Invoke(chaos.Op{Process: 2, Kind: chaos.Acquire, Name: fmt.Sprintf("xact-%d-%d", i, j)})
			tx, err := pool.Begin(ctx)
			require.NoError(t, err)
			tok, err := al.TryAcquireTx(ctx, tx, advisory.Name(fmt.Sprintf("xact-%d-%d", i, j)), nil)
			require.NoError(t, err)
			require.NoError(t, tx.Commit(ctx))
			op.Complete(chaos.Ok, func(o *chaos.Op) { o.Token = tok })
		}
		crash(t, ctx, c, i)
		lt.Close()
		al.Close()
		pool.Close()
	}
	h := rec.History()
	t.Logf("tokens granted across %d crashes (synchronous_commit=off): %d", rounds, h.Count(chaos.Acquire, chaos.Ok))
	verdict(t, h, &chaos.CheckOpts{Name: "server-crash-sync-commit-off-real-lockers"}, false)
}

// bouncerPool is a pool through PgBouncer (transaction mode), with pgx's
// "exec" mode (no named prepared statements).
func bouncerPool(t *testing.T, ctx context.Context, b *pgtest.PgBouncer, db *pgtest.DB) *pgxpool.Pool {
	t.Helper()
	return appPool(t, ctx, b.URL(db.Name), "", 8, nil)
}

// Through a transaction-pooling PgBouncer: leasetable (its LISTEN
// connection pointed at the server directly) and advisory transaction
// locks keep the register linearizable, and advisory transaction locks
// stay mutually exclusive.
func TestRealLockersPgBouncerTransactionMode(t *testing.T) {
	t.Parallel()
	for _, kind := range []lockerKind{kindLease, kindAdvisoryTx} {
		t.Run(string(kind), func(t *testing.T) {
			t.Parallel()
			ctx := ctxFor(t, 2*time.Minute)
			b, db := startBouncer(t, ctx, 2)
			pool := bouncerPool(t, ctx, b, db)
			reg, fin := realRegister(t, ctx, kind, pool, db.Pool)
			var lockers []chaos.Locker
			if kind == kindLease {
				direct, err := pgx.ParseConfig(db.URL)
				require.NoError(t, err)
				for i := 0; i < 4; i++ {
					l, err := leasetable.New(ctx, pool, &leasetable.Config{TTL: time.Second, ListenConnConfig: direct})
					require.NoError(t, err)
					t.Cleanup(l.Close)
					lockers = append(lockers, &chaos.PgfenceLocker{L: l})
				}
			} else {
				lockers = realLockers(t, kind, pool, realOpts{})
			}
			h := runReal(t, ctx, lockers, reg, 80, 0, 5*time.Millisecond, 0, 23)
			checkReal(t, "pgbouncer-transaction", kind, h, finalState(t, ctx, fin), kind == kindAdvisoryTx)
		})
	}
}

// Session advisory locks through a transaction-pooling PgBouncer: what
// actually happens. Each Locker's session is a client connection to
// PgBouncer, whose statements run on whichever of the 2 server connections
// is free. The Locker's backend-pid check sees many sessions move and
// refuses the lock or reports it lost, with an error naming the pooler; but
// a lock taken on a server connection that another Locker's statement then
// uses is granted to both (advisory locks are re-entrant per backend), and
// the check cannot see that: mutual exclusion is broken. Fencing still keeps
// the register linearizable, which the test requires; the mutual exclusion
// violations and refusals are reported.
func TestRealAdvisorySessionPgBouncerTransactionMode(t *testing.T) {
	t.Parallel()
	ctx := ctxFor(t, 2*time.Minute)
	b, db := startBouncer(t, ctx, 2)
	pool := bouncerPool(t, ctx, b, db)
	reg, fin := realRegister(t, ctx, kindAdvisory, pool, db.Pool)
	lockers := realLockers(t, kindAdvisory, pool, realOpts{})
	h := runReal(t, ctx, lockers, reg, 80, 4*time.Second, 5*time.Millisecond, 2*time.Second, 29)
	refused := 0
	var sample string
	for _, op := range h {
		if op.Kind == chaos.Acquire && op.Outcome == chaos.Fail {
			refused++
			if sample == "" {
				sample = op.Err
			}
		}
	}
	overlaps := chaos.CheckMutualExclusion(h)
	t.Logf("session advisory locks through PgBouncer (transaction mode): %d acquisitions ok, %d refused (first: %s), %d ops by holders told of the loss, %d pairs of holders at once (mutual exclusion broken)",
		h.Count(chaos.Acquire, chaos.Ok), refused, sample, countLost(h), len(overlaps))
	if len(overlaps) > 0 {
		t.Logf("chaos: scenario=pgbouncer-transaction-advisory-session-mutual-exclusion ops=%d verdict=violation detected (%s)", len(h), overlaps[0])
	}
	// The fence keeps the data right even where the lock is broken.
	checkReal(t, "pgbouncer-transaction-advisory-session-fenced", kindAdvisory, h, finalState(t, ctx, fin), false)
	require.True(t, refused > 0 || len(overlaps) > 0, "session locks through a transaction pooler were neither refused nor seen overlapping")
}

// recordingTracer records the arguments of every query a pool sends, and
// closes renewed once it has seen three lease renewals (leasetable's batch
// renewal statement, recognised by its call of pgfence_renew).
type recordingTracer struct {
	mu       sync.Mutex
	sql      []string
	args     [][]any
	renewals int
	renewed  chan struct{}
}

func (r *recordingTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.sql = append(r.sql, d.SQL)
	r.args = append(r.args, d.Args)
	if strings.Contains(d.SQL, ".pgfence_renew(") {
		r.renewals++
		if r.renewals == 3 {
			close(r.renewed)
		}
	}
	return ctx
}

func (r *recordingTracer) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// Client clock skew cannot affect leasetable: it never sends a client
// timestamp. Every statement leasetable runs (acquire, takeover of an
// expired lease, renewals, release, Get, List) is traced, and no argument
// is a time: expiry is computed and compared on the database clock only,
// and the holder's local deadline is on its monotonic clock. (The negative
// control of client-clock expiry is TestClientClockSkew.)
func TestRealLeaseSendsNoClientTime(t *testing.T) {
	t.Parallel()
	ctx := ctxFor(t, time.Minute)
	db := pgtest.NewDB(t)
	tr := &recordingTracer{renewed: make(chan struct{})}
	pool := appPool(t, ctx, db.URL, "chaos-locker", 4, func(c *pgxpool.Config) { c.ConnConfig.Tracer = tr })
	// Frequent renewals with a TTL no scheduling stall on a loaded CI
	// machine outlasts: the lease must not lapse before a releases it.
	cfg := &leasetable.Config{TTL: 3 * time.Second, RenewInterval: 100 * time.Millisecond}
	a, err := leasetable.New(ctx, pool, cfg)
	require.NoError(t, err)
	defer a.Close()
	b, err := leasetable.New(ctx, pool, cfg)
	require.NoError(t, err)
	defer b.Close()

	la, err := a.Acquire(ctx, "skew", nil)
	require.NoError(t, err)
	// Held through several renewals; b waits, wakes on the release.
	got := make(chan pgfence.Lease, 1)
	go func() {
		lb, err := b.Acquire(ctx, "skew", nil)
		if err != nil {
			lb = nil
		}
		got <- lb
	}()
	select {
	case <-tr.renewed: // a's watchdog renewed the lease three times
	case <-ctx.Done():
		t.Fatal("no lease renewals seen")
	}
	_, _, err = b.Get(ctx, "skew")
	require.NoError(t, err)
	_, err = b.List(ctx)
	require.NoError(t, err)
	require.NoError(t, la.Release(ctx))
	lb := <-got
	require.NotNil(t, lb)
	require.Greater(t, lb.Token(), la.Token())
	require.NoError(t, lb.Release(ctx))

	tr.mu.Lock()
	defer tr.mu.Unlock()
	require.NotEmpty(t, tr.args)
	for i, args := range tr.args {
		for _, a := range args {
			switch a.(type) {
			case time.Time, *time.Time:
				t.Fatalf("leasetable sent a client timestamp in %q", tr.sql[i])
			}
		}
	}
	t.Logf("leasetable statements traced: %d (%d renewals), none with a client timestamp argument", len(tr.args), tr.renewals)
}
