package main_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence/internal/notifier"
	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/leasetable"
	"github.com/pgfence/pgfence/migrations"
)

// bin is the pgfence binary built once for all tests.
var bin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "pgfence-cmd-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	bin = filepath.Join(dir, "pgfence")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "build pgfence: %v\n%s", err, out)
		_ = os.RemoveAll(dir)
		os.Exit(1)
	}
	pgtest.MainWithOptions(m, pgtest.Options{AfterRun: func() { _ = os.RemoveAll(dir) }})
}

type result struct {
	code           int
	stdout, stderr string
}

// cleanEnv is the test's environment without any database setting, so the
// binary sees only what a test passes.
func cleanEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		if k == "DATABASE_URL" || strings.HasPrefix(k, "PG") {
			continue
		}
		env = append(env, kv)
	}
	return env
}

// pgfence runs the binary with env added to a clean environment, stdin from
// a pipe (never a terminal), and returns its exit code and output.
func pgfence(t *testing.T, env []string, stdin string, args ...string) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = append(cleanEnv(), env...)
	cmd.Stdin = strings.NewReader(stdin)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var exitErr *exec.ExitError
	if err != nil && !errors.As(err, &exitErr) {
		t.Fatalf("run pgfence %v: %v", args, err)
	}
	return result{code: cmd.ProcessState.ExitCode(), stdout: stdout.String(), stderr: stderr.String()}
}

func dbEnv(db *pgtest.DB) []string { return []string{"DATABASE_URL=" + db.URL} }

func TestHelp(t *testing.T) {
	t.Parallel()
	tests := []struct {
		args []string
		want string
	}{
		{[]string{"--help"}, "Commands:"},
		{[]string{"-h"}, "Commands:"},
		{[]string{"help"}, "Commands:"},
		{[]string{"help", "ls"}, "pgfence ls [flags]"},
		{[]string{"ls", "--help"}, "pgfence ls [flags]"},
		{[]string{"ls", "-h"}, "--json"},
		{[]string{"release", "--help"}, "pgfence release --force [flags] NAME"},
		{[]string{"prune", "--help"}, "pgfence prune [flags]"},
		{[]string{"migrate", "--help"}, "pgfence migrate [flags] up|down|version"},
		{[]string{"version", "--help"}, "pgfence version"},
		{[]string{"grant", "--help"}, "pgfence grant [flags] ROLE"},
		{[]string{"ls", "--help"}, "--schema NAME"},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			t.Parallel()
			r := pgfence(t, nil, "", tt.args...)
			require.Equal(t, 0, r.code, r.stderr)
			require.Empty(t, r.stderr)
			require.Contains(t, r.stdout, "Usage:")
			require.Contains(t, r.stdout, tt.want)
			require.Contains(t, r.stdout, "Exit codes:")
		})
	}
}

func TestVersion(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{{"version"}, {"--version"}} {
		r := pgfence(t, nil, "", args...)
		require.Equal(t, 0, r.code, r.stderr)
		require.True(t, strings.HasPrefix(r.stdout, "pgfence "), r.stdout)
	}
}

func TestUsageErrors(t *testing.T) {
	t.Parallel()
	url := []string{"DATABASE_URL=postgres://nobody@127.0.0.1:1/none?sslmode=disable"}
	tests := []struct {
		name string
		env  []string
		args []string
		want string
	}{
		{"no command", nil, nil, "Commands:"},
		{"unknown command", nil, []string{"frobnicate"}, `unknown command "frobnicate"`},
		{"unknown flag", url, []string{"ls", "--bogus"}, "flag provided but not defined: -bogus"},
		{"extra argument", url, []string{"ls", "extra"}, `unexpected argument "extra"`},
		{"migrate without action", url, []string{"migrate"}, "expected one of up, down, version"},
		{"migrate unknown action", url, []string{"migrate", "sideways"}, `unknown migrate action "sideways"`},
		{"release without --force", url, []string{"release", "account:42"}, "pass --force"},
		{"release without name", url, []string{"release", "--force"}, "expected one lease name"},
		{"release two names", url, []string{"release", "--force", "a", "b"}, "expected one lease name"},
		{"prune extra argument", url, []string{"prune", "account:42"}, `unexpected argument "account:42"`},
		{"prune too young", url, []string{"prune", "--older-than", "30s"}, "--older-than must be at least 1m0s, not 30s"},
		{"prune bad duration", url, []string{"prune", "--older-than", "soon"}, `invalid value "soon" for flag -older-than`},
		{"no database", nil, []string{"ls"}, "no database: pass --database URL, or set DATABASE_URL"},
		{"no database for migrate", nil, []string{"migrate", "version"}, "no database"},
		{"bad database flag", nil, []string{"ls", "--database", "postgres://x:notaport/db"}, "invalid database in --database"},
		{"bad DATABASE_URL", []string{"DATABASE_URL=postgres://x:notaport/db"}, []string{"ls"}, "invalid database in DATABASE_URL"},
		{"bad duration of a flag", url, []string{"ls", "--json=maybe"}, "invalid boolean value"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			r := pgfence(t, tt.env, "", tt.args...)
			require.Equal(t, 2, r.code, "stdout: %s\nstderr: %s", r.stdout, r.stderr)
			require.Contains(t, r.stderr, tt.want)
			require.Empty(t, r.stdout)
		})
	}
}

func TestUnreachableDatabaseFails(t *testing.T) {
	t.Parallel()
	r := pgfence(t, nil, "", "ls", "--database", "postgres://nobody@127.0.0.1:1/none?sslmode=disable&connect_timeout=5")
	require.Equal(t, 1, r.code)
	require.Contains(t, r.stderr, "pgfence ls: connect to the database:")
}

func TestDatabaseFromPGVariables(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDB(t)
	cfg, err := pgx.ParseConfig(db.URL)
	require.NoError(t, err)
	env := []string{
		"PGHOST=" + cfg.Host, "PGPORT=" + strconv.Itoa(int(cfg.Port)),
		"PGDATABASE=" + cfg.Database, "PGUSER=" + cfg.User, "PGSSLMODE=disable",
	}
	if cfg.Password != "" {
		env = append(env, "PGPASSWORD="+cfg.Password)
	}
	insertLease(t, db, "from-env", "worker", "30 seconds")
	r := pgfence(t, env, "", "ls", "--json")
	require.Equal(t, 0, r.code, r.stderr)
	out := decodeLs(t, r.stdout)
	require.Len(t, out.Leases, 1)
	require.Equal(t, "from-env", out.Leases[0].Name)

	r = pgfence(t, env, "", "migrate", "version")
	require.Equal(t, 0, r.code, r.stderr)
}

func tableExists(t *testing.T, db *pgtest.DB, name string) bool {
	t.Helper()
	var ok bool
	require.NoError(t, db.Pool.QueryRow(context.Background(), "SELECT pg_catalog.to_regclass($1) IS NOT NULL", name).Scan(&ok))
	return ok
}

func TestMigrateUpDownVersion(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDB(t)
	env := dbEnv(db)
	latest := migrations.Latest()

	r := pgfence(t, env, "", "migrate", "version")
	require.Equal(t, 0, r.code, r.stderr)
	require.Equal(t, fmt.Sprintf("version %d (latest %d)\n", latest, latest), r.stdout)
	require.Empty(t, r.stderr)

	// down is destructive: without --yes and without a terminal it refuses.
	r = pgfence(t, env, "y\n", "migrate", "down")
	require.Equal(t, 2, r.code)
	require.Contains(t, r.stderr, "standard input is not a terminal; pass --yes")
	require.True(t, tableExists(t, db, "pgfence.pgfence_leases"))

	r = pgfence(t, env, "", "migrate", "down", "--yes")
	require.Equal(t, 0, r.code, r.stderr)
	require.Contains(t, r.stdout, fmt.Sprintf("reverted from version %d", latest))
	require.Contains(t, r.stdout, "the schema itself remains")
	require.False(t, tableExists(t, db, "pgfence.pgfence_leases"))
	// What the message claims: nothing of pgfence is left in the schema,
	// not even the version table, and the schema is.
	var left []string
	rows, err := db.Pool.Query(context.Background(), `SELECT c.relname::text FROM pg_catalog.pg_class c
		JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = 'pgfence'
		UNION ALL SELECT p.proname::text FROM pg_catalog.pg_proc p
		JOIN pg_catalog.pg_namespace n ON n.oid = p.pronamespace WHERE n.nspname = 'pgfence'`)
	require.NoError(t, err)
	left, err = pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.Empty(t, left, "every table and function is dropped")
	var schemaLeft bool
	require.NoError(t, db.Pool.QueryRow(context.Background(),
		"SELECT EXISTS (SELECT FROM pg_catalog.pg_namespace WHERE nspname = 'pgfence')").Scan(&schemaLeft))
	require.True(t, schemaLeft, "the schema itself remains, as the message says")

	r = pgfence(t, env, "", "migrate", "down", "-y")
	require.Equal(t, 0, r.code, r.stderr)
	require.Contains(t, r.stdout, "nothing to revert")

	r = pgfence(t, env, "", "migrate", "version")
	require.Equal(t, 0, r.code, r.stderr)
	require.Equal(t, fmt.Sprintf("version 0 (latest %d)\n", latest), r.stdout)
	require.Contains(t, r.stderr, "run 'pgfence migrate up --schema pgfence'")

	r = pgfence(t, env, "", "ls")
	require.Equal(t, 1, r.code)
	require.Contains(t, r.stderr, "pgfence migrate up --schema pgfence")

	// Another schema, named as is (not folded to lower case).
	r = pgfence(t, env, "", "migrate", "up", "--schema", "Locks")
	require.Equal(t, 0, r.code, r.stderr)
	require.Equal(t, fmt.Sprintf("pgfence schema \"Locks\" migrated from version 0 to %d\n", latest), r.stdout)
	require.True(t, tableExists(t, db, `"Locks".pgfence_leases`))
	require.False(t, tableExists(t, db, "pgfence.pgfence_leases"))
	r = pgfence(t, env, "", "ls", "--schema", "Locks")
	require.Equal(t, 0, r.code, r.stderr)
	require.Contains(t, r.stdout, "No lease is held.")
	r = pgfence(t, env, "", "migrate", "up")
	require.Equal(t, 1, r.code, "a second install in the same database is refused")
	require.False(t, tableExists(t, db, "pgfence.pgfence_leases"))
	r = pgfence(t, env, "", "migrate", "down", "--yes", "--schema", "Locks")
	require.Equal(t, 0, r.code, r.stderr)
	require.False(t, tableExists(t, db, `"Locks".pgfence_leases`))

	r = pgfence(t, env, "", "migrate", "up")
	require.Equal(t, 0, r.code, r.stderr)
	require.Equal(t, fmt.Sprintf("pgfence schema \"pgfence\" migrated from version 0 to %d\n", latest), r.stdout)
	require.True(t, tableExists(t, db, "pgfence.pgfence_leases"))

	r = pgfence(t, nil, "", "migrate", "up", "--database", db.URL)
	require.Equal(t, 0, r.code, r.stderr)
	require.Equal(t, fmt.Sprintf("pgfence schema \"pgfence\" is up to date at version %d\n", latest), r.stdout)
}

func TestMigrateVersionReportsDirty(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDB(t)
	_, err := db.Pool.Exec(context.Background(), "UPDATE pgfence.pgfence_schema_migrations SET dirty = true")
	require.NoError(t, err)
	r := pgfence(t, dbEnv(db), "", "migrate", "version")
	require.Equal(t, 1, r.code)
	require.Contains(t, r.stderr, "left the schema dirty")
}

// insertLease writes a lease row directly, as a holder would, expiring
// after interval (negative: already expired), and returns its token.
func insertLease(t *testing.T, db *pgtest.DB, name, owner, interval string) int64 {
	t.Helper()
	var token int64
	require.NoError(t, db.Pool.QueryRow(context.Background(), `
		INSERT INTO pgfence.pgfence_leases (name, owner, fence, acquired_at, expires_at)
		VALUES ($1, $2, pgfence.pgfence_next_token(), pg_catalog.now() - interval '5 seconds', pg_catalog.now() + $3::interval)
		RETURNING fence`, name, owner, interval).Scan(&token))
	return token
}

type lsOutput struct {
	Now    time.Time `json:"now"`
	Leases []struct {
		Name             string    `json:"name"`
		Owner            string    `json:"owner"`
		Token            int64     `json:"token"`
		Held             bool      `json:"held"`
		AcquiredAt       time.Time `json:"acquired_at"`
		ExpiresAt        time.Time `json:"expires_at"`
		HeldForSeconds   float64   `json:"held_for_seconds"`
		ExpiresInSeconds float64   `json:"expires_in_seconds"`
	} `json:"leases"`
	Semaphores []struct {
		Name    string `json:"name"`
		Permits int    `json:"permits"`
		InUse   int    `json:"in_use"`
		Waiting int    `json:"waiting"`
	} `json:"semaphores"` // see run_permits_test.go, ls_release_permit_test.go
	Leaders       []lsLeader `json:"leaders"` // see ls_leaders_test.go
	AdvisoryLocks []struct {
		Key             *int64 `json:"key"`
		Key1            *int32 `json:"key1"`
		Key2            *int32 `json:"key2"`
		Mode            string `json:"mode"`
		Granted         bool   `json:"granted"`
		PID             uint32 `json:"pid"`
		ApplicationName string `json:"application_name"`
		Database        string `json:"database"`
	} `json:"advisory_locks"`
}

func decodeLs(t *testing.T, s string) lsOutput {
	t.Helper()
	var out lsOutput
	dec := json.NewDecoder(strings.NewReader(s))
	dec.DisallowUnknownFields()
	require.NoError(t, dec.Decode(&out), s)
	return out
}

func TestLs(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.NewDB(t)
	env := dbEnv(db)

	r := pgfence(t, env, "", "ls", "--json")
	require.Equal(t, 0, r.code, r.stderr)
	out := decodeLs(t, r.stdout)
	require.Empty(t, out.Leases)
	require.Empty(t, out.AdvisoryLocks)
	r = pgfence(t, env, "", "ls")
	require.Equal(t, 0, r.code, r.stderr)
	require.Contains(t, r.stdout, "No lease is held.")
	require.Contains(t, r.stdout, "No advisory lock is held or awaited.")

	held := insertLease(t, db, "account:42", "worker-1", "30 seconds")
	expired := insertLease(t, db, "nightly", "worker-0", "-10 seconds")

	// A session holding a 64-bit advisory lock (a negative key: its high
	// half has the sign bit) and a pair of 32-bit keys.
	holder := db.Conn(t)
	_, err := holder.Exec(ctx, "SET application_name = 'ls-test-holder'")
	require.NoError(t, err)
	_, err = holder.Exec(ctx, "SELECT pg_advisory_lock(-5), pg_advisory_lock(-1, 7)")
	require.NoError(t, err)

	r = pgfence(t, env, "", "ls", "--json")
	require.Equal(t, 0, r.code, r.stderr)
	out = decodeLs(t, r.stdout)
	require.Len(t, out.Leases, 1, "expired leases are not listed")
	l := out.Leases[0]
	require.Equal(t, "account:42", l.Name)
	require.Equal(t, "worker-1", l.Owner)
	require.Equal(t, held, l.Token)
	require.True(t, l.Held)
	require.GreaterOrEqual(t, l.HeldForSeconds, 5.0)
	require.Greater(t, l.ExpiresInSeconds, 0.0)
	require.LessOrEqual(t, l.ExpiresInSeconds, 30.0)
	require.True(t, l.ExpiresAt.After(out.Now))

	require.Len(t, out.AdvisoryLocks, 2)
	byKey := out.AdvisoryLocks[0]
	pair := out.AdvisoryLocks[1]
	if byKey.Key == nil {
		byKey, pair = pair, byKey
	}
	require.NotNil(t, byKey.Key)
	require.Equal(t, int64(-5), *byKey.Key)
	require.Nil(t, byKey.Key1)
	require.NotNil(t, pair.Key1)
	require.NotNil(t, pair.Key2)
	require.Nil(t, pair.Key)
	require.Equal(t, int32(-1), *pair.Key1)
	require.Equal(t, int32(7), *pair.Key2)
	for _, a := range out.AdvisoryLocks {
		require.Equal(t, "ExclusiveLock", a.Mode)
		require.True(t, a.Granted)
		require.Equal(t, holder.PgConn().PID(), a.PID)
		require.Equal(t, "ls-test-holder", a.ApplicationName)
		require.Equal(t, db.Name, a.Database)
	}

	r = pgfence(t, env, "", "ls")
	require.Equal(t, 0, r.code, r.stderr)
	lines := strings.Split(r.stdout, "\n")
	require.Equal(t, []string{"LEASE", "OWNER", "TOKEN", "HELD", "FOR", "EXPIRES", "IN"}, strings.Fields(lines[0]))
	require.Equal(t, []string{"account:42", "worker-1", strconv.FormatInt(held, 10)}, strings.Fields(lines[1])[:3])
	require.Empty(t, lines[2], "the expired lease (token %d) is not listed", expired)
	require.Contains(t, r.stdout, "ADVISORY KEY")
	require.Contains(t, r.stdout, "\n-5 ")
	require.Contains(t, r.stdout, "\n-1,7 ")
	require.Contains(t, r.stdout, "ls-test-holder")
}

func TestReleaseForce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.NewDB(t)
	env := dbEnv(db)
	token := insertLease(t, db, "account:42", "worker-1", "30 seconds")

	leaseRow := func() (owner string, fence int64, held bool) {
		require.NoError(t, db.Pool.QueryRow(ctx,
			"SELECT owner, fence, expires_at > pg_catalog.now() FROM pgfence.pgfence_leases WHERE name = 'account:42'").Scan(&owner, &fence, &held))
		return owner, fence, held
	}

	// Without a terminal and without --yes it refuses, and changes nothing.
	r := pgfence(t, env, "y\n", "release", "--force", "account:42")
	require.Equal(t, 2, r.code)
	require.Contains(t, r.stderr, "pass --yes")
	owner, fence, held := leaseRow()
	require.Equal(t, "worker-1", owner)
	require.Equal(t, token, fence)
	require.True(t, held)

	listener := db.Conn(t)
	_, err := listener.Exec(ctx, "LISTEN pgfence_lease_released")
	require.NoError(t, err)
	key, err := notifier.LoadKey(ctx, db.Pool, "pgfence")
	require.NoError(t, err)
	_, err = listener.Exec(ctx, "SELECT pg_advisory_lock_shared($1, $2)", leasetable.InterestClassID, key.InterestID("account:42")) // someone waits
	require.NoError(t, err)

	// Flags may follow the name.
	r = pgfence(t, env, "", "release", "account:42", "--force", "--yes")
	require.Equal(t, 0, r.code, r.stderr)
	owner, fence, held = leaseRow()
	require.Greater(t, fence, token, "the token was bumped")
	require.False(t, held, "the lease expired in place")
	require.Equal(t, "released-by:postgres", owner, "the row names the database user")
	require.Regexp(t, fmt.Sprintf(`^released "account:42": token %d -> %d \(was held by "worker-1"\); recorded with reason "pgfence-cli: release --force by [^"]+"\n$`,
		token, fence), r.stdout)

	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	n, err := listener.WaitForNotification(wctx)
	require.NoError(t, err)
	var want string
	require.NoError(t, db.Pool.QueryRow(ctx, "SELECT pgfence.pgfence_notify_payload('account:42', $1)", token).Scan(&want))
	require.Equal(t, want, n.Payload, "the payload announces the old token, under the install's key")
	require.NotContains(t, n.Payload, "account:42")

	// The old holder's renewal (its token, not yet expired) finds nothing.
	tag, err := db.Pool.Exec(ctx, `UPDATE pgfence.pgfence_leases SET expires_at = pg_catalog.now() + interval '30 seconds'
		WHERE name = $1 AND fence = $2 AND expires_at > pg_catalog.now()`, "account:42", token)
	require.NoError(t, err)
	require.Zero(t, tag.RowsAffected())

	// Releasing a lease that is no longer held still bumps its token.
	r = pgfence(t, env, "", "release", "-f", "-y", "account:42")
	require.Equal(t, 0, r.code, r.stderr)
	_, again, _ := leaseRow()
	require.Greater(t, again, fence)
	require.Contains(t, r.stdout, "was not held; last owner")

	r = pgfence(t, env, "", "release", "--force", "--yes", "no-such-lease")
	require.Equal(t, 1, r.code)
	require.Contains(t, r.stderr, `no lease named "no-such-lease"`)
}

// Names and owners come from any client; ls's table shows their control
// characters escaped, so they cannot drive the operator's terminal or break
// the columns, and --json keeps them exact. (The server itself replaces
// control characters in application_name with '?'.)
func TestLsEscapesControlCharacters(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDB(t)
	env := dbEnv(db)
	const name = "evil\nLEASE  FAKE-OWNER\x1b[31mred"
	const owner = "owner\x1b]0;title\a\u009b2J\x7f"
	insertLease(t, db, name, owner, "30 seconds")

	r := pgfence(t, env, "", "ls")
	require.Equal(t, 0, r.code, r.stderr)
	require.NotContains(t, r.stdout, "\x1b", "no raw ESC reaches the terminal")
	require.NotContains(t, r.stdout, "\x7f")
	require.NotContains(t, r.stdout, "\u009b")
	require.NotContains(t, r.stdout, "\a")
	require.Contains(t, r.stdout, `"evil\nLEASE  FAKE-OWNER\x1b[31mred"`)
	require.Contains(t, r.stdout, `"owner\x1b]0;title\a\u009b2J\x7f"`)
	for _, line := range strings.Split(r.stdout, "\n") {
		require.False(t, strings.HasPrefix(line, "LEASE  FAKE-OWNER"), "the newline in the name did not start a line: %q", line)
	}

	r = pgfence(t, env, "", "ls", "--json")
	require.Equal(t, 0, r.code, r.stderr)
	out := decodeLs(t, r.stdout)
	require.Len(t, out.Leases, 1)
	require.Equal(t, name, out.Leases[0].Name, "JSON keeps the name exact")
	require.Equal(t, owner, out.Leases[0].Owner)
}
