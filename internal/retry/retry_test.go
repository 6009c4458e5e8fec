package retry_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence"
	"github.com/pgfence/pgfence/internal/retry"
)

func TestTransient(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		err  error
		want bool
	}{
		{"nil", nil, false},
		{"canceled", context.Canceled, false},
		{"deadline", context.DeadlineExceeded, false},
		{"wrapped deadline", fmt.Errorf("pool: %w", context.DeadlineExceeded), false},
		{"admin shutdown", &pgconn.PgError{Code: "57P01"}, true},
		{"starting up", &pgconn.PgError{Code: "57P03"}, true},
		{"read only", fmt.Errorf("x: %w", &pgconn.PgError{Code: "25006"}), true},
		{"connection failure", &pgconn.PgError{Code: "08006"}, true},
		{"serialization", &pgconn.PgError{Code: "40001"}, true},
		{"unique violation", &pgconn.PgError{Code: "23505"}, false},
		{"syntax", &pgconn.PgError{Code: "42601"}, false},
		{"insufficient privilege", &pgconn.PgError{Code: "42501"}, false},
		{"refused", fmt.Errorf("dial: %w", syscall.ECONNREFUSED), true},
		{"reset", syscall.ECONNRESET, true},
		{"eof", io.ErrUnexpectedEOF, true},
		{"plain", errors.New("boom"), false},
	} {
		require.Equal(t, tc.want, retry.Transient(tc.err), tc.name)
	}
}

func TestUnavailableWrapsBoth(t *testing.T) {
	t.Parallel()
	cause := &pgconn.PgError{Code: "57P01"}
	err := retry.Unavailable("pgfence: leasetable: ", cause)
	require.ErrorIs(t, err, pgfence.ErrUnavailable)
	var pgErr *pgconn.PgError
	require.ErrorAs(t, err, &pgErr)
	require.Equal(t, "57P01", pgErr.Code)
}

func TestBackoffBounds(t *testing.T) {
	t.Parallel()
	b := retry.Backoff{Min: 10 * time.Millisecond, Max: 80 * time.Millisecond}
	for n := 1; n <= 10; n++ {
		full := b.Min << (n - 1)
		if full > b.Max || n > 4 {
			full = b.Max
		}
		for i := 0; i < 100; i++ {
			w := b.Wait(n)
			require.GreaterOrEqual(t, w, full/2, "n=%d", n)
			require.LessOrEqual(t, w, full, "n=%d", n)
		}
	}
	ctx, cancel := context.WithCancelCause(context.Background())
	cancel(pgfence.ErrClosed)
	require.ErrorIs(t, retry.Backoff{Min: time.Hour, Max: time.Hour}.Sleep(ctx, 1), pgfence.ErrClosed)
}
