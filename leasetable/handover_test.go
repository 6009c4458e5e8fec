package leasetable_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence"
	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/leasetable"
)

// claimOf returns the claim registered for semaphore sem (its grant key and
// version), as the superuser reads it; ok false when there is none.
func claimOf(t *testing.T, db *pgtest.DB, sem string) (key []byte, version int64, ok bool) {
	t.Helper()
	err := db.Pool.QueryRow(t.Context(), `SELECT grant_key, version FROM pgfence.pgfence_permit_claims
		WHERE sem = $1 AND granted IS NULL`, sem).Scan(&key, &version)
	return key, version, err == nil
}

// TestPermitHandedOver: the head of a semaphore's line, waiting in another
// Locker, gets the permit a release frees from the release itself: its
// AcquirePermit returns the lease it adopted from the grant's notification
// (a larger token, held with its own secret, released normally), which
// ends when the holder's lease would have (50 s), not a TTL (1 min) after
// the grant. The control, a head that registers no claim (SetNoClaim),
// gets the permit by an acquire of its own after the release's wake-up:
// nothing is handed, and the lease runs its own TTL.
func TestPermitHandedOver(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	for _, claim := range []bool{true, false} {
		t.Run(fmt.Sprintf("claim=%t", claim), func(t *testing.T) {
			t.Parallel()
			db := pgtest.NewDB(t)
			holder := newLocker(t, db.Pool, &leasetable.Config{TTL: 50 * time.Second})
			waiter, err := leasetable.New(ctx, db.NewPool(t, nil), &leasetable.Config{TTL: time.Minute})
			require.NoError(t, err)
			t.Cleanup(waiter.Close)
			if !claim {
				leasetable.SetNoClaim(waiter)
			}
			var handed atomic.Int64
			leasetable.SetOnHanded(waiter, func(token int64) { handed.Store(token) })

			held, err := holder.TryAcquirePermit(ctx, "hand", 1, nil)
			require.NoError(t, err)
			got := make(chan pgfence.Lease, 1)
			errc := make(chan error, 1)
			go func() {
				l, err := waiter.AcquirePermit(ctx, "hand", 1, &pgfence.AcquireOpts{WaitTimeout: 20 * time.Second})
				if err != nil {
					errc <- err
					return
				}
				got <- l
			}()
			require.Eventually(t, func() bool {
				if claim {
					_, _, ok := claimOf(t, db, "hand")
					return ok
				}
				return inLine(t, db, "hand", true) > 0
			}, 15*time.Second, time.Millisecond, "the waiter is the head of the line")
			var heldUntil time.Time
			require.NoError(t, db.Pool.QueryRow(ctx, `SELECT expires_at FROM pgfence.pgfence_leases WHERE name = $1`,
				held.Name()).Scan(&heldUntil))
			released := time.Now()
			require.NoError(t, held.Release(ctx))
			var l pgfence.Lease
			select {
			case l = <-got:
			case err := <-errc:
				t.Fatal(err)
			}
			var until time.Time
			require.NoError(t, db.Pool.QueryRow(ctx, `SELECT expires_at FROM pgfence.pgfence_leases WHERE name = $1`,
				l.Name()).Scan(&until))
			require.Equal(t, leasetable.PermitName("hand", 0), l.Name())
			require.Greater(t, l.Token(), held.Token())
			var ok bool
			require.NoError(t, db.Pool.QueryRow(ctx, `SELECT pgfence.pgfence_lease_held($1, $2, $3)`,
				l.Name(), l.Token(), l.(*leasetable.Lease).Secret()).Scan(&ok))
			require.True(t, ok, "held with the waiter's secret")
			if claim {
				require.Equal(t, l.Token(), handed.Load(), "adopted from the grant's notification")
				// The old lease's expiry (50 s), not the waiter's TTL (1 min):
				// in the database, and for the local deadline (50 s less the
				// margin, 6 s; renewed 10 s after the grant, as a lease of
				// 60 s acquired 10 s before it would be).
				require.Equal(t, heldUntil, until, "the holder's expiry")
				require.Less(t, l.(*leasetable.Lease).Expiry().Sub(released), 50*time.Second)
			} else {
				require.Zero(t, handed.Load(), "control: taken by an acquire of its own")
				require.Greater(t, until, heldUntil, "control: its own TTL")
				require.Greater(t, l.(*leasetable.Lease).Expiry().Sub(released), 52*time.Second)
			}
			require.NoError(t, l.Release(ctx))
		})
	}
}

// TestPermitForgedGrantIgnored: a grant notification that the claim's
// grant key did not sign is dropped, even with the semaphore's tag and a
// signature made with the notification key every application role reads:
// the head keeps waiting, and the permit stays its holder's. The control
// signs the same payload with the claim's grant key (read here as the
// superuser): the head takes it for a grant, so the signature is the only
// thing that stops a forged one.
func TestPermitForgedGrantIgnored(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	db := pgtest.NewDB(t)
	holder := newLocker(t, db.Pool, &leasetable.Config{TTL: time.Minute})
	waiter, err := leasetable.New(ctx, db.NewPool(t, nil), nil)
	require.NoError(t, err)
	t.Cleanup(waiter.Close)
	notified := make(chan struct{}, 16)
	leasetable.SetOnNotify(waiter, func() { notified <- struct{}{} })

	held, err := holder.TryAcquirePermit(ctx, "forge", 1, nil)
	require.NoError(t, err)
	got := make(chan pgfence.Lease, 1)
	go func() {
		l, err := waiter.AcquirePermit(ctx, "forge", 1, &pgfence.AcquireOpts{WaitTimeout: 20 * time.Second})
		if err == nil {
			got <- l
		}
	}()
	var key []byte
	var version int64
	require.Eventually(t, func() bool {
		var ok bool
		key, version, ok = claimOf(t, db, "forge")
		return ok
	}, 15*time.Second, time.Millisecond)

	var tag string
	var notifyKey []byte
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT encode(substr(sha256(key || '\x01'::bytea || convert_to($1, 'UTF8')), 1, 16), 'hex'), key
		FROM pgfence.pgfence_notify_key`, "forge"+leasetable.PermitSeparator).Scan(&tag, &notifyKey))
	now := time.Now()
	msg := fmt.Sprintf("g:%s:%d:0:%d:%d:%d", tag, version, held.Token()+1, now.UnixMicro(), now.Add(time.Minute).UnixMicro())
	sign := func(k []byte) string {
		in := sha256.Sum256(append(append(append([]byte{}, k...), 3), msg...))
		out := sha256.Sum256(append(append([]byte{}, k...), in[:]...))
		return msg + ":" + hex.EncodeToString(out[:])
	}
	send := func(payload string) {
		t.Helper()
		for len(notified) > 0 {
			<-notified
		}
		_, err := db.Pool.Exec(ctx, `SELECT pg_notify('pgfence_lease_released', $1)`, payload)
		require.NoError(t, err)
		select {
		case <-notified:
		case <-time.After(10 * time.Second):
			t.Fatal("the waiter's LISTEN connection got no notification")
		}
	}

	send(sign(notifyKey))
	send(msg + ":" + hex.EncodeToString(make([]byte, 32)))
	select {
	case l := <-got:
		t.Fatalf("a forged grant was adopted: %s token %d", l.Name(), l.Token())
	default:
	}
	require.Equal(t, 1, waiter.Stats().Waiting, "still waiting")

	send(sign(key))
	select {
	case l := <-got:
		require.Equal(t, held.Token()+1, l.Token(), "control: signed with the grant key, it is taken for a grant")
	case <-time.After(10 * time.Second):
		t.Fatal("control: the grant signed with the claim's key was not adopted")
	}
	require.NoError(t, held.Release(ctx))
}

// handoverUnderKills runs two callers on each of two Lockers taking a
// permit of a semaphore of permits, holding it 1 ms, for 3 s, while a
// nemesis terminates a random client backend of the database (pool, LISTEN
// and line connections alike) every 100 ms. It returns how many times more
// callers held at once than cap, the grants, and whether the tokens were
// all distinct; it logs how many grants a release handed over.
func handoverUnderKills(t *testing.T, permits, cap int) (over, grants int64, distinct bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Second)
	defer cancel()
	db := pgtest.NewDB(t)
	var inUse, nOver, nGrants, nHanded atomic.Int64
	var mu sync.Mutex
	tokens := map[string]map[int64]bool{}
	dup := false
	var wg sync.WaitGroup
	for range 2 {
		k := newLocker(t, db.NewPool(t, nil), &leasetable.Config{TTL: 2 * time.Second})
		leasetable.SetOnHanded(k, func(int64) { nHanded.Add(1) })
		for range 2 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for ctx.Err() == nil {
					l, err := k.AcquirePermit(ctx, "kills", permits, &pgfence.AcquireOpts{WaitTimeout: time.Second})
					if err != nil {
						continue // a kill cut the call, or ctx ended
					}
					nGrants.Add(1)
					if inUse.Add(1) > int64(cap) {
						nOver.Add(1)
					}
					mu.Lock()
					if tokens[l.Name()] == nil {
						tokens[l.Name()] = map[int64]bool{}
					}
					dup = dup || tokens[l.Name()][l.Token()]
					tokens[l.Name()][l.Token()] = true
					mu.Unlock()
					time.Sleep(time.Millisecond)
					inUse.Add(-1)
					_ = l.Release(context.WithoutCancel(ctx))
				}
			}()
		}
	}
	kills := 0
	for ctx.Err() == nil {
		time.Sleep(100 * time.Millisecond)
		var n int
		if err := db.Pool.QueryRow(context.WithoutCancel(ctx), `SELECT count(pg_terminate_backend(pid)) FROM (
			SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()
			  AND backend_type = 'client backend' ORDER BY random() LIMIT 1) v`).Scan(&n); err == nil {
			kills += n
		}
	}
	wg.Wait()
	t.Logf("permits %d against a cap of %d: %d grants, %d handed over, %d backends terminated, %d over the cap",
		permits, cap, nGrants.Load(), nHanded.Load(), kills, nOver.Load())
	return nOver.Load(), nGrants.Load(), !dup
}

// TestPermitHandoverUnderKills: with releases handing the permit to the
// heads of the line, and backends (the holders', the waiters' LISTEN and
// line connections) terminated every 100 ms, no two callers hold the one
// permit at once and every grant has its own token. (Most runs hand over
// a third to two thirds of the grants; a run whose kills keep cutting the
// line may hand over none, so the count is logged, not asserted: the
// hand-over itself is TestPermitHandedOver's.) The control asks for 2
// permits and checks the callers against a cap of 1: the count catches
// them.
func TestPermitHandoverUnderKills(t *testing.T) {
	t.Parallel()
	over, grants, distinct := handoverUnderKills(t, 1, 1)
	require.Zero(t, over)
	require.True(t, distinct, "tokens are unique")
	require.Positive(t, grants)

	over, _, _ = handoverUnderKills(t, 2, 1)
	require.Positive(t, over, "control: two permits, counted against one")
}
