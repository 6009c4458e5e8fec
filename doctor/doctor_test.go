package doctor_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence/doctor"
	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/migrations"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// check runs the doctor against url and returns its findings by check.
func check(t *testing.T, url string, cfg *doctor.Config) map[string]doctor.Finding {
	t.Helper()
	cc, err := pgx.ParseConfig(url)
	require.NoError(t, err)
	r, err := doctor.Check(t.Context(), cc, cfg)
	require.NoError(t, err)
	by := map[string]doctor.Finding{}
	for _, f := range r.Findings {
		require.NotContains(t, by, f.Check, "one finding per check")
		require.True(t, f.Level == doctor.OK || f.Fix != "", "a %s finding says how to fix it: %+v", f.Level, f)
		by[f.Check] = f
	}
	return by
}

func levels(by map[string]doctor.Finding) map[string]doctor.Level {
	out := map[string]doctor.Level{}
	for k, f := range by {
		out[k] = f.Level
	}
	return out
}

// The local test server, checked as the install's owner: everything is
// fine but that the owner connects (a warning), and that
// idle_in_transaction_session_timeout is off (a warning, gone once set).
func TestLocalServer(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDB(t)
	by := check(t, db.URL, nil)
	require.Equal(t, map[string]doctor.Level{
		"server": doctor.OK, "standby": doctor.OK, "replication": doctor.OK, "schema": doctor.OK, "grants": doctor.Warn,
		"pooler": doctor.OK, "notify_queue": doctor.OK, "clock": doctor.OK, "timeouts": doctor.Warn,
	}, levels(by))
	require.Contains(t, by["server"].Detail, "PostgreSQL")
	require.Contains(t, by["schema"].Detail, fmt.Sprintf("version %d", migrations.Latest()))
	require.Contains(t, by["grants"].Detail, "owns the install")
	require.Contains(t, by["pooler"].Detail, "directly")

	_, err := db.Pool.Exec(t.Context(), "ALTER DATABASE "+pgx.Identifier{db.Name}.Sanitize()+" SET idle_in_transaction_session_timeout = '1min'")
	require.NoError(t, err)
	require.Equal(t, doctor.OK, check(t, db.URL, nil)["timeouts"].Level)
}

// The grants of a named role: missing ones are a failure naming each and
// the command that grants them; after migrations.Grant, none. The
// operator grant is checked on request.
func TestGrantsOfARole(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	db := pgtest.NewDB(t)
	role := "doctor_app_" + strings.ToLower(strings.ReplaceAll(db.Name, "-", "_"))
	_, err := db.Pool.Exec(ctx, "CREATE ROLE "+pgx.Identifier{role}.Sanitize())
	require.NoError(t, err)
	t.Cleanup(func() {
		_, _ = db.Pool.Exec(context.Background(), "DROP OWNED BY "+pgx.Identifier{role}.Sanitize())
		_, _ = db.Pool.Exec(context.Background(), "DROP ROLE "+pgx.Identifier{role}.Sanitize())
	})

	g := check(t, db.URL, &doctor.Config{Role: role})["grants"]
	require.Equal(t, doctor.Fail, g.Level)
	require.Contains(t, g.Detail, "EXECUTE on function")
	require.Contains(t, g.Fix, "pgfence grant --schema pgfence "+role)

	require.NoError(t, migrations.Grant(ctx, migrations.Target{URL: db.URL}, role, nil, nil))
	require.Equal(t, doctor.OK, check(t, db.URL, &doctor.Config{Role: role})["grants"].Level)
	op := check(t, db.URL, &doctor.Config{Role: role, Operator: true})["grants"]
	require.Equal(t, doctor.Fail, op.Level)
	require.Contains(t, op.Detail, "pgfence_force_release")
}

// A schema without pgfence is a failure, and its grants are not checked.
func TestMissingSchema(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDB(t)
	by := check(t, db.URL, &doctor.Config{Schema: "elsewhere"})
	require.Equal(t, doctor.Fail, by["schema"].Level)
	require.Contains(t, by["schema"].Detail, `schema "elsewhere" does not exist`)
	require.NotContains(t, by, "grants")
}

// Against real replication: a primary with an asynchronous standby warns;
// the standby itself fails the standby check.
func TestStandby(t *testing.T) {
	t.Parallel()
	c, srv := pgtest.NewCluster(t, nil)
	db := srv.NewDB(t)
	sb := pgtest.NewStandby(t, c, nil)

	primary := check(t, db.URL, nil)
	require.Equal(t, doctor.OK, primary["standby"].Level)
	require.Equal(t, doctor.Warn, primary["replication"].Level)
	require.Contains(t, primary["replication"].Detail, "no synchronous standby")

	cc, err := pgx.ParseConfig(db.URL)
	require.NoError(t, err)
	cc.Port = uint16(sb.Port)
	r, err := doctor.Check(t.Context(), cc, nil)
	require.NoError(t, err)
	require.Equal(t, doctor.Fail, r.Worst())
	var standby doctor.Finding
	for _, f := range r.Findings {
		if f.Check == "standby" {
			standby = f
		}
	}
	require.Equal(t, doctor.Fail, standby.Level)
	require.Contains(t, standby.Detail, "standby in recovery")
}

// Check fails only when it cannot connect.
func TestCannotConnect(t *testing.T) {
	t.Parallel()
	cc, err := pgx.ParseConfig("postgres://nobody@127.0.0.1:1/none?connect_timeout=2")
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	_, err = doctor.Check(ctx, cc, nil)
	require.ErrorContains(t, err, "pgfence: doctor: connect")
}
