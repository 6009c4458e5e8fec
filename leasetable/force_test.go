package leasetable_test

import (
	"context"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence"
	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/leasetable"
)

// sessionOf returns the session_user and client address of a connection
// of pool, as pgfence_forced_releases records them.
func sessionOf(t *testing.T, pool *pgxpool.Pool) (string, netip.Addr) {
	t.Helper()
	var (
		user string
		addr *netip.Prefix
	)
	require.NoError(t, pool.QueryRow(context.Background(),
		"SELECT session_user::text, inet_client_addr()").Scan(&user, &addr))
	if addr == nil {
		return user, netip.Addr{}
	}
	return user, addr.Addr()
}

// ForceRelease ends a lease whoever holds it: the holder loses it, waiters
// get it with a larger token, and the release is recorded for operators.
func TestForceRelease(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.NewDB(t)
	holder := newLocker(t, db.NewPool(t, nil), &leasetable.Config{Owner: "holder"})
	logs := newLogWatch()
	waiter := newLocker(t, db.NewPool(t, nil), &leasetable.Config{Owner: "waiter", Logger: logs.logger()})
	// Over TCP, so that the audit trail has a client address to record.
	opsPool := db.NewTCPPool(t, nil)
	operator := newLocker(t, opsPool, &leasetable.Config{Owner: "operator"})

	// The holder's lease outlives the waiter's deadline: only the forced
	// release's notification can hand it over in time.
	l, err := holder.TryAcquire(ctx, "stuck", &leasetable.AcquireOpts{TTL: time.Hour})
	require.NoError(t, err)
	waiting := logs.next("waiting for lease")
	got := make(chan acquired, 1)
	go func() {
		wctx, cancel := context.WithTimeout(ctx, time.Minute)
		defer cancel()
		l, err := waiter.Acquire(wctx, "stuck", nil)
		got <- acquired{l, err}
	}()
	waitFor(t, waiting, "the waiter to wait")

	r, err := operator.ForceRelease(ctx, "stuck", "job hung since the deploy")
	require.NoError(t, err)
	require.Equal(t, "stuck", r.Name)
	require.Equal(t, "holder", r.OldOwner)
	require.Equal(t, l.Token(), r.OldToken)
	require.True(t, r.WasHeld)
	require.Greater(t, r.Token, l.Token(), "the row gets a fresh token")
	require.Equal(t, "job hung since the deploy", r.Reason)

	// The waiter is woken and takes it over with a larger token still.
	w := <-got
	require.NoError(t, w.err)
	require.Greater(t, w.l.Token(), r.Token)

	// The old holder learns it lost the lease on its next renewal.
	err = l.Renew(ctx)
	require.ErrorIs(t, err, pgfence.ErrLeaseLost)
	requireClosed(t, l.Done(), "the old holder's Done")
	require.ErrorIs(t, l.Release(ctx), pgfence.ErrNotHeld)
	info, ok, err := operator.Get(ctx, "stuck")
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, "waiter", info.Owner, "the old holder's Release left the new holder alone")
	require.Equal(t, w.l.Token(), info.Token)

	// The audit trail survives the next acquire.
	user, addr := sessionOf(t, opsPool)
	require.True(t, addr.IsValid(), "a TCP client has an address")
	audit, err := operator.ForcedReleases(ctx, 10)
	require.NoError(t, err)
	require.Len(t, audit, 1)
	a := audit[0]
	require.Equal(t, user, a.ReleasedBy)
	require.Equal(t, addr, a.ClientAddr)
	require.False(t, a.ReleasedAt.IsZero())
	a.ReleasedBy, a.ClientAddr, a.ReleasedAt = r.ReleasedBy, r.ClientAddr, r.ReleasedAt
	require.Equal(t, r, a, "the record says what ForceRelease returned")

	// A lease no longer held is recorded as such; the newest comes first.
	require.NoError(t, w.l.Release(ctx))
	r2, err := operator.ForceRelease(ctx, "stuck", "")
	require.NoError(t, err)
	require.False(t, r2.WasHeld)
	require.Equal(t, w.l.Token(), r2.OldToken)
	audit, err = operator.ForcedReleases(ctx, 10)
	require.NoError(t, err)
	require.Len(t, audit, 2)
	require.Equal(t, r2.Token, audit[0].Token)
	require.Equal(t, r.Token, audit[1].Token)
	audit, err = operator.ForcedReleases(ctx, 1)
	require.NoError(t, err)
	require.Len(t, audit, 1, "limit")
	require.Equal(t, r2.Token, audit[0].Token)
}

func TestForceReleaseOfAnUnknownNameOrBadInput(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.NewDB(t)
	k := newLocker(t, db.Pool, nil)

	_, err := k.ForceRelease(ctx, "never-used", "why")
	require.ErrorIs(t, err, leasetable.ErrNoLease)
	_, err = k.ForceRelease(ctx, "", "why")
	require.ErrorContains(t, err, "empty")
	_, err = k.ForceRelease(ctx, "x", strings.Repeat("r", leasetable.MaxNameLength+1))
	require.ErrorContains(t, err, "reason")
	_, err = k.ForcedReleases(ctx, 0)
	require.ErrorContains(t, err, "limit")
	audit, err := k.ForcedReleases(ctx, 10)
	require.NoError(t, err)
	require.Empty(t, audit, "nothing recorded")
	require.Zero(t, countRows(t, db), "nothing written")

	k.Close()
	_, err = k.ForceRelease(ctx, "x", "")
	require.ErrorIs(t, err, pgfence.ErrClosed)
	_, err = k.ForcedReleases(ctx, 1)
	require.ErrorIs(t, err, pgfence.ErrClosed)
}
