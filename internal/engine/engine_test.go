package engine_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence"
	"github.com/pgfence/pgfence/internal/engine"
	"github.com/pgfence/pgfence/internal/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// The documented signatures of engines that cannot run here: version()
// strings as their docs print them, and their settings.
func TestIdentify(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		version  string
		settings []string
		want     engine.Kind
	}{
		{"PostgreSQL 15.8 (Debian 15.8-0+deb12u1) on x86_64-pc-linux-gnu, compiled by gcc", nil, engine.PostgreSQL},
		{"PostgreSQL 16.4 on aarch64-unknown-linux-gnu, compiled by gcc (GCC) 7.3.1 20180712 (Red Hat 7.3.1-12), 64-bit", nil, engine.PostgreSQL},
		{"PostgreSQL 11.2-YB-2.20.1.0-b0 on x86_64-pc-linux-gnu, compiled by clang version 16.0.6, 64-bit", nil, engine.YugabyteDB},
		{"PostgreSQL 15.2-YB-2.25.0.0-b0 on x86_64-pc-linux-gnu", []string{"yb_enable_optimizer_statistics"}, engine.YugabyteDB},
		{"PostgreSQL 11.2", []string{"yb_read_from_followers"}, engine.YugabyteDB},
		{"CockroachDB CCL v23.2.0 (x86_64-pc-linux-gnu, built 2023/12/20 17:24:16, go1.21.5 X:nocoverageredesign)", nil, engine.CockroachDB},
		{"PostgreSQL 13.0", []string{"crdb_version"}, engine.CockroachDB},
		{"PostgreSQL 16.3 on x86_64-pc-linux-gnu, compiled by gcc", []string{"neon.tenant_id", "neon.timeline_id"}, engine.Neon},
	} {
		require.Equal(t, c.want, engine.Identify(c.version, c.settings), c.version)
	}
}

// fakeRow answers Scan with fixed values.
type fakeRow []any

func (r fakeRow) Scan(dest ...any) error {
	for i, d := range dest {
		switch d := d.(type) {
		case *string:
			*d = r[i].(string)
		case *[]string:
			*d = r[i].([]string)
		case *bool:
			*d = r[i].(bool)
		}
	}
	return nil
}

// fakeSource answers identifySQL with its version and settings; any other
// statement fails the test (Read must stop at an engine it refuses).
type fakeSource struct {
	t        *testing.T
	version  string
	settings []string
}

func (f fakeSource) QueryRow(_ context.Context, sql string, _ ...any) pgx.Row {
	require.True(f.t, strings.Contains(sql, "pg_catalog.version()"), "Read sent %q to an engine it refuses", sql)
	return fakeRow{f.version, f.settings}
}

// Read refuses YugabyteDB and CockroachDB by their signatures, with an
// error matching pgfence.ErrUnsafeServer, after one statement.
func TestRefusesEnginesBySignature(t *testing.T) {
	t.Parallel()
	for _, src := range []fakeSource{
		{t, "PostgreSQL 11.2-YB-2.20.1.0-b0 on x86_64-pc-linux-gnu", nil},
		{t, "CockroachDB CCL v24.1.0 (x86_64-pc-linux-gnu)", []string{"crdb_version"}},
	} {
		f, err := engine.Read(t.Context(), src)
		require.NoError(t, err)
		require.ErrorIs(t, f.Refusal(), pgfence.ErrUnsafeServer, src.version)
	}
}

// The local server is PostgreSQL, a primary with no standby: accepted,
// without warnings.
func TestLocalServer(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDB(t)
	f, err := engine.Read(t.Context(), db.Pool)
	require.NoError(t, err)
	require.Equal(t, engine.PostgreSQL, f.Kind)
	require.False(t, f.InRecovery)
	require.NoError(t, f.Refusal())
	require.Empty(t, f.Warnings())
}

// Against real replication: a standby is refused; a primary with an
// asynchronous standby is accepted with a warning, also for a role that
// cannot read sync_state (synchronous_standby_names is empty, so every
// standby is asynchronous); with a synchronous standby there is no warning
// (the control).
func TestStandbysAndReplication(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for _, sync := range []bool{false, true} {
		// The maintenance database: a test database's drop at cleanup would
		// wait for the synchronous standby, destroyed before it.
		c, _ := pgtest.NewCluster(t, nil)
		sb := pgtest.NewStandby(t, c, &pgtest.StandbyOptions{Synchronous: sync})
		primary, err := pgx.Connect(ctx, c.URL("postgres"))
		require.NoError(t, err)
		defer func() { _ = primary.Close(context.Background()) }()

		f, err := engine.Read(ctx, primary)
		require.NoError(t, err)
		require.NoError(t, f.Refusal())
		require.Len(t, f.Standbys, 1)
		if sync {
			require.Equal(t, "sync", f.Standbys[0].SyncState)
			require.Empty(t, f.Warnings(), "control: a synchronous standby")
		} else {
			require.Equal(t, "async", f.Standbys[0].SyncState)
			w := f.Warnings()
			require.Len(t, w, 1)
			require.Equal(t, "async_standby", w[0].Reason)

			_, err := primary.Exec(ctx, "CREATE ROLE engine_test_app LOGIN")
			require.NoError(t, err)
			cfg, err := pgx.ParseConfig(c.SocketURL("postgres")) // the socket trusts every role
			require.NoError(t, err)
			cfg.User = "engine_test_app"
			app, err := pgx.ConnectConfig(ctx, cfg)
			require.NoError(t, err)
			f, err = engine.Read(ctx, app)
			require.NoError(t, err)
			require.Empty(t, f.Standbys[0].SyncState, "the role may not read sync_state")
			require.Len(t, f.Warnings(), 1, "yet the standby is known to be asynchronous")
			require.NoError(t, app.Close(ctx))
		}

		conn, err := pgx.Connect(ctx, sb.URL("postgres"))
		require.NoError(t, err)
		f, err = engine.Read(ctx, conn)
		require.NoError(t, err)
		require.True(t, f.InRecovery)
		require.ErrorIs(t, f.Refusal(), pgfence.ErrUnsafeServer)
		require.NoError(t, conn.Close(ctx))
	}
}

// The warning rule: standbys of which none is synchronous. An
// asynchronous replica beside a synchronous standby (Patroni's
// synchronous_mode with three nodes) is not warned of; states the role may
// not read count as asynchronous only when synchronous_standby_names is
// empty.
func TestWarnings(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		names  string
		states []string
		warn   bool
	}{
		{"", nil, false},
		{"", []string{"async"}, true},
		{"", []string{""}, true},
		{"node2", []string{""}, false},
		{"node2", []string{"sync", "async"}, false},
		{"ANY 1 (a, b)", []string{"quorum", "quorum"}, false},
		{"node2", []string{"potential", "async"}, true},
	} {
		f := engine.Facts{Kind: engine.PostgreSQL, SyncNames: c.names}
		for i, s := range c.states {
			f.Standbys = append(f.Standbys, engine.Standby{Name: fmt.Sprint("s", i), SyncState: s})
		}
		require.Equal(t, c.warn, len(f.Warnings()) == 1, "%+v", c)
	}
}

// TestEngineRefusalLeavesTheStandbyToRefusal: the doctor reports an engine
// that cannot run pgfence as a server failure and a standby as a standby,
// so EngineRefusal judges the engine alone (a Neon replica passes it) while
// Refusal, which New uses, refuses both.
func TestEngineRefusalLeavesTheStandbyToRefusal(t *testing.T) {
	t.Parallel()
	replica := engine.Facts{Kind: engine.Neon, InRecovery: true}
	require.NoError(t, replica.EngineRefusal())
	require.ErrorIs(t, replica.Refusal(), pgfence.ErrUnsafeServer)
	for _, k := range []engine.Kind{engine.YugabyteDB, engine.CockroachDB} {
		f := engine.Facts{Kind: k}
		require.ErrorIs(t, f.EngineRefusal(), pgfence.ErrUnsafeServer)
		require.ErrorIs(t, f.Refusal(), pgfence.ErrUnsafeServer)
	}
	require.NoError(t, engine.Facts{Kind: engine.PostgreSQL}.Refusal())
}
