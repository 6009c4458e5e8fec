package leasetable

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestResolveDefaults(t *testing.T) {
	t.Parallel()
	s, err := (*Config)(nil).resolve()
	require.NoError(t, err)
	require.Equal(t, DefaultTTL, s.TTL)
	require.Equal(t, DefaultTTL/3, s.RenewInterval)
	require.Equal(t, DefaultTTL/10, s.SafetyMargin)
	require.Equal(t, DefaultQueryTimeout, s.QueryTimeout)
	require.NotEmpty(t, s.Owner)
	require.NotNil(t, s.Logger)
	require.Equal(t, DefaultListenCheckInterval, s.ListenCheckInterval)

	off, err := (&Config{ListenCheckInterval: -1}).resolve()
	require.NoError(t, err)
	require.Negative(t, off.ListenCheckInterval, "a negative interval turns the check off")
	_, err = (&Config{ListenCheckInterval: 99 * time.Millisecond}).resolve()
	require.ErrorContains(t, err, "Config.ListenCheckInterval is 99ms; it must be at least 100ms")

	other, err := (&Config{}).resolve()
	require.NoError(t, err)
	require.NotEqual(t, s.Owner, other.Owner, "default owners are unique per Locker")
	require.True(t, strings.Count(s.Owner, "/") >= 2, "owner %q is host/pid/random", s.Owner)
}

func TestTimingScalesWithTTL(t *testing.T) {
	t.Parallel()
	s, err := (&Config{TTL: 30 * time.Second, RenewInterval: 6 * time.Second, SafetyMargin: 3 * time.Second}).resolve()
	require.NoError(t, err)
	for _, tc := range []struct {
		name string
		opts *AcquireOpts
		want leaseTiming
	}{
		{"nil opts", nil, leaseTiming{ttl: 30 * time.Second, renewEvery: 6 * time.Second, margin: 3 * time.Second}},
		{"zero TTL", &AcquireOpts{AtLeast: time.Minute},
			leaseTiming{ttl: 30 * time.Second, renewEvery: 6 * time.Second, margin: 3 * time.Second, atLeast: time.Minute}},
		{"same TTL", &AcquireOpts{TTL: 30 * time.Second},
			leaseTiming{ttl: 30 * time.Second, renewEvery: 6 * time.Second, margin: 3 * time.Second}},
		{"longer TTL", &AcquireOpts{TTL: time.Hour},
			leaseTiming{ttl: time.Hour, renewEvery: 12 * time.Minute, margin: 6 * time.Minute}},
		{"shorter TTL", &AcquireOpts{TTL: 3 * time.Second},
			leaseTiming{ttl: 3 * time.Second, renewEvery: 600 * time.Millisecond, margin: 300 * time.Millisecond}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := s.timing(tc.opts)
			require.NoError(t, err)
			require.Equal(t, tc.want, got)
		})
	}
}
