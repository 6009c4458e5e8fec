package main_test

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence/internal/pgtest"
)

// doctorOutput is doctor --json's output.
type doctorOutput struct {
	Findings []struct {
		Check, Level, Detail, Fix string
	}
	Worst string
}

// doctor's exit codes: 3 for warnings only (as the owner, who should not
// be the application's role), 0 once every finding is ok (as a granted
// role, in a database with idle_in_transaction_session_timeout), 4 for a
// failure (the role not granted, named with --role), 1 when the database
// cannot be reached; the human output has one line per check.
func TestDoctor(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDB(t)
	role, roleURL := newRole(t, db)
	owner := dbEnv(db)

	r := pgfence(t, owner, "", "doctor", "--json")
	require.Equal(t, 3, r.code, r.stderr)
	var out doctorOutput
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &out))
	require.Equal(t, "warn", out.Worst)
	require.Len(t, out.Findings, 9)

	r = pgfence(t, owner, "", "doctor", "--role", role)
	require.Equal(t, 4, r.code, r.stderr)
	require.Contains(t, r.stdout, "FAIL  grants")
	require.Contains(t, r.stdout, "fix: as ")

	r = pgfence(t, owner, "", "grant", role)
	require.Equal(t, 0, r.code, r.stderr)
	_, err := db.Pool.Exec(context.Background(), "ALTER DATABASE "+pgx.Identifier{db.Name}.Sanitize()+" SET idle_in_transaction_session_timeout = '1min'")
	require.NoError(t, err)
	r = pgfence(t, []string{"DATABASE_URL=" + roleURL}, "", "doctor")
	require.Equal(t, 0, r.code, r.stdout+r.stderr)
	require.NotContains(t, r.stdout, "WARN")

	r = pgfence(t, []string{"DATABASE_URL=postgres://nobody@127.0.0.1:1/none?connect_timeout=2"}, "", "doctor")
	require.Equal(t, 1, r.code)
	require.Contains(t, r.stderr, "pgfence: doctor: connect")
}
