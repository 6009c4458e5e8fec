package migrations_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/migrations"
)

// ownedInstall returns a fresh database with pgfence installed by role owner
// (not a superuser), app granted with [migrations.Grant], and operator
// granted with the Operator option (when not empty).
func ownedInstall(t *testing.T, owner, app, operator string) *pgtest.DB {
	t.Helper()
	ctx := testCtx(t)
	db := emptyDB(t)
	exec(t, db, "GRANT CREATE ON DATABASE "+pgx.Identifier{db.Name}.Sanitize()+" TO "+pgx.Identifier{owner}.Sanitize())
	target := migrations.Target{ConnConfig: as(t, db, owner)}
	require.NoError(t, migrations.Up(ctx, target, nil))
	require.NoError(t, migrations.Grant(ctx, target, app, nil, nil))
	if operator != "" {
		require.NoError(t, migrations.Grant(ctx, target, operator, nil, &migrations.GrantOpts{Operator: true}))
	}
	return db
}

// plantSQL is what a role with CREATE on schema public plants there: look-
// alikes of the built-ins and objects pgfence's SQL uses. Each function
// records in public.planted_ran that it ran, and returns a forged value.
// Some win name resolution over pg_catalog for callers whose search_path
// holds public (an untyped literal prefers nextval(text) to
// nextval(regclass); unnest(bigint[]) beats unnest(anyarray); an operator
// bigint * interval beats float8 * interval); the others only win where
// public comes before pg_catalog.
const plantSQL = `
SET search_path = public;
CREATE TABLE public.planted_ran (what text NOT NULL);
GRANT INSERT, SELECT ON public.planted_ran TO PUBLIC;
CREATE FUNCTION public.nextval(text) RETURNS bigint LANGUAGE plpgsql AS
    $$ BEGIN INSERT INTO public.planted_ran VALUES ('nextval(text)'); RETURN 1; END $$;
CREATE FUNCTION public.now() RETURNS timestamptz LANGUAGE plpgsql AS
    $$ BEGIN INSERT INTO public.planted_ran VALUES ('now()'); RETURN '2000-01-01'; END $$;
CREATE FUNCTION public.clock_timestamp() RETURNS timestamptz LANGUAGE plpgsql AS
    $$ BEGIN INSERT INTO public.planted_ran VALUES ('clock_timestamp()'); RETURN '2000-01-01'; END $$;
CREATE FUNCTION public.set_config(text, text, boolean) RETURNS text LANGUAGE plpgsql AS
    $$ BEGIN INSERT INTO public.planted_ran VALUES ('set_config'); RETURN ''; END $$;
CREATE FUNCTION public.set_config(varchar, varchar, boolean) RETURNS text LANGUAGE plpgsql AS
    $$ BEGIN INSERT INTO public.planted_ran VALUES ('set_config(varchar)'); RETURN ''; END $$;
CREATE FUNCTION public.current_setting(text) RETURNS text LANGUAGE plpgsql AS
    $$ BEGIN INSERT INTO public.planted_ran VALUES ('current_setting'); RETURN 'on'; END $$;
CREATE FUNCTION public.pg_current_xact_id() RETURNS xid8 LANGUAGE plpgsql AS
    $$ BEGIN INSERT INTO public.planted_ran VALUES ('pg_current_xact_id'); RETURN '1'; END $$;
CREATE FUNCTION public.pg_current_wal_flush_lsn() RETURNS pg_lsn LANGUAGE plpgsql AS
    $$ BEGIN INSERT INTO public.planted_ran VALUES ('pg_current_wal_flush_lsn'); RETURN 'FFFFFFFF/FFFFFFFF'; END $$;
CREATE FUNCTION public.pg_current_wal_insert_lsn() RETURNS pg_lsn LANGUAGE plpgsql AS
    $$ BEGIN INSERT INTO public.planted_ran VALUES ('pg_current_wal_insert_lsn'); RETURN '0/0'; END $$;
CREATE FUNCTION public.planted_lsn_lt(pg_lsn, pg_lsn) RETURNS boolean LANGUAGE plpgsql AS
    $$ BEGIN INSERT INTO public.planted_ran VALUES ('pg_lsn < pg_lsn'); RETURN false; END $$;
CREATE OPERATOR public.< (LEFTARG = pg_lsn, RIGHTARG = pg_lsn, FUNCTION = public.planted_lsn_lt);
CREATE FUNCTION public.pg_notify(text, text) RETURNS void LANGUAGE plpgsql AS
    $$ BEGIN INSERT INTO public.planted_ran VALUES ('pg_notify'); END $$;
CREATE FUNCTION public.format(text, text) RETURNS text LANGUAGE plpgsql AS
    $$ BEGIN INSERT INTO public.planted_ran VALUES ('format(text,text)'); RETURN ''; END $$;
CREATE FUNCTION public.unnest(bigint[]) RETURNS SETOF bigint LANGUAGE plpgsql AS
    $$ BEGIN INSERT INTO public.planted_ran VALUES ('unnest(bigint[])'); RETURN NEXT 1; END $$;
CREATE FUNCTION public.unnest(boolean[]) RETURNS SETOF boolean LANGUAGE plpgsql AS
    $$ BEGIN INSERT INTO public.planted_ran VALUES ('unnest(boolean[])'); RETURN NEXT true; END $$;
CREATE FUNCTION public.cardinality(boolean[]) RETURNS integer LANGUAGE plpgsql AS
    $$ BEGIN INSERT INTO public.planted_ran VALUES ('cardinality(boolean[])'); RETURN 0; END $$;
CREATE FUNCTION public.unnest(text[]) RETURNS SETOF text LANGUAGE plpgsql AS
    $$ BEGIN INSERT INTO public.planted_ran VALUES ('unnest(text[])'); RETURN NEXT 'x'; END $$;
CREATE FUNCTION public.to_jsonb(anyelement) RETURNS jsonb LANGUAGE plpgsql AS
    $$ BEGIN INSERT INTO public.planted_ran VALUES ('to_jsonb'); RETURN '{}'; END $$;
CREATE FUNCTION public.to_json(text) RETURNS json LANGUAGE plpgsql AS
    $$ BEGIN INSERT INTO public.planted_ran VALUES ('to_json(text)'); RETURN '"forged"'; END $$;
CREATE FUNCTION public.inet_client_addr() RETURNS inet LANGUAGE plpgsql AS
    $$ BEGIN INSERT INTO public.planted_ran VALUES ('inet_client_addr'); RETURN '10.0.0.1'; END $$;
CREATE FUNCTION public.pg_backend_pid() RETURNS integer LANGUAGE plpgsql AS
    $$ BEGIN INSERT INTO public.planted_ran VALUES ('pg_backend_pid'); RETURN 0; END $$;
CREATE FUNCTION public.planted_mul(bigint, interval) RETURNS interval LANGUAGE plpgsql AS
    $$ BEGIN INSERT INTO public.planted_ran VALUES ('bigint * interval'); RETURN interval '100 years'; END $$;
CREATE OPERATOR public.* (LEFTARG = bigint, RIGHTARG = interval, FUNCTION = public.planted_mul);
CREATE FUNCTION public.planted_gt(timestamptz, timestamptz) RETURNS boolean LANGUAGE plpgsql AS
    $$ BEGIN INSERT INTO public.planted_ran VALUES ('timestamptz > timestamptz'); RETURN true; END $$;
CREATE OPERATOR public.> (LEFTARG = timestamptz, RIGHTARG = timestamptz, FUNCTION = public.planted_gt);
CREATE SEQUENCE public.pgfence_leases_fence_seq;
GRANT ALL ON SEQUENCE public.pgfence_leases_fence_seq TO PUBLIC;
CREATE TABLE public.pgfence_leases (name text, owner text, fence bigint, acquired_at timestamptz, expires_at timestamptz);
GRANT ALL ON public.pgfence_leases TO PUBLIC;
`

func planted(t *testing.T, conn *pgx.Conn) []string {
	t.Helper()
	rows, err := conn.Query(testCtx(t), "SELECT what FROM public.planted_ran ORDER BY what")
	require.NoError(t, err)
	ran, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	return ran
}

// TestHostileSearchPath: a role that can create objects in a schema on the
// application role's search_path plants look-alikes of everything pgfence's
// SQL uses. The application role calls every function it is granted; no
// planted object runs or is touched, and the tokens are the real ones.
func TestHostileSearchPath(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	roles := newRoles(t, "owner", "app", "attacker", "operator")
	owner, app, attacker, operator := roles[0], roles[1], roles[2], roles[3]
	db := ownedInstall(t, owner, app, operator)
	exec(t, db, "GRANT CREATE ON SCHEMA public TO "+pgx.Identifier{attacker}.Sanitize())
	_, err := connAs(t, db, attacker).Exec(ctx, plantSQL)
	require.NoError(t, err)

	c := connAs(t, db, app)
	var path string
	require.NoError(t, c.QueryRow(ctx, "SHOW search_path").Scan(&path))
	require.Equal(t, `"$user", public`, path)
	// The app's own temporary look-alike, first in its path for tables.
	_, err = c.Exec(ctx, "CREATE TEMP TABLE pgfence_leases (name text, owner text, fence bigint, acquired_at timestamptz, expires_at timestamptz)")
	require.NoError(t, err)

	var last int64
	next := func() int64 {
		var tok int64
		require.NoError(t, c.QueryRow(ctx, "SELECT pgfence.pgfence_next_token()").Scan(&tok))
		require.Greater(t, tok, last)
		last = tok
		return tok
	}
	type lease struct {
		acquired bool
		owner    string
		fence    int64
	}
	secrets := map[string]string{}
	acquire := func(owner string, names ...string) map[string]lease {
		ttls := make([]int64, len(names))
		for i := range ttls {
			ttls[i] = int64(time.Minute / time.Microsecond)
		}
		rows, err := c.Query(ctx, "SELECT acquired, name, owner, fence, expires_at > db_now, secret FROM pgfence.pgfence_acquire($1, $2, $3)", names, owner, ttls)
		require.NoError(t, err)
		got := map[string]lease{}
		for rows.Next() {
			var l lease
			var name string
			var future bool
			var secret *string
			require.NoError(t, rows.Scan(&l.acquired, &name, &l.owner, &l.fence, &future, &secret))
			require.True(t, future)
			if l.acquired {
				secrets[name] = *secret
			}
			got[name] = l
		}
		require.NoError(t, rows.Err())
		return got
	}

	next()
	// Several tokens in one call: one per true position, in order, NULL elsewhere.
	var batch []*int64
	require.NoError(t, c.QueryRow(ctx, "SELECT pgfence.pgfence_next_tokens('{t,f,t}')").Scan(&batch))
	require.Len(t, batch, 3)
	require.Nil(t, batch[1])
	require.NotNil(t, batch[0])
	require.NotNil(t, batch[2])
	require.Greater(t, *batch[0], last)
	require.Greater(t, *batch[2], *batch[0])
	last = *batch[2]
	got := acquire("app-1", "a", "b")
	require.True(t, got["a"].acquired)
	require.True(t, got["b"].acquired)
	for _, n := range []string{"a", "b"} {
		require.Greater(t, got[n].fence, last)
	}
	ta, tb := got["a"].fence, got["b"].fence
	last = max(ta, tb)

	require.Equal(t, map[string]lease{"a": {false, "app-1", ta}}, acquire("app-2", "a"), "a held lease is not taken over")

	rows, err := c.Query(ctx, "SELECT fence FROM pgfence.pgfence_renew($1, $2, $3, $4) WHERE renewed", []string{"a", "b"}, []int64{ta, tb + 1000},
		[]string{secrets["a"], secrets["b"]}, []int64{120e6, 120e6})
	require.NoError(t, err)
	renewed, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	require.NoError(t, err)
	require.Equal(t, []int64{ta}, renewed, "only the right token renews")

	tx, err := c.Begin(ctx)
	require.NoError(t, err)
	var held, wrong bool
	require.NoError(t, tx.QueryRow(ctx, "SELECT pgfence.pgfence_lease_held('a', $1, $3), pgfence.pgfence_lease_held('a', $2, $3)", ta, ta+1000, secrets["a"]).Scan(&held, &wrong))
	require.True(t, held)
	require.False(t, wrong)
	require.NoError(t, tx.Commit(ctx))

	rows, err = c.Query(ctx, "SELECT fence, durability FROM pgfence.pgfence_release($1, $2, $3, $4)", []string{"a", "b"}, []int64{ta, tb},
		[]string{secrets["a"], secrets["b"]}, []int64{0, 0})
	require.NoError(t, err)
	type released struct {
		Fence      int64
		Durability *string
	}
	rel, err := pgx.CollectRows(rows, pgx.RowToStructByPos[released])
	require.NoError(t, err)
	require.Len(t, rel, 2)
	require.ElementsMatch(t, []int64{ta, tb}, []int64{rel[0].Fence, rel[1].Fence})

	got = acquire("app-2", "a")
	require.True(t, got["a"].acquired)
	require.Greater(t, got["a"].fence, last)
	last = got["a"].fence
	next()

	// Prune's minimum age is a minute: age the released lease (as the
	// superuser, outside the app's view).
	exec(t, db, "UPDATE pgfence.pgfence_leases SET expires_at = now() - interval '2 minutes' WHERE name = 'b'")
	var lastName string
	var pageRows int64
	var names []string
	var tokens []int64
	var vxids []string
	require.NoError(t, c.QueryRow(ctx, "SELECT * FROM pgfence.pgfence_prune_scan('', 100, '1 minute')").Scan(&lastName, &pageRows, &names, &tokens, &vxids))
	require.Equal(t, "b", lastName)
	require.Equal(t, int64(2), pageRows)
	require.Equal(t, []string{"b"}, names, "the released lease is prunable, the held one is not")
	require.Equal(t, []int64{tb}, tokens)
	var deleted int64
	require.NoError(t, c.QueryRow(ctx, "SELECT pgfence.pgfence_prune_delete($1, $2, '1 minute')", names, tokens).Scan(&deleted))
	require.Equal(t, int64(1), deleted)

	var version int
	require.NoError(t, c.QueryRow(ctx, "SELECT pgfence.pgfence_schema_version()").Scan(&version))
	require.Equal(t, int(migrations.Latest()), version)

	// The operator, with the same search_path, force-releases the lease,
	// over TCP so that the audit records a client address.
	opCfg := asTCP(t, db, operator)
	opCfg.RuntimeParams["search_path"] = as(t, db, operator).RuntimeParams["search_path"]
	op, err := pgx.ConnectConfig(ctx, opCfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = op.Close(context.Background()) })
	var oldOwner string
	var oldToken, forced int64
	var wasHeld bool
	require.NoError(t, op.QueryRow(ctx, "SELECT * FROM pgfence.pgfence_force_release('a', 'hostile test')").Scan(&oldOwner, &oldToken, &wasHeld, &forced))
	require.Equal(t, "app-2", oldOwner)
	require.Equal(t, last-tokenStep, oldToken, "the token drawn before next's")
	require.True(t, wasHeld)
	require.Greater(t, forced, last)
	last = forced
	next()
	var auditAddr *string
	require.NoError(t, op.QueryRow(ctx, "SELECT host(client_addr) FROM pgfence.pgfence_forced_releases").Scan(&auditAddr))
	require.NotNil(t, auditAddr)
	require.NotEqual(t, "10.0.0.1", *auditAddr)

	require.Empty(t, planted(t, c), "a planted look-alike ran")
	var lookalikeRows int
	var seqCalled bool
	require.NoError(t, c.QueryRow(ctx, "SELECT (SELECT count(*) FROM public.pgfence_leases) + (SELECT count(*) FROM pg_temp.pgfence_leases)").Scan(&lookalikeRows))
	require.Zero(t, lookalikeRows)
	require.NoError(t, c.QueryRow(ctx, "SELECT is_called FROM public.pgfence_leases_fence_seq").Scan(&seqCalled))
	require.False(t, seqCalled)

	// Negative control: the plants are live for statements that resolve
	// names through the app's search_path.
	for _, stmt := range []string{
		"SELECT nextval('pgfence_leases_fence_seq')",
		"SELECT unnest('{5}'::bigint[])",
		"SELECT cardinality('{t}'::boolean[])",
		"SELECT 2::bigint * interval '1 second'",
	} {
		_, err = c.Exec(ctx, stmt)
		require.NoError(t, err)
	}
	ran := planted(t, c)
	require.Contains(t, ran, "nextval(text)")
	require.Contains(t, ran, "unnest(bigint[])")
	require.Contains(t, ran, "cardinality(boolean[])")
	require.Contains(t, ran, "bigint * interval")
}

// TestHostileSearchPathUnpinned is the negative control of
// TestHostileSearchPath: the same install with pgfence_next_token's
// search_path pin removed resolves its sequences through the caller's
// search_path, so the attacker's planted look-alikes (set to pass the
// function's checks) hand out a forged token 1.
func TestHostileSearchPathUnpinned(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	roles := newRoles(t, "owner", "app", "attacker")
	owner, app, attacker := roles[0], roles[1], roles[2]
	db := ownedInstall(t, owner, app, "")
	exec(t, db, "GRANT CREATE ON SCHEMA public TO "+pgx.Identifier{attacker}.Sanitize())
	weaken(t, db, edit{"pgfence_next_token()", " SET search_path TO 'pg_catalog', 'pgfence', 'pg_temp'\n", ""})
	// Advance the real sequence so a forged 1 is unmistakable.
	exec(t, db, "SELECT setval('pgfence.pgfence_leases_fence_seq', 1000)")
	_, err := connAs(t, db, attacker).Exec(ctx, plantSQL+`
		ALTER SEQUENCE public.pgfence_leases_fence_seq INCREMENT 1024;
		CREATE SEQUENCE public.pgfence_token_flush_seq MINVALUE 0 MAXVALUE 1 START 0;
		GRANT ALL ON SEQUENCE public.pgfence_token_flush_seq TO PUBLIC;`)
	require.NoError(t, err)

	var tok int64
	require.NoError(t, connAs(t, db, app).QueryRow(ctx, "SELECT pgfence.pgfence_next_token()").Scan(&tok))
	require.Equal(t, int64(1), tok, "the planted sequence forged the token")
}

// TestAppRoleDenied: each privilege the application role does not get is
// refused with insufficient_privilege (42501); the owner, as negative
// control, may do each.
func TestAppRoleDenied(t *testing.T) {
	t.Parallel()
	roles := newRoles(t, "owner", "app", "operator")
	owner, app, operator := roles[0], roles[1], roles[2]
	db := ownedInstall(t, owner, app, operator)
	ownerConn, appConn := connAs(t, db, owner), connAs(t, db, app)
	_, err := ownerConn.Exec(testCtx(t), "SELECT * FROM pgfence.pgfence_acquire('{x}', 'o', '{60000000}')")
	require.NoError(t, err)

	for name, stmt := range map[string]string{
		"setval":            "SELECT pg_catalog.setval('pgfence.pgfence_leases_fence_seq', 1)",
		"alter sequence":    "ALTER SEQUENCE pgfence.pgfence_leases_fence_seq CACHE 50",
		"nextval":           "SELECT pg_catalog.nextval('pgfence.pgfence_leases_fence_seq')",
		"update":            "UPDATE pgfence.pgfence_leases SET fence = 1",
		"insert":            "INSERT INTO pgfence.pgfence_leases (name, owner, expires_at) VALUES ('y', 'o', pg_catalog.now())",
		"delete":            "DELETE FROM pgfence.pgfence_leases",
		"truncate":          "TRUNCATE pgfence.pgfence_leases",
		"select for update": "SELECT FROM pgfence.pgfence_leases FOR UPDATE",
		"force release":     "SELECT * FROM pgfence.pgfence_force_release('x', 'because')",
		"read audit log":    "SELECT * FROM pgfence.pgfence_forced_releases",
		"alter function":    "ALTER FUNCTION pgfence.pgfence_next_token() RESET search_path",
	} {
		t.Run(name, func(t *testing.T) {
			run := func(c *pgx.Conn) error {
				ctx := testCtx(t)
				tx, err := c.Begin(ctx)
				require.NoError(t, err)
				defer func() { _ = tx.Rollback(ctx) }()
				_, err = tx.Exec(ctx, stmt)
				return err
			}
			requireSQLState(t, run(appConn), "42501")
			require.NoError(t, run(ownerConn), "the owner may")
		})
	}

	// What the app is granted works, and Operator adds force release.
	_, err = appConn.Exec(testCtx(t), "SELECT name FROM pgfence.pgfence_leases")
	require.NoError(t, err)
	_, err = connAs(t, db, operator).Exec(testCtx(t), "SELECT * FROM pgfence.pgfence_force_release('x', 'because'); SELECT * FROM pgfence.pgfence_forced_releases")
	require.NoError(t, err)

	// The grants do not keep the owner from removing everything.
	require.NoError(t, migrations.Down(testCtx(t), migrations.Target{ConnConfig: as(t, db, owner)}, nil))
	require.Empty(t, objectsIn(t, db, "pgfence"))
}

func TestNextTokenRefusesSequenceSettings(t *testing.T) {
	t.Parallel()
	for name, alter := range map[string]string{
		"cache 50":    "CACHE 50",
		"increment 2": "INCREMENT 2",
		"cycle":       "CYCLE",
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ctx := testCtx(t)
			db := pgtest.NewDB(t)
			var tok int64
			require.NoError(t, db.Pool.QueryRow(ctx, "SELECT pgfence.pgfence_next_token()").Scan(&tok), "negative control: the sequence as installed is accepted")
			exec(t, db, "ALTER SEQUENCE pgfence.pgfence_leases_fence_seq "+alter)
			err := db.Pool.QueryRow(ctx, "SELECT pgfence.pgfence_next_token()").Scan(&tok)
			requireSQLState(t, err, "PF002")
			var toks []*int64
			err = db.Pool.QueryRow(ctx, "SELECT pgfence.pgfence_next_tokens('{t}')").Scan(&toks)
			requireSQLState(t, err, "PF002")
			// Acquiring draws through it too.
			_, err = db.Pool.Exec(ctx, "SELECT * FROM pgfence.pgfence_acquire('{x}', 'o', '{60000000}')")
			requireSQLState(t, err, "PF002")
		})
	}
}

func TestNextTokenOnlyRaisesSynchronousCommit(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	db := pgtest.NewDB(t)
	for set, want := range map[string]string{
		"off":          "on",
		"local":        "on",
		"remote_write": "on",
		"on":           "on",
		"remote_apply": "remote_apply",
	} {
		tx, err := db.Pool.Begin(ctx)
		require.NoError(t, err)
		_, err = tx.Exec(ctx, "SET LOCAL synchronous_commit = "+set)
		require.NoError(t, err)
		_, err = tx.Exec(ctx, "SELECT pgfence.pgfence_next_token()")
		require.NoError(t, err)
		var got string
		require.NoError(t, tx.QueryRow(ctx, "SELECT current_setting('synchronous_commit')").Scan(&got))
		require.Equal(t, want, got, "after %s", set)
		require.NoError(t, tx.Commit(ctx))

		tx, err = db.Pool.Begin(ctx)
		require.NoError(t, err)
		_, err = tx.Exec(ctx, "SET LOCAL synchronous_commit = "+set)
		require.NoError(t, err)
		_, err = tx.Exec(ctx, "SELECT pgfence.pgfence_next_tokens('{t,t}')")
		require.NoError(t, err)
		require.NoError(t, tx.QueryRow(ctx, "SELECT current_setting('synchronous_commit')").Scan(&got))
		require.Equal(t, want, got, "pgfence_next_tokens, after %s", set)
		require.NoError(t, tx.Commit(ctx))
	}
}

// TestForceReleaseAudit: a force release fences the holder out with a fresh
// token, notifies waiters, logs, and leaves an audit row that the next
// acquire does not erase.
func TestForceReleaseAudit(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	roles := newRoles(t, "owner", "app", "operator")
	owner, app, operator := roles[0], roles[1], roles[2]
	db := ownedInstall(t, owner, app, operator)
	appConn := connAs(t, db, app)

	var t1 int64
	var secret string
	require.NoError(t, appConn.QueryRow(ctx, "SELECT fence, secret FROM pgfence.pgfence_acquire('{job}', 'worker-1', '{60000000}')").Scan(&t1, &secret))

	listener := connAs(t, db, app)
	_, err := listener.Exec(ctx, "LISTEN pgfence_lease_released")
	require.NoError(t, err)
	holdInterest(t, db, "job") // someone waits: the forced release notifies

	var mu sync.Mutex
	var logged []string
	cfg := asTCP(t, db, operator) // over TCP: the audit records the client address
	cfg.OnNotice = func(_ *pgconn.PgConn, n *pgconn.Notice) {
		if strings.HasPrefix(n.Message, "pgfence:") {
			mu.Lock()
			defer mu.Unlock()
			logged = append(logged, n.Message)
		}
	}
	opConn, err := pgx.ConnectConfig(ctx, cfg)
	require.NoError(t, err)
	defer func() { _ = opConn.Close(context.Background()) }()
	_, err = opConn.Exec(ctx, "SET client_min_messages = log")
	require.NoError(t, err)

	var oldOwner string
	var oldToken, t2 int64
	var wasHeld bool
	require.NoError(t, opConn.QueryRow(ctx, "SELECT * FROM pgfence.pgfence_force_release('job', 'stuck since Monday')").Scan(&oldOwner, &oldToken, &wasHeld, &t2))
	require.Equal(t, "worker-1", oldOwner)
	require.Equal(t, t1, oldToken)
	require.True(t, wasHeld)
	require.Greater(t, t2, t1)

	var rowOwner string
	var expired bool
	require.NoError(t, appConn.QueryRow(ctx, "SELECT owner, expires_at <= now() FROM pgfence.pgfence_leases WHERE name = 'job'").Scan(&rowOwner, &expired))
	require.Equal(t, "released-by:"+operator, rowOwner)
	require.True(t, expired)

	waitCtx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	n, err := listener.WaitForNotification(waitCtx)
	require.NoError(t, err)
	var want string
	require.NoError(t, db.Pool.QueryRow(ctx, "SELECT pgfence.pgfence_notify_payload('job', $1)", t1).Scan(&want))
	require.Equal(t, want, n.Payload)

	mu.Lock()
	require.Len(t, logged, 1)
	require.True(t, strings.HasPrefix(logged[0], `pgfence: lease "job" force-released by "`+operator+`"`), logged[0])
	require.Contains(t, logged[0], fmt.Sprintf("token %d -> %d", t1, t2))
	require.Contains(t, logged[0], `reason "stuck since Monday"`)
	mu.Unlock()

	// The holder is fenced out: its token and secret no longer hold the
	// lease.
	var held bool
	require.NoError(t, appConn.QueryRow(ctx, "SELECT pgfence.pgfence_lease_held('job', $1, $2)", t1, secret).Scan(&held))
	require.False(t, held)

	// The next acquire takes the lease with a newer token and leaves the
	// record alone.
	var acquired bool
	var t3 int64
	require.NoError(t, appConn.QueryRow(ctx, "SELECT acquired, fence FROM pgfence.pgfence_acquire('{job}', 'worker-2', '{60000000}')").Scan(&acquired, &t3))
	require.True(t, acquired)
	require.Greater(t, t3, t2)

	type record struct {
		Name, OldOwner     string
		OldToken, NewToken int64
		WasHeld            bool
		Reason             string
		ReleasedBy         string
		HasAddr            bool
	}
	rows, err := connAs(t, db, operator).Query(ctx, `SELECT name, old_owner, old_token, new_token, was_held, reason, released_by::text, client_addr IS NOT NULL
		FROM pgfence.pgfence_forced_releases`)
	require.NoError(t, err)
	recs, err := pgx.CollectRows(rows, pgx.RowToStructByPos[record])
	require.NoError(t, err)
	require.Equal(t, []record{{"job", "worker-1", t1, t2, true, "stuck since Monday", operator, true}}, recs)

	// No lease, no record.
	rows, err = opConn.Query(ctx, "SELECT * FROM pgfence.pgfence_force_release('nothing', 'x')")
	require.NoError(t, err)
	rows.Close()
	require.NoError(t, rows.Err())
	var count int
	require.NoError(t, opConn.QueryRow(ctx, "SELECT count(*) FROM pgfence.pgfence_forced_releases").Scan(&count))
	require.Equal(t, 1, count)
}

func TestNextTokenIncreases(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	db := pgtest.NewDB(t)
	var a, b int64
	require.NoError(t, db.Pool.QueryRow(ctx, "SELECT pgfence.pgfence_next_token()").Scan(&a))
	require.NoError(t, db.Pool.QueryRow(ctx, "SELECT pgfence.pgfence_next_token()").Scan(&b))
	require.Greater(t, a, int64(0))
	require.Greater(t, b, a)
	var increment, cache int64
	var cycles bool
	require.NoError(t, db.Pool.QueryRow(ctx,
		"SELECT seqincrement, seqcache, seqcycle FROM pg_sequence WHERE seqrelid = 'pgfence.pgfence_leases_fence_seq'::regclass").Scan(&increment, &cache, &cycles))
	require.Equal(t, int64(tokenStep), increment)
	require.Equal(t, int64(1), cache)
	require.False(t, cycles, "the token sequence must never wrap")
}

// TestUpIntoExistingSchemaWithoutCreateOnDatabase: an owner that may not
// create schemas installs into one a DBA created for it.
func TestUpIntoExistingSchemaWithoutCreateOnDatabase(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	owner := newRoles(t, "owner")[0]
	db := emptyDB(t)
	exec(t, db, "CREATE SCHEMA pgfence AUTHORIZATION "+pgx.Identifier{owner}.Sanitize())
	target := migrations.Target{ConnConfig: as(t, db, owner)}
	require.NoError(t, migrations.Up(ctx, target, nil))
	var objOwner string
	require.NoError(t, db.Pool.QueryRow(ctx, "SELECT relowner::regrole::text FROM pg_class WHERE oid = 'pgfence.pgfence_leases'::regclass").Scan(&objOwner))
	require.Equal(t, owner, objOwner)

	// Negative control: a schema it would have to create is refused.
	require.NoError(t, migrations.Down(ctx, target, nil))
	err := migrations.Up(ctx, target, &migrations.Config{Schema: "elsewhere"})
	requireSQLState(t, err, "42501")
}

// TestAppRoleCannotReviveOrPruneHeld: the two ways the functions' arguments
// could stretch a lease are closed. A release from a transaction that began
// before the lease expired cannot revive it with at_least (the check is on
// clock_timestamp(), not the transaction's now()), and prune refuses a
// negative age, which would delete a held lease from under its holder.
func TestAppRoleCannotReviveOrPruneHeld(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	roles := newRoles(t, "owner", "app")
	db := ownedInstall(t, roles[0], roles[1], "")
	holder, app := connAs(t, db, roles[1]), connAs(t, db, roles[1])

	tx, err := app.Begin(ctx) // its now() is from before the lease exists
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = tx.Exec(ctx, "SELECT now()")
	require.NoError(t, err)

	var short int64
	var shortSecret string
	require.NoError(t, holder.QueryRow(ctx, "SELECT fence, secret FROM pgfence.pgfence_acquire('{short}', 'h', '{300000}')").Scan(&short, &shortSecret))
	waitFor(t, db, "SELECT clock_timestamp() > expires_at FROM pgfence.pgfence_leases WHERE name = 'short'")
	rows, err := tx.Query(ctx, "SELECT fence FROM pgfence.pgfence_release('{short}', $1, $2, '{3600000000}')", []int64{short}, []string{shortSecret})
	require.NoError(t, err)
	revived, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	require.NoError(t, err)
	require.Empty(t, revived)
	require.NoError(t, tx.Commit(ctx))
	var expired bool
	require.NoError(t, holder.QueryRow(ctx, "SELECT expires_at <= clock_timestamp() FROM pgfence.pgfence_leases WHERE name = 'short'").Scan(&expired))
	require.True(t, expired, "the expired lease stays expired")

	// Negative control: the statement the function replaces, whose check
	// used now(), revives the lease in the same situation.
	owner := connAs(t, db, roles[0])
	otx, err := owner.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = otx.Rollback(ctx) }()
	_, err = otx.Exec(ctx, "SELECT now()")
	require.NoError(t, err)
	var short2 int64
	require.NoError(t, holder.QueryRow(ctx, "SELECT fence FROM pgfence.pgfence_acquire('{short2}', 'h', '{300000}')").Scan(&short2))
	waitFor(t, db, "SELECT clock_timestamp() > expires_at FROM pgfence.pgfence_leases WHERE name = 'short2'")
	var alive bool
	require.NoError(t, otx.QueryRow(ctx, `
		UPDATE pgfence.pgfence_leases AS l
		SET expires_at = greatest(now(), l.acquired_at + r.at_least_us * interval '1 microsecond')
		FROM unnest('{short2}'::text[], $1::bigint[], '{3600000000}'::bigint[]) AS r(name, fence, at_least_us)
		WHERE l.name = r.name AND l.owner = 'h' AND l.fence = r.fence AND l.expires_at > now()
		RETURNING l.expires_at > clock_timestamp()`, []int64{short2}).Scan(&alive))
	require.True(t, alive, "the old check revives an expired lease")
	require.NoError(t, otx.Rollback(ctx))

	// Negative control: at_least does keep a lease that is still held.
	var long int64
	var longSecret string
	require.NoError(t, holder.QueryRow(ctx, "SELECT fence, secret FROM pgfence.pgfence_acquire('{long}', 'h', '{60000000}')").Scan(&long, &longSecret))
	rows, err = app.Query(ctx, "SELECT fence FROM pgfence.pgfence_release('{long}', $1, $2, '{3600000000}')", []int64{long}, []string{longSecret})
	require.NoError(t, err)
	kept, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	require.NoError(t, err)
	require.Equal(t, []int64{long}, kept)

	// Prune with a negative age is refused, and the held lease stays.
	_, err = app.Exec(ctx, "SELECT pgfence.pgfence_prune_delete('{long}', $1, '-2 hours')", []int64{long})
	requireSQLState(t, err, "22023")
	_, err = app.Exec(ctx, "SELECT * FROM pgfence.pgfence_prune_scan('', 10, '-2 hours')")
	requireSQLState(t, err, "22023")
	var held bool
	require.NoError(t, app.QueryRow(ctx, "SELECT pgfence.pgfence_lease_held('long', $1, $2)", long, longSecret).Scan(&held))
	require.True(t, held)
	// Negative control: an age of a minute prunes the row expired for two
	// (aged by the superuser), not the held one.
	exec(t, db, "UPDATE pgfence.pgfence_leases SET expires_at = now() - interval '2 minutes' WHERE name = 'short'")
	var deleted int64
	require.NoError(t, app.QueryRow(ctx, "SELECT pgfence.pgfence_prune_delete('{long,short}', $1, '1 minute')", []int64{long, short}).Scan(&deleted))
	require.Equal(t, int64(1), deleted)
}
