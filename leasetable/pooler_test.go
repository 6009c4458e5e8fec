//go:build tools

// This file needs PgBouncer on the machine: it runs under the "tools" build
// tag (make tools-ci, which CI runs), so that go test ./... passes with only
// the PostgreSQL server binaries.

package leasetable_test

import (
	"context"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/leasetable"
)

const deafWarn = "LISTEN does not receive notifications on this connection"

// startBouncer starts a transaction-pooling PgBouncer in front of db's
// server and returns a pool through it. CI installs PgBouncer; without it
// the test fails (under the tools tag), as a test that cannot run must not
// pass.
func startBouncer(t *testing.T, ctx context.Context, db *pgtest.DB) *pgxpool.Pool {
	t.Helper()
	if _, err := exec.LookPath("pgbouncer"); err != nil {
		_, err := os.Stat("/usr/sbin/pgbouncer")
		require.NoError(t, err, "pgbouncer is needed for this test (apt-get install pgbouncer)")
	}
	cc, err := pgx.ParseConfig(db.TCPURL)
	require.NoError(t, err)
	b, err := pgtest.StartPgBouncer(ctx, pgtest.PgBouncerConfig{ServerPort: int(cc.Port), Password: cc.Password, PoolSize: 2})
	require.NoError(t, err)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("pgbouncer log:\n%s", b.Log())
		}
		b.Close()
	})
	pcfg, err := pgxpool.ParseConfig(b.URL(db.Name))
	require.NoError(t, err)
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool
}

// Behind a transaction-pooling PgBouncer, the LISTEN connection is
// detected as deaf at connect: one Warn, no reconnects, and the waiter
// falls back to a timed retry at the holder's expiry. Control: the same
// Locker configuration with ListenConnConfig pointing at the server
// directly passes the probe and is woken by the release.
func TestListenBehindTransactionPoolerIsDetected(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	db := pgtest.NewDB(t)
	pooled := startBouncer(t, ctx, db)
	holder := newLocker(t, db.Pool, nil)

	t.Run("through the pooler", func(t *testing.T) {
		logs := newLogWatch()
		deaf := logs.next(deafWarn)
		logs.count(deafWarn)
		logs.count("LISTEN connection failed")
		logs.count("LISTEN connection ready")
		const ttl = time.Second
		waiter := newLocker(t, pooled, &leasetable.Config{TTL: ttl, Logger: logs.logger(), ListenCheckInterval: 200 * time.Millisecond})
		l, err := holder.TryAcquire(ctx, "pooled", &leasetable.AcquireOpts{TTL: ttl})
		require.NoError(t, err)
		got := acquireAsync(waiter, "pooled", 20*time.Second)
		waitFor(t, deaf, "the deaf LISTEN warning")
		require.NoError(t, l.Release(ctx))
		r := <-got
		require.NoError(t, r.err, "the waiter still acquires, by a timed retry")
		// The waiter retried several times meanwhile (each a wait of
		// about a TTL); the notifier has stopped for good.
		r2 := acquireAsync(waiter, "pooled", 20*time.Second)
		require.NoError(t, r.l.Release(ctx))
		r = <-r2
		require.NoError(t, r.err)
		require.NoError(t, r.l.Release(ctx))
		require.Equal(t, 1, logs.count(deafWarn), "reported once")
		require.Zero(t, logs.count("LISTEN connection failed"), "no reconnects")
		require.Zero(t, logs.count("LISTEN connection ready"))
	})

	t.Run("control: direct ListenConnConfig", func(t *testing.T) {
		logs := newLogWatch()
		logs.count(deafWarn)
		listening := logs.next("LISTEN connection ready")
		direct, err := pgx.ParseConfig(db.TCPURL)
		require.NoError(t, err)
		const ttl = 20 * time.Second
		waiter := newLocker(t, pooled, &leasetable.Config{TTL: ttl, Logger: logs.logger(), ListenConnConfig: direct})
		l, err := holder.TryAcquire(ctx, "direct", &leasetable.AcquireOpts{TTL: ttl})
		require.NoError(t, err)
		waiting := logs.next("waiting for lease")
		got := acquireAsync(waiter, "direct", 10*time.Second) // far shorter than the TTL
		waitFor(t, listening, "the listener")
		waitFor(t, waiting, "the waiter to wait")
		require.NoError(t, l.Release(ctx))
		r := <-got
		require.NoError(t, r.err, "woken by the release's notification")
		require.NoError(t, r.l.Release(ctx))
		require.Zero(t, logs.count(deafWarn))
	})
}
