//go:build chaos

package chaos_test

import (
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/test/chaos"
)

// runHTTPRegister runs the workload with a SimLocker whose grants lapse
// while their holders sleep (up to 4x the TTL), against a register behind
// an HTTP service in a database of its own, fenced by fencehttp or not.
func runHTTPRegister(t *testing.T, fenced bool) (chaos.History, chaos.RegisterState) {
	t.Helper()
	ctx := ctxFor(t, 3*time.Minute)
	locks, data := pgtest.NewDB(t), pgtest.NewDB(t)
	h, err := chaos.HTTPRegisterHandler(ctx, data.Pool, "chaos_register", fenced)
	require.NoError(t, err)
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	reg := &chaos.HTTPRegister{URL: srv.URL, Client: srv.Client(), Fenced: fenced}
	lk, err := chaos.NewSimLocker(locks.Pool, 2*time.Millisecond)
	require.NoError(t, err)
	ops, dur := soak(120, 0)
	hist, err := chaos.Run(ctx, chaos.WorkloadConfig{
		Locker: lk, Register: reg, Workers: 4, Ops: ops, Duration: dur, MaxSleep: 8 * time.Millisecond, Seed: 7,
	})
	require.NoError(t, err)
	final, err := reg.Final(ctx, data.Pool, "chaos_register")
	require.NoError(t, err)
	return hist, final
}

// Holders whose grants overlap write through fencehttp's middleware, the
// lock's tokens drawn in one database and checked by the fence registry of
// the service's: the history stays linearizable and no update is lost.
func TestHTTPRegisterFencedOverlappingHolders(t *testing.T) {
	t.Parallel()
	h, final := runHTTPRegister(t, true)
	fenced := 0
	for _, op := range h {
		if op.Fenced {
			fenced++
		}
	}
	t.Logf("fenced operations: %d of %d", fenced, len(h))
	require.Positive(t, fenced, "the holders overlapped")
	verdict(t, h, &chaos.CheckOpts{Name: "http-fenced-overlap", Final: &final.Value, Claim: true}, false)
}

// Negative control: the same service without the middleware loses updates;
// the checker must say so.
func TestHTTPRegisterUnfencedIsDetected(t *testing.T) {
	t.Parallel()
	h, final := runHTTPRegister(t, false)
	verdict(t, h, &chaos.CheckOpts{Name: "negative-control-http-unfenced", Final: &final.Value}, true)
}
