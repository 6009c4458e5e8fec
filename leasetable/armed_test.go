package leasetable_test

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence"
	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/leasetable"
)

// TestArmedWaiterWoken: a waiter that registers while its Locker still
// holds the name's interest key (a wait just before, within the linger) is
// armed: it is not woken when it first waits for notifications, since every
// release after its registration notifies. A release that comes after its
// refused attempt but before that first wait (here, injected there) must
// therefore reach it. A permit waiter shows it: its refused attempts note
// nothing that would watch the name (a lease's note the holder's token).
// Negative control: with the name watched only from that first wait, the
// notification is dropped and the waiter sleeps until the holder's expiry.
func TestArmedWaiterWoken(t *testing.T) {
	t.Parallel()
	run := func(t *testing.T, late bool) error {
		ctx := t.Context()
		db := pgtest.NewDB(t)
		logs := newLogWatch()
		a := newLocker(t, db.NewPool(t, nil), &leasetable.Config{Owner: "a", Logger: logs.logger()})
		b := newLocker(t, db.NewPool(t, nil), &leasetable.Config{Owner: "b"})
		if late {
			leasetable.SetLateWatch(a)
		}
		// The wake-up by notification is under test: a's line head
		// registers no claim, so b's releases notify instead of handing
		// the permit over (handover_test.go).
		leasetable.SetNoClaim(a)
		notified := make(chan struct{}, 16)
		leasetable.SetOnNotify(a, func() {
			select {
			case notified <- struct{}{}:
			default:
			}
		})
		var inject atomic.Pointer[pgfence.Lease]
		leasetable.SetOnListen(a, func() {
			if l := inject.Swap(nil); l != nil {
				for len(notified) > 0 { // earlier ones
					<-notified
				}
				require.NoError(t, (*l).Release(ctx))
				select { // a's LISTEN connection has handled the release's notification
				case <-notified:
				case <-time.After(10 * time.Second):
					t.Error("the release's notification never reached a")
				}
			}
		})
		// A first wait takes the interest key, which stays held for the
		// linger after a is served.
		permit := func(wait time.Duration) <-chan acquired {
			got := make(chan acquired, 1)
			go func() {
				l, err := a.AcquirePermit(ctx, "n", 1, &leasetable.AcquireOpts{WaitTimeout: wait})
				got <- acquired{l, err}
			}()
			return got
		}
		held, err := b.TryAcquirePermit(ctx, "n", 1, nil)
		require.NoError(t, err)
		got := permit(10 * time.Second)
		require.Eventually(t, func() bool { return leasetable.InterestHeld(a, "n"+leasetable.PermitSeparator) },
			10*time.Second, time.Millisecond, "a waits, registered for the semaphore")
		require.NoError(t, held.Release(ctx))
		r := <-got
		require.NoError(t, r.err)
		require.NoError(t, r.l.Release(ctx))

		// Within the linger: registered armed; b releases between a's
		// refused attempt and its first wait for notifications. a leaves
		// the database's line after its call returned: until then b's
		// attempt would be refused for the line.
		require.Eventually(t, func() bool { return inLine(t, db, "n", true) == 0 }, 10*time.Second, time.Millisecond)
		held, err = b.TryAcquirePermit(ctx, "n", 1, &leasetable.AcquireOpts{TTL: 20 * time.Second})
		require.NoError(t, err)
		inject.Store(&held)
		r = <-permit(3 * time.Second)
		if r.err == nil {
			require.NoError(t, r.l.Release(ctx))
		}
		return r.err
	}
	t.Run("fixed", func(t *testing.T) {
		t.Parallel()
		require.NoError(t, run(t, false), "the release reached the armed waiter")
	})
	t.Run("control", func(t *testing.T) {
		t.Parallel()
		require.ErrorIs(t, run(t, true), pgfence.ErrNotAcquired, "control: watched late, the armed waiter misses the release")
	})
}
