package pgserver_test

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence/internal/pgserver"
)

func start(t *testing.T, opts *pgserver.Options) *pgserver.Cluster {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, err := pgserver.StartCluster(ctx, pgserver.FindBinDir(), opts)
	require.NoError(t, err)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("server log:\n%s", c.LogTail())
		}
		c.Destroy()
	})
	return c
}

// hbaRules returns pg_hba.conf's rules as "type database auth_method".
func hbaRules(t *testing.T, conn *pgx.Conn) []string {
	t.Helper()
	rows, err := conn.Query(context.Background(),
		`SELECT type || ' ' || pg_catalog.array_to_string(database, ',') || ' ' || auth_method FROM pg_catalog.pg_hba_file_rules ORDER BY line_number`)
	require.NoError(t, err)
	rules, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	return rules
}

// cmdline returns a process's command line, arguments joined by spaces.
func cmdline(t *testing.T, pid int) string {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	require.NoError(t, err)
	return strings.ReplaceAll(string(b), "\x00", " ")
}

// By default the server listens on its private socket only, in a 0700
// directory owned by the server's user, and trusts nobody on TCP.
func TestSocketOnlyByDefault(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c := start(t, nil)
	require.False(t, c.TCP)

	st, err := os.Stat(c.Dir)
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o700), st.Mode().Perm())
	require.Equal(t, c.URL("postgres"), c.SocketURL("postgres"))
	u, err := url.Parse(c.URL("postgres"))
	require.NoError(t, err)
	require.Equal(t, c.Dir, u.Query().Get("host"))
	_, hasPassword := u.User.Password()
	require.False(t, hasPassword)

	conn, err := pgx.Connect(ctx, c.URL("postgres"))
	require.NoError(t, err)
	defer conn.Close(ctx)
	var listen, sockets, perms string
	require.NoError(t, conn.QueryRow(ctx, "SELECT pg_catalog.current_setting('listen_addresses'), "+
		"pg_catalog.current_setting('unix_socket_directories'), pg_catalog.current_setting('unix_socket_permissions')").
		Scan(&listen, &sockets, &perms))
	require.Equal(t, "", listen, "no TCP listener")
	require.Equal(t, c.Dir, sockets)
	require.Equal(t, "0700", perms)
	for _, r := range hbaRules(t, conn) {
		if !strings.HasPrefix(r, "local ") {
			require.True(t, strings.HasSuffix(r, " scram-sha-256"), "a TCP rule must require the password: %s", r)
		}
	}
}

// With TCP the server also listens on 127.0.0.1, where it requires the
// password; the password is not on any command line.
func TestTCPRequiresThePassword(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c := start(t, &pgserver.Options{TCP: true})
	require.True(t, c.TCP)
	require.Len(t, c.Password, 32)
	require.Contains(t, c.URL("postgres"), "127.0.0.1:")

	conn, err := pgx.Connect(ctx, c.URL("postgres"))
	require.NoError(t, err, "the URL carries the password")
	var listen string
	require.NoError(t, conn.QueryRow(ctx, "SELECT pg_catalog.current_setting('listen_addresses')").Scan(&listen))
	require.Equal(t, "127.0.0.1", listen)
	rules := hbaRules(t, conn)
	require.Contains(t, rules, "host all scram-sha-256")
	require.Contains(t, rules, "host replication scram-sha-256")
	for _, r := range rules {
		if !strings.HasPrefix(r, "local ") {
			require.True(t, strings.HasSuffix(r, " scram-sha-256"), "a TCP rule must require the password: %s", r)
		}
	}
	require.NoError(t, conn.Close(ctx))

	for name, user := range map[string]*url.Userinfo{
		"no password":    url.User("postgres"),
		"wrong password": url.UserPassword("postgres", "not-"+c.Password),
	} {
		u, err := url.Parse(c.URL("postgres"))
		require.NoError(t, err)
		u.User = user
		cfg, err := pgx.ParseConfig(u.String())
		require.NoError(t, err)
		if name == "no password" {
			cfg.Password = ""
		}
		_, err = pgx.ConnectConfig(ctx, cfg)
		require.Error(t, err, name)
		if name == "wrong password" {
			var pgErr *pgconn.PgError
			require.True(t, errors.As(err, &pgErr), "%s: %v", name, err)
			require.Equal(t, "28P01", pgErr.Code, name)
		}
	}
	require.NotContains(t, cmdline(t, c.Pid()), c.Password)
}

func TestOptionsMayNotOpenAccess(t *testing.T) {
	t.Parallel()
	for _, k := range []string{"listen_addresses", "port", "unix_socket_directories", "unix_socket_permissions"} {
		_, err := pgserver.StartCluster(context.Background(), pgserver.FindBinDir(),
			&pgserver.Options{Settings: map[string]string{k: "*"}})
		require.ErrorContains(t, err, "must not set "+k)
	}
}

// A standby streaming over TCP logs in with the primary's password, which
// no command line shows.
func TestStandbyOverTCP(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c := start(t, &pgserver.Options{TCP: true})
	sb, err := c.NewStandby(ctx, &pgserver.StandbyOptions{PrimaryAddr: fmt.Sprintf("127.0.0.1:%d", c.Port)})
	require.NoError(t, err)
	defer sb.Destroy()
	require.NotContains(t, cmdline(t, sb.Pid()), c.Password)

	conn, err := pgx.Connect(ctx, sb.URL("postgres"))
	require.NoError(t, err)
	defer conn.Close(ctx)
	var inRecovery bool
	require.NoError(t, conn.QueryRow(ctx, "SELECT pg_catalog.pg_is_in_recovery()").Scan(&inRecovery))
	require.True(t, inRecovery)

	require.NoError(t, c.Crash(syscall.SIGKILL))
	require.NoError(t, sb.Promote(ctx))
}

func TestStandbyOverTCPNeedsATCPPrimary(t *testing.T) {
	t.Parallel()
	c := start(t, nil)
	_, err := c.NewStandby(context.Background(), &pgserver.StandbyOptions{PrimaryAddr: "127.0.0.1:1"})
	require.ErrorContains(t, err, "needs a primary that listens on TCP")
}

// AutoConfSettings go to postgresql.auto.conf, not the command line, so
// ALTER SYSTEM and a reload change them at run time; control: the same
// setting passed in Settings (on the command line) outranks ALTER SYSTEM.
func TestAutoConfSettingsChangeAtRunTime(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	// setting reads name in a new session, which sees the last reload.
	setting := func(c *pgserver.Cluster, name string) string {
		t.Helper()
		conn, err := pgx.Connect(ctx, c.URL("postgres"))
		require.NoError(t, err)
		defer conn.Close(ctx)
		var v string
		require.NoError(t, conn.QueryRow(ctx, "SELECT pg_catalog.current_setting($1)", name).Scan(&v))
		return v
	}
	alter := func(c *pgserver.Cluster, v string) {
		t.Helper()
		conn, err := pgx.Connect(ctx, c.URL("postgres"))
		require.NoError(t, err)
		defer conn.Close(ctx)
		_, err = conn.Exec(ctx, "ALTER SYSTEM SET fsync = "+v)
		require.NoError(t, err)
		_, err = conn.Exec(ctx, "SELECT pg_catalog.pg_reload_conf()")
		require.NoError(t, err)
	}
	// waitSetting polls until the server has processed the reload (it is
	// asynchronous) and name reads want.
	waitSetting := func(c *pgserver.Cluster, name, want string) {
		t.Helper()
		for i := 0; setting(c, name) != want; i++ {
			require.Less(t, i, 200, "%s did not become %s after the reload", name, want)
			time.Sleep(50 * time.Millisecond)
		}
	}

	c := start(t, &pgserver.Options{AutoConfSettings: map[string]string{"fsync": "on"}})
	require.Equal(t, "on", setting(c, "fsync"), "AutoConfSettings override the package's default (off)")
	require.NotContains(t, cmdline(t, c.Pid()), "fsync=")
	alter(c, "off")
	waitSetting(c, "fsync", "off")

	ctl := start(t, &pgserver.Options{Settings: map[string]string{"fsync": "on"}})
	require.Contains(t, cmdline(t, ctl.Pid()), "fsync=on")
	// The reload is asynchronous: a second setting, not on the command
	// line, changed in the same reload, shows when it was processed.
	conn, err := pgx.Connect(ctx, ctl.URL("postgres"))
	require.NoError(t, err)
	defer conn.Close(ctx)
	_, err = conn.Exec(ctx, "ALTER SYSTEM SET log_min_duration_statement = 12345")
	require.NoError(t, err)
	alter(ctl, "off")
	waitSetting(ctl, "log_min_duration_statement", "12345ms")
	require.Equal(t, "on", setting(ctl, "fsync"), "control: a command-line setting outranks ALTER SYSTEM")

	_, err = pgserver.StartCluster(ctx, pgserver.FindBinDir(),
		&pgserver.Options{AutoConfSettings: map[string]string{"port": "1"}})
	require.ErrorContains(t, err, "must not set port")
}
