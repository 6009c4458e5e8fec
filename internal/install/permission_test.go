package install_test

import (
	"errors"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence/internal/install"
)

func TestWrap(t *testing.T) {
	t.Parallel()
	denied := &pgconn.PgError{Severity: "ERROR", Code: "42501", Message: "permission denied for table pgfence_schema_migrations"}
	for _, tc := range []struct {
		name    string
		err     error
		role    string
		schema  string
		missing []string
		want    string
	}{
		{"named", fmt.Errorf("read: %w", denied), "app", "pgfence", []string{`USAGE on schema "pgfence"`},
			"read: ERROR: permission denied for table pgfence_schema_migrations (SQLSTATE 42501); " +
				"hint: as pgfence's owner, run `pgfence grant app` (missing: USAGE on schema \"pgfence\")"},
		{"from the message", denied, "", "", nil,
			"ERROR: permission denied for table pgfence_schema_migrations (SQLSTATE 42501); " +
				"hint: as pgfence's owner, run `pgfence grant ROLE` (missing: privilege on table pgfence_schema_migrations)"},
		{"other schema, quoted role", denied, "Ro le", "Locks", []string{"a", "b"},
			"ERROR: permission denied for table pgfence_schema_migrations (SQLSTATE 42501); " +
				"hint: as pgfence's owner, run `pgfence grant 'Ro le' --schema Locks` (missing: a, b)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := install.WrapPermission(tc.err, tc.role, tc.schema, tc.missing...)
			require.EqualError(t, err, tc.want)
			var pgErr *pgconn.PgError
			require.ErrorAs(t, err, &pgErr)
			require.Same(t, denied, pgErr)
			var pe *install.PermissionError
			require.ErrorAs(t, err, &pe)
			require.Same(t, err, install.WrapPermission(err, "other", ""), "wrapped once")
		})
	}

	other := &pgconn.PgError{Code: "42P01", Message: "relation does not exist"}
	require.Same(t, error(other), install.WrapPermission(other, "app", ""))
	plain := errors.New("plain")
	require.Same(t, plain, install.WrapPermission(plain, "app", ""))
	require.NoError(t, install.WrapPermission(nil, "app", ""))
}
