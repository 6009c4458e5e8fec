//go:build chaos

package chaos_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/test/chaos"
)

func startBouncer(t *testing.T, ctx context.Context, poolSize int) (*pgtest.PgBouncer, *pgtest.DB) {
	t.Helper()
	db := pgtest.NewDB(t)
	cfg, err := pgx.ParseConfig(db.TCPURL)
	require.NoError(t, err)
	b, err := pgtest.StartPgBouncer(ctx, pgtest.PgBouncerConfig{ServerPort: int(cfg.Port), Password: cfg.Password, PoolSize: poolSize})
	require.NoError(t, err)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("pgbouncer log:\n%s", b.Log())
		}
		b.Close()
	})
	return b, db
}

// Through a transaction pool, transaction-scoped advisory locks exclude
// each other, and pgfence_next_token() hands out unique, increasing tokens.
func TestPgBouncerTransactionModeXactLocksAndTokens(t *testing.T) {
	t.Parallel()
	ctx := ctxFor(t, 2*time.Minute)
	b, db := startBouncer(t, ctx, 2)
	url := b.URL(db.Name)
	a := connectURL(t, ctx, url)
	c := connectURL(t, ctx, url)

	const key = 42
	txA, err := a.Begin(ctx)
	require.NoError(t, err)
	var got bool
	require.NoError(t, txA.QueryRow(ctx, "SELECT pg_try_advisory_xact_lock($1)", key).Scan(&got))
	require.True(t, got)
	txC, err := c.Begin(ctx)
	require.NoError(t, err)
	require.NoError(t, txC.QueryRow(ctx, "SELECT pg_try_advisory_xact_lock($1)", key).Scan(&got))
	require.False(t, got, "a transaction-scoped lock held by one client excludes another")
	require.NoError(t, txC.Rollback(ctx))
	require.NoError(t, txA.Commit(ctx))
	require.NoError(t, c.QueryRow(ctx, "SELECT pg_try_advisory_xact_lock($1)", key).Scan(&got))
	require.True(t, got, "released at commit")

	// Tokens through the pool, from several clients at once.
	pcfg, err := pgxpool.ParseConfig(url)
	require.NoError(t, err)
	pcfg.MaxConns = 8
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	rec := chaos.NewRecorder()
	var wg sync.WaitGroup
	for p := 0; p < 8; p++ {
		wg.Add(1)
		go func(p int) {
			defer wg.Done()
			for i := 0; i < 25; i++ {
				op := rec.Invoke(chaos.Op{Process: p, Kind: chaos.Acquire, Name: "tokens"})
				tok, err := chaos.NextToken(ctx, pool)
				op.Complete(chaos.Classify(err), func(o *chaos.Op) { o.Token = tok })
			}
		}(p)
	}
	wg.Wait()
	h := rec.History()
	require.Equal(t, len(h), h.Count(chaos.Acquire, chaos.Ok))
	verdict(t, h, &chaos.CheckOpts{Name: "pgbouncer-transaction-tokens"}, false)
}

// Through a transaction pool, a session advisory lock stays on the server
// connection, which the pool hands to the next client: that client then
// "acquires" the same lock (session locks are re-entrant) while the first
// still believes it holds it, and can even release it. Session advisory
// locks through a transaction pool are unsafe; this shows it.
func TestPgBouncerTransactionModeSessionLocksAreUnsafe(t *testing.T) {
	t.Parallel()
	ctx := ctxFor(t, 2*time.Minute)
	b, db := startBouncer(t, ctx, 1)
	url := b.URL(db.Name)
	a := connectURL(t, ctx, url)
	c := connectURL(t, ctx, url)
	rec := chaos.NewRecorder()

	const key = 7
	var got bool
	var pidA, pidC int
	op := rec.Invoke(chaos.Op{Process: 0, Kind: chaos.Acquire, Name: fmt.Sprint(key)})
	require.NoError(t, a.QueryRow(ctx, "SELECT pg_try_advisory_lock($1), pg_backend_pid()", key).Scan(&got, &pidA))
	require.True(t, got)
	op.Complete(chaos.Ok, nil)

	op = rec.Invoke(chaos.Op{Process: 1, Kind: chaos.Acquire, Name: fmt.Sprint(key)})
	require.NoError(t, c.QueryRow(ctx, "SELECT pg_try_advisory_lock($1), pg_backend_pid()", key).Scan(&got, &pidC))
	op.Complete(chaos.Ok, nil)
	require.Equal(t, pidA, pidC, "both clients ran on the same server connection")
	require.True(t, got, "the second client is granted the session lock the first one holds")

	// The second client can release the first one's lock.
	var released bool
	require.NoError(t, c.QueryRow(ctx, "SELECT pg_advisory_unlock($1)", key).Scan(&released))
	require.True(t, released)

	// Two clients held the lock at once.
	h := rec.History()
	r, err := chaos.Check(h, &chaos.CheckOpts{Name: "pgbouncer-session-advisory-lock-unsafe", Exclusive: true, Dir: t.TempDir()})
	require.NoError(t, err)
	t.Log(r.Summary())
	require.Equal(t, "violation detected", r.Verdict())
	require.Len(t, r.Violations, 1)
	require.Contains(t, r.Violations[0], "at the same time")
}
