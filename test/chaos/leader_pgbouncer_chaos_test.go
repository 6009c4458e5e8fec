//go:build chaos

package chaos_test

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence/leader"
	"github.com/pgfence/pgfence/leasetable"
)

// Three replicas run an election through a transaction-pooling PgBouncer,
// each term changing the work a few times and resigning: with the LISTEN
// connections pointed at the server directly (hand-overs within
// milliseconds), and with none (the LISTEN connection through the pooler
// is detected deaf at connect; hand-overs wait for the released lease's
// expiry). Either way the terms never overlap by the database's clock.
func TestLeaderPgBouncerTransactionMode(t *testing.T) {
	t.Parallel()
	for _, direct := range []bool{true, false} {
		name := "listen-direct"
		if !direct {
			name = "listen-through-pooler"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ctx := ctxFor(t, 2*time.Minute)
			b, db := startBouncer(t, ctx, 2)
			pool := bouncerPool(t, ctx, b, db)
			_, err := db.Pool.Exec(ctx, leaderWorkSQL)
			require.NoError(t, err)
			var listen *pgx.ConnConfig
			if direct {
				listen, err = pgx.ParseConfig(db.URL)
				require.NoError(t, err)
			}
			rctx, stop := context.WithCancel(ctx)
			defer stop()
			var (
				mu    sync.Mutex
				terms []termRec
				seen  = map[int64]bool{}
				wg    sync.WaitGroup
			)
			const wantTerms = 9
			for r := 0; r < 3; r++ {
				who := fmt.Sprintf("replica-%d", r)
				k, err := leasetable.New(ctx, pool, &leasetable.Config{TTL: leaderTTL, ListenConnConfig: listen})
				require.NoError(t, err)
				t.Cleanup(k.Close)
				e, err := leader.New(ctx, pool, &leader.Config{Locker: k, Election: leaderElection, Value: who,
					ListenConnConfig: listen, ObserveInterval: 100 * time.Millisecond})
				require.NoError(t, err)
				t.Cleanup(e.Close)
				wg.Add(1)
				go func() {
					defer wg.Done()
					_ = e.Run(rctx, leader.Callbacks{
						OnStartedLeading: func(ctx context.Context, term *leader.Term) {
							rec, ended := watchTerm(who, term)
							for i := 0; i < 3 && ctx.Err() == nil; i++ {
								if err := leaderWrite(ctx, pool, term.Token(), term.Lease().Secret(), true); err != nil && ctx.Err() == nil {
									t.Errorf("term %d: %v", term.Token(), err)
								}
								time.Sleep(5 * time.Millisecond)
							}
							rec.stopped = time.Now() // Run resigns once this returns
							go func() {
								<-ended
								mu.Lock()
								defer mu.Unlock()
								terms = append(terms, *rec)
								if len(terms) >= wantTerms {
									stop()
								}
							}()
						},
						OnNewLeader: func(info leader.TermInfo) {
							mu.Lock()
							defer mu.Unlock()
							if info.Leading {
								seen[info.Token] = true
							}
						},
					})
				}()
			}
			wg.Wait()
			mu.Lock()
			defer mu.Unlock()
			sort.Slice(terms, func(i, j int) bool { return terms[i].token < terms[j].token })
			var gaps []time.Duration
			for i := 0; i+1 < len(terms); i++ {
				gaps = append(gaps, terms[i+1].began.Sub(terms[i].learned))
			}
			sort.Slice(gaps, func(i, j int) bool { return gaps[i] < gaps[j] })
			t.Logf("%s: %d terms; hand-over gaps (resignation to the next term's beginning) median %v, max %v; terms observed %d",
				name, len(terms), gaps[len(gaps)/2].Round(time.Microsecond), gaps[len(gaps)-1].Round(time.Microsecond), len(seen))
			require.NotEmpty(t, seen, "observers saw leaders through the pooler")
			requireLeaderHistory(t, "leader-pgbouncer-"+name, terms, readLeaderLog(t, ctx, db.Pool), false)
		})
	}
}
