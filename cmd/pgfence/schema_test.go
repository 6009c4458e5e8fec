package main_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"net/url"
	"strconv"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence/internal/pgtest"
)

// reinstall moves the database's pgfence install from schema pgfence to
// schema, through the CLI.
func reinstall(t *testing.T, db *pgtest.DB, schema string) {
	t.Helper()
	r := pgfence(t, dbEnv(db), "", "migrate", "down", "--yes")
	require.Equal(t, 0, r.code, r.stderr)
	r = pgfence(t, dbEnv(db), "", "migrate", "up", "--schema", schema)
	require.Equal(t, 0, r.code, r.stderr)
}

// Every command works on an install in another schema given with --schema,
// and fails on the default one, where nothing is installed.
func TestCommandsUseTheSchema(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.NewDB(t)
	reinstall(t, db, "Ops Locks")
	env := dbEnv(db)
	s := []string{"--schema", "Ops Locks"}

	r := pgfence(t, env, "", append([]string{"run", "job"}, append(s, "--", "sh", "-c", "echo $PGFENCE_TOKEN")...)...)
	require.Equal(t, 0, r.code, r.stderr)
	var token int64
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT fence FROM "Ops Locks".pgfence_leases WHERE name = 'job'`).Scan(&token))
	require.Equal(t, strconv.FormatInt(token, 10), strings.TrimSpace(r.stdout), "the token came from that schema's table")

	r = pgfence(t, env, "", append([]string{"ls", "--json"}, s...)...)
	require.Equal(t, 0, r.code, r.stderr)
	require.Empty(t, decodeLs(t, r.stdout).Leases, "run released its leases")

	r = pgfence(t, env, "", append([]string{"release", "--force", "--yes", "job", "--reason", "schema test"}, s...)...)
	require.Equal(t, 0, r.code, r.stderr)
	r = pgfence(t, env, "", append([]string{"ls", "--forced", "--json"}, s...)...)
	require.Equal(t, 0, r.code, r.stderr)
	require.Contains(t, r.stdout, `"reason": "schema test"`)
	r = pgfence(t, env, "", append([]string{"prune"}, s...)...)
	require.Equal(t, 0, r.code, r.stderr)
	r = pgfence(t, env, "", append([]string{"demo", "--database", db.URL}, s...)...)
	requireStory(t, r)
	r = pgfence(t, env, "", append([]string{"migrate", "version"}, s...)...)
	require.Equal(t, 0, r.code, r.stderr)
	require.Empty(t, r.stderr, "no migration is pending")

	for _, args := range [][]string{{"ls"}, {"prune"}, {"release", "--force", "--yes", "job"}, {"run", "job", "--", "true"}} {
		r = pgfence(t, env, "", args...)
		require.NotEqual(t, 0, r.code, "%v on the default schema", args)
		require.Contains(t, r.stderr, `schema "pgfence" has no pgfence_leases table`, "%v", args)
	}
	r = pgfence(t, env, "", "ls", "--schema", "")
	require.Equal(t, 2, r.code)
	require.Contains(t, r.stderr, "--schema is empty")
}

// newRole creates a login role with a password for the test and returns a
// URL to db as that role. The role and its grants go at cleanup.
func newRole(t *testing.T, db *pgtest.DB) (role, roleURL string) { // over TCP, with a password: the audit records the address
	t.Helper()
	ctx := context.Background()
	var rnd [6]byte
	_, _ = rand.Read(rnd[:])
	role = "app_" + hex.EncodeToString(rnd[:])
	password := hex.EncodeToString(rnd[:]) + "-pw"
	_, err := db.Pool.Exec(ctx, "CREATE ROLE "+pgx.Identifier{role}.Sanitize()+" LOGIN PASSWORD '"+password+"'")
	require.NoError(t, err)
	t.Cleanup(func() {
		_, err := db.Pool.Exec(ctx, "DROP OWNED BY "+pgx.Identifier{role}.Sanitize())
		require.NoError(t, err)
		_, err = db.Pool.Exec(ctx, "DROP ROLE "+pgx.Identifier{role}.Sanitize())
		require.NoError(t, err)
	})
	u, err := url.Parse(db.TCPURL)
	require.NoError(t, err)
	u.User = url.UserPassword(role, password)
	return role, u.String()
}

// grant gives an application role what it needs and nothing more; with
// --operator it may also force-release and read the audit trail.
func TestGrant(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDB(t)
	role, roleURL := newRole(t, db)
	owner := dbEnv(db)
	app := []string{"DATABASE_URL=" + roleURL}

	r := pgfence(t, app, "", "ls")
	require.Equal(t, 1, r.code, "before the grant")

	r = pgfence(t, owner, "", "grant", role)
	require.Equal(t, 0, r.code, r.stderr)
	require.Equal(t, `granted "`+role+`" use of pgfence in schema "pgfence"`+"\n", r.stdout)
	r = pgfence(t, owner, "", "grant", role)
	require.Equal(t, 0, r.code, "granting twice is harmless: %s", r.stderr)

	r = pgfence(t, app, "", "run", "job", "--", "true")
	require.Equal(t, 0, r.code, r.stderr)
	r = pgfence(t, app, "", "ls")
	require.Equal(t, 0, r.code, r.stderr)
	r = pgfence(t, app, "", "prune")
	require.Equal(t, 0, r.code, r.stderr)
	r = pgfence(t, app, "", "release", "--force", "--yes", "job")
	require.Equal(t, 1, r.code)
	require.Contains(t, r.stderr, "permission denied")
	require.Contains(t, r.stderr, "--operator")
	r = pgfence(t, app, "", "ls", "--forced")
	require.Equal(t, 1, r.code)
	require.Contains(t, r.stderr, "permission denied")

	r = pgfence(t, owner, "", "grant", "--operator", role)
	require.Equal(t, 0, r.code, r.stderr)
	r = pgfence(t, app, "", "release", "--force", "--yes", "job", "--reason", "on call: \x1b[31mstuck")
	require.Equal(t, 0, r.code, r.stderr)
	r = pgfence(t, app, "", "ls", "--forced", "--json")
	require.Equal(t, 0, r.code, r.stderr)
	var out struct {
		ForcedReleases []struct {
			Name       string `json:"name"`
			OldOwner   string `json:"old_owner"`
			OldToken   int64  `json:"old_token"`
			WasHeld    bool   `json:"was_held"`
			Token      int64  `json:"token"`
			Reason     string `json:"reason"`
			ReleasedBy string `json:"released_by"`
			ClientAddr string `json:"client_addr"`
			ReleasedAt string `json:"released_at"`
		} `json:"forced_releases"`
	}
	dec := json.NewDecoder(strings.NewReader(r.stdout))
	dec.DisallowUnknownFields()
	require.NoError(t, dec.Decode(&out))
	require.Len(t, out.ForcedReleases, 1)
	fr := out.ForcedReleases[0]
	require.Equal(t, "job", fr.Name)
	require.Equal(t, role, fr.ReleasedBy, "the audit row names the database user")
	require.Equal(t, "on call: \x1b[31mstuck", fr.Reason)
	require.False(t, fr.WasHeld)
	require.Greater(t, fr.Token, fr.OldToken)
	// The address the server sees a TCP client at: 127.0.0.1 for a local
	// server, the engine's forwarder or gateway for one in a container.
	var clientAddr string
	require.NoError(t, db.NewTCPPool(t, nil).QueryRow(context.Background(), "SELECT pg_catalog.host(pg_catalog.inet_client_addr())").Scan(&clientAddr))
	require.Equal(t, clientAddr, fr.ClientAddr)

	r = pgfence(t, app, "", "ls", "--forced")
	require.Equal(t, 0, r.code, r.stderr)
	require.Equal(t, []string{"RELEASED", "AT", "LEASE", "OLD", "OWNER", "OLD", "TOKEN", "NEW", "TOKEN", "WAS", "HELD", "BY", "FROM", "REASON"},
		strings.Fields(strings.SplitN(r.stdout, "\n", 2)[0]))
	require.Contains(t, r.stdout, `"on call: \x1b[31mstuck"`)
	require.NotContains(t, r.stdout, "\x1b")

	r = pgfence(t, nil, "", "grant", "--print", "--schema", "Locks", role)
	require.Equal(t, 0, r.code, r.stderr)
	require.Contains(t, r.stdout, `GRANT USAGE ON SCHEMA "Locks" TO "`+role+`";`)
	r = pgfence(t, owner, "", "grant", "public")
	require.Equal(t, 2, r.code)
	r = pgfence(t, owner, "", "grant", "no_such_role_x")
	require.Equal(t, 1, r.code)
	require.Contains(t, r.stderr, "no_such_role_x")
}

// grant --check-only gives a checking service the fence registry's check
// and nothing else: it can check a token, and cannot take a lease or read
// the leases (the control: an ordinary grant can).
func TestGrantCheckOnly(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDB(t)
	role, roleURL := newRole(t, db)
	owner := dbEnv(db)
	svc := []string{"DATABASE_URL=" + roleURL}

	r := pgfence(t, nil, "", "grant", "--check-only", "--operator", "--print", role)
	require.Equal(t, 2, r.code)
	require.Contains(t, r.stderr, "--operator and --check-only exclude each other")
	r = pgfence(t, nil, "", "grant", "--check-only", "--print", role)
	require.Equal(t, 0, r.code, r.stderr)
	require.Equal(t, 2, strings.Count(r.stdout, "GRANT "), r.stdout)
	require.Contains(t, r.stdout, "pgfence_fence_check(pg_catalog.text, pg_catalog.int8)")

	r = pgfence(t, owner, "", "grant", "--check-only", role)
	require.Equal(t, 0, r.code, r.stderr)
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, roleURL)
	require.NoError(t, err)
	defer conn.Close(ctx)
	_, err = conn.Exec(ctx, "SELECT pgfence.pgfence_fence_check('stock', 7)")
	require.NoError(t, err, "the check is granted")
	_, err = conn.Exec(ctx, "SELECT pgfence.pgfence_fence_check('stock', 6)")
	require.ErrorContains(t, err, "stale", "and it fences")
	r = pgfence(t, svc, "", "ls")
	require.Equal(t, 1, r.code, "a checking service reads no lease")
	require.Contains(t, r.stderr, "permission denied")
	r = pgfence(t, svc, "", "run", "job", "--", "true")
	require.NotEqual(t, 0, r.code, "nor takes one")

	r = pgfence(t, owner, "", "grant", role)
	require.Equal(t, 0, r.code, r.stderr)
	r = pgfence(t, svc, "", "ls")
	require.Equal(t, 0, r.code, "control: the application grant reads them: %s", r.stderr)
}
