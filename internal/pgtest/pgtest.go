// Package pgtest runs pgfence's tests against real PostgreSQL.
//
// It finds a server in this order, and never silently skips:
//
//  1. PGFENCE_TEST_DATABASE_URL: an existing server; the role needs CREATEDB.
//  2. Local server binaries (PG_BINDIR, PATH, /usr/lib/postgresql/*/bin):
//     a throwaway cluster from package pgserver in a private temporary
//     directory on a free port, run as the postgres user when the tests run
//     as root. It listens on its socket there (trust) and on 127.0.0.1,
//     where it requires a random password (scram-sha-256) that the URLs
//     the harness hands out carry.
//  3. A container engine (Docker, or podman's Docker API), through
//     testcontainers' postgres module: see [EnvImage] for the image and
//     [StartContainer] for how containers are cleaned up.
//
// When none works the test fails with a message naming all three.
//
// PGFENCE_TEST_SERVER ([EnvServer]) forces one of the three: "url",
// "local" or "container"; the others are then not tried, and a test that
// needs what the forced one cannot give fails saying so. Under "container"
// no local server binary is used at all: [NewCluster], which the fault
// tests use to stop, crash or signal their own server, fails.
//
// Each test gets its own database, cloned from a template database that has
// pgfence's migrations applied (advisory locks are per database, so this
// isolates them too). Fault tests that need to stop, crash or restart a
// server start their own [Cluster] with [NewCluster].
//
// Use [Main] in TestMain: it stops the shared server when the tests end and
// checks that no goroutine leaked.
//
// For network faults, [NewProxy] puts an in-process TCP proxy in front of a
// server; [StartPgBouncer] starts a throwaway PgBouncer (the tests that need
// it carry the build tag "tools", or are in the fault suite).
package pgtest

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/goleak"

	"github.com/pgfence/pgfence"
	"github.com/pgfence/pgfence/migrations"
)

// EnvDatabaseURL names the environment variable that points the tests at an
// existing server instead of a throwaway one.
const EnvDatabaseURL = "PGFENCE_TEST_DATABASE_URL"

// EnvServer names the environment variable that forces where the shared
// server comes from: "url" (EnvDatabaseURL must be set), "local" (local
// server binaries) or "container" (a container engine, through
// testcontainers; no local binary is used, and NewCluster fails). Unset
// or "auto", the harness tries them in that order.
const EnvServer = "PGFENCE_TEST_SERVER"

// serverMode returns EnvServer's value: "", "url", "local" or "container".
func serverMode() (string, error) {
	switch m := os.Getenv(EnvServer); m {
	case "", "auto":
		return "", nil
	case "url", "local", "container":
		return m, nil
	default:
		return "", fmt.Errorf("pgtest: %s=%q: want url, local, container or auto", EnvServer, m)
	}
}

// Options changes how [MainWithOptions] runs a package's tests.
type Options struct {
	// PreferDocker tries Docker (testcontainers) before local binaries when
	// no PGFENCE_TEST_DATABASE_URL is set.
	PreferDocker bool
	// LeakOptions are passed to goleak when checking for leaked goroutines.
	LeakOptions []goleak.Option
	// AfterRun, when set, runs after the tests, before the shared server
	// stops: for cleaning up what TestMain prepared (e.g. a built binary),
	// since MainWithOptions does not return.
	AfterRun func()
}

var (
	mainOpts   Options
	sharedOnce sync.Once
	shared     *Server
	sharedErr  error
)

// Main runs the tests, stops the shared server, then fails the run if any
// goroutine leaked. Call it from TestMain.
func Main(m *testing.M) { MainWithOptions(m, Options{}) }

// MainWithOptions is [Main] with options.
func MainWithOptions(m *testing.M, o Options) {
	mainOpts = o
	code := m.Run()
	if o.AfterRun != nil {
		o.AfterRun()
	}
	if shared != nil {
		shared.close()
	}
	if code == 0 {
		opts := append([]goleak.Option{
			// pgx's pool health checks and testcontainers' reaper run on
			// their own schedule; they are not pgfence's goroutines.
			goleak.IgnoreTopFunction("github.com/jackc/pgx/v5/pgxpool.(*Pool).backgroundHealthCheck"),
			goleak.IgnoreAnyFunction("github.com/testcontainers/testcontainers-go.(*Reaper).connect.func1"),
		}, o.LeakOptions...)
		if err := goleak.Find(opts...); err != nil {
			fmt.Fprintf(os.Stderr, "goleak: goroutines leaked after the tests: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}

// Server is a PostgreSQL server the tests create databases on.
type Server struct {
	// Kind says where the server came from: "url", "local" or "docker"
	// (a container engine, Docker's or podman's).
	Kind string
	// AdminURL connects to the server's maintenance database: for a local
	// throwaway cluster on its private unix socket, where every role the
	// tests create can log in without a password (TCP needs the postgres
	// role's password: see TCPURL).
	AdminURL string
	// TCPURL connects to the maintenance database over TCP (for tests that
	// put a proxy in between); for a local cluster it carries the postgres
	// role's password. It equals AdminURL for a server given by URL or
	// started in Docker.
	TCPURL string
	// Cluster is set when the server is a local throwaway cluster.
	Cluster *Cluster
	// Container is set when the server runs in a container.
	Container *Container

	admin    *pgxpool.Pool
	template string
	stop     func()
}

// Shared returns the server shared by the package's tests, starting it on
// first use. It fails the test when no server can be had.
func Shared(t testing.TB) *Server {
	t.Helper()
	sharedOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		shared, sharedErr = startShared(ctx, mainOpts.PreferDocker)
	})
	if sharedErr != nil {
		t.Fatal(sharedErr)
	}
	return shared
}

func startShared(ctx context.Context, preferDocker bool) (*Server, error) {
	mode, err := serverMode()
	if err != nil {
		return nil, err
	}
	u := os.Getenv(EnvDatabaseURL)
	switch {
	case mode == "url" && u == "":
		return nil, fmt.Errorf("pgtest: %s=url, but %s is not set", EnvServer, EnvDatabaseURL)
	case mode != "" && mode != "url" && u != "":
		return nil, fmt.Errorf("pgtest: %s=%s, but %s is set too: unset one of them", EnvServer, mode, EnvDatabaseURL)
	}
	if u != "" {
		s := &Server{Kind: "url", AdminURL: u, TCPURL: u, stop: func() {}}
		if err := s.init(ctx); err != nil {
			return nil, fmt.Errorf("pgtest: %s=%q: %w", EnvDatabaseURL, u, err)
		}
		return s, nil
	}
	var errs []string
	tryLocal := func() *Server {
		binDir := FindBinDir()
		if binDir == "" {
			errs = append(errs, "local binaries: no initdb/postgres in PG_BINDIR, PATH or /usr/lib/postgresql/*/bin")
			return nil
		}
		c, err := StartCluster(ctx, binDir, nil)
		if err != nil {
			errs = append(errs, "local binaries in "+binDir+": "+err.Error())
			return nil
		}
		s := &Server{Kind: "local", AdminURL: c.SocketURL("postgres"), TCPURL: c.URL("postgres"), Cluster: c, stop: c.Destroy}
		if err := s.init(ctx); err != nil {
			c.Destroy()
			errs = append(errs, "local binaries: "+err.Error())
			return nil
		}
		return s
	}
	tryContainer := func() *Server {
		c, err := StartContainer(ctx, mode == "container")
		if err != nil {
			errs = append(errs, "container engine (testcontainers): "+err.Error())
			return nil
		}
		s := &Server{Kind: "docker", AdminURL: c.URL, TCPURL: c.URL, Container: c, stop: c.Remove}
		if err := s.init(ctx); err != nil {
			c.Remove()
			errs = append(errs, "container engine (testcontainers), image "+c.Image+": "+err.Error())
			return nil
		}
		return s
	}
	order := []func() *Server{tryLocal, tryContainer}
	switch {
	case mode == "local":
		order = order[:1]
	case mode == "container":
		order = order[1:]
	case preferDocker:
		order = []func() *Server{tryContainer, tryLocal}
	}
	for _, try := range order {
		if s := try(); s != nil {
			return s, nil
		}
	}
	if mode != "" {
		return nil, fmt.Errorf("pgtest: no PostgreSQL to test against (%s=%s):\n  - %s",
			EnvServer, mode, strings.Join(errs, "\n  - "))
	}
	return nil, fmt.Errorf("pgtest: no PostgreSQL to test against. Do one of:\n"+
		"  1. set %s to a server URL whose role may CREATE DATABASE;\n"+
		"  2. install the PostgreSQL server binaries (apt-get install postgresql), or point PG_BINDIR at them;\n"+
		"  3. run a container engine (Docker, or podman's Docker API with DOCKER_HOST), for testcontainers.\n"+
		"Tried:\n  - %s", EnvDatabaseURL, strings.Join(errs, "\n  - "))
}

// init connects to the maintenance database and creates the migrated
// template database, unless a template of the same migrations exists.
func (s *Server) init(ctx context.Context) error {
	cfg, err := pgxpool.ParseConfig(s.AdminURL)
	if err != nil {
		return err
	}
	cfg.MaxConns = 4
	s.admin, err = pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return err
	}
	s.template = "pgfence_tmpl_" + migrationsHash()
	if err := s.ensureTemplate(ctx); err != nil {
		s.admin.Close()
		return err
	}
	return nil
}

func (s *Server) close() {
	if s.admin != nil {
		s.admin.Close()
	}
	s.stop()
}

// migrationsHash names the template after the migrations it holds and the
// schema they are installed in, so a shared server never serves a template
// from other migrations or another layout.
func migrationsHash() string {
	h := sha256.New()
	// The template has pgfence in the default schema (pgfence.DefaultSchema).
	fmt.Fprintf(h, "schema\x00%s\x00", "pgfence")
	_ = fs.WalkDir(migrations.FS, ".", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := migrations.FS.ReadFile(path)
		if err != nil {
			return err
		}
		fmt.Fprintf(h, "%s\x00%d\x00", path, len(b))
		h.Write(b)
		return nil
	})
	return hex.EncodeToString(h.Sum(nil))[:12]
}

func (s *Server) ensureTemplate(ctx context.Context) error {
	conn, err := s.admin.Acquire(ctx)
	if err != nil {
		return err
	}
	defer conn.Release()
	// Serialise template creation between test binaries sharing a server.
	const lockKey = 0x7067667465737400 // "pgftest\0"
	if _, err := conn.Exec(ctx, "SELECT pg_advisory_lock($1)", int64(lockKey)); err != nil {
		return err
	}
	defer func() {
		_, _ = conn.Exec(context.WithoutCancel(ctx), "SELECT pg_advisory_unlock($1)", int64(lockKey))
	}()
	var exists bool
	if err := conn.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1 AND datistemplate)", s.template).Scan(&exists); err != nil {
		return err
	}
	if exists {
		return nil
	}
	ident := pgx.Identifier{s.template}.Sanitize()
	if _, err := conn.Exec(ctx, "DROP DATABASE IF EXISTS "+ident+" WITH (FORCE)"); err != nil {
		return err
	}
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+ident); err != nil {
		return fmt.Errorf("create template database: %w", err)
	}
	// Into the default schema, pgfence.DefaultSchema.
	err = migrations.Up(ctx, migrations.Target{URL: urlWithDatabase(s.AdminURL, s.template)},
		&migrations.Config{Schema: pgfence.DefaultSchema})
	if err != nil {
		return fmt.Errorf("migrate template database: %w", err)
	}
	if _, err := conn.Exec(ctx, "ALTER DATABASE "+ident+" WITH IS_TEMPLATE true ALLOW_CONNECTIONS false"); err != nil {
		return err
	}
	return nil
}

// urlWithDatabase returns connURL pointing at database instead.
func urlWithDatabase(connURL, database string) string {
	cfg, err := pgx.ParseConfig(connURL)
	if err != nil {
		return connURL
	}
	// Rebuild through the keyword/value form, which every pgx caller takes.
	if strings.HasPrefix(connURL, "postgres://") || strings.HasPrefix(connURL, "postgresql://") {
		return replaceURLDatabase(connURL, database)
	}
	return connURL + " dbname=" + quoteKV(database) + fmt.Sprintf(" port=%d", cfg.Port)
}

var urlPathRE = regexp.MustCompile(`^(postgres(?:ql)?://[^/?]*)(/[^?]*)?(\?.*)?$`)

func replaceURLDatabase(u, database string) string {
	m := urlPathRE.FindStringSubmatch(u)
	if m == nil {
		return u
	}
	return m[1] + "/" + database + m[3]
}

func quoteKV(v string) string {
	return "'" + strings.NewReplacer(`\`, `\\`, `'`, `\'`).Replace(v) + "'"
}

// DB is one test's own database, cloned from the migrated template.
type DB struct {
	// Name is the database's name.
	Name string
	// URL connects to it (for a local cluster, on its private socket, as
	// any role the test creates).
	URL string
	// TCPURL connects to it over TCP (see Server.TCPURL).
	TCPURL string
	// Pool is a pool on it, closed when the test ends.
	Pool *pgxpool.Pool

	server *Server
}

// NewDB creates a database for t on the shared server, with pgfence's
// migrations applied, and drops it when t ends.
func NewDB(t testing.TB) *DB {
	t.Helper()
	return Shared(t).NewDB(t)
}

var dbSeq atomic.Int64

var nonIdent = regexp.MustCompile(`[^a-z0-9]+`)

// NewDB creates a database for t on s, with pgfence's migrations applied, and
// drops it when t ends.
func (s *Server) NewDB(t testing.TB) *DB {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var rnd [4]byte
	_, _ = rand.Read(rnd[:])
	base := nonIdent.ReplaceAllString(strings.ToLower(t.Name()), "_")
	if len(base) > 30 {
		base = base[len(base)-30:]
	}
	name := fmt.Sprintf("t_%s_%d_%s", strings.Trim(base, "_"), dbSeq.Add(1), hex.EncodeToString(rnd[:]))
	ident := pgx.Identifier{name}.Sanitize()
	if err := s.adminExec(ctx, "CREATE DATABASE "+ident+" TEMPLATE "+pgx.Identifier{s.template}.Sanitize()); err != nil {
		t.Fatalf("pgtest: create database: %v", err)
	}
	db := &DB{Name: name, URL: urlWithDatabase(s.AdminURL, name), TCPURL: urlWithDatabase(s.TCPURL, name), server: s}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := s.adminExec(ctx, "DROP DATABASE IF EXISTS "+ident+" WITH (FORCE)"); err != nil {
			t.Errorf("pgtest: drop database %s: %v", name, err)
		}
	})
	db.Pool = db.NewPool(t, nil)
	return db
}

// adminExec runs a statement on the maintenance database. Fault tests crash
// and restart servers, which breaks pooled connections: on a failure the
// pool's connections are dropped and the statement is tried again, up to
// three times in all.
func (s *Server) adminExec(ctx context.Context, sql string) error {
	var err error
	for attempt := 0; attempt < 3; attempt++ {
		if _, err = s.admin.Exec(ctx, sql); err == nil || ctx.Err() != nil {
			return err
		}
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && !strings.HasPrefix(pgErr.Code, "57") && !strings.HasPrefix(pgErr.Code, "08") {
			return err
		}
		s.admin.Reset()
	}
	return err
}

// NewPool opens another pool on the database, closed when t ends. configure,
// when not nil, may change the pool's configuration first.
func (db *DB) NewPool(t testing.TB, configure func(*pgxpool.Config)) *pgxpool.Pool {
	t.Helper()
	return db.newPool(t, db.URL, configure)
}

// NewTCPPool is NewPool over TCP (TCPURL), for tests of what only TCP
// connections have: keepalive settings, client addresses, proxies.
func (db *DB) NewTCPPool(t testing.TB, configure func(*pgxpool.Config)) *pgxpool.Pool {
	t.Helper()
	return db.newPool(t, db.TCPURL, configure)
}

func (db *DB) newPool(t testing.TB, url string, configure func(*pgxpool.Config)) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	if configure != nil {
		configure(cfg)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatalf("pgtest: open pool: %v", err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// Conn opens a single connection on the database, closed when t ends.
func (db *DB) Conn(t testing.TB) *pgx.Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, db.URL)
	if err != nil {
		t.Fatalf("pgtest: connect: %v", err)
	}
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	return conn
}

// NewCluster starts a dedicated throwaway cluster from the local server
// binaries for a fault test, with pgfence's template database, and destroys
// it when t ends. Fault tests need the server's controls (stop, crash,
// restart), so unlike [Shared] this always uses local binaries, and fails
// the test when there are none, or when PGFENCE_TEST_SERVER=container
// rules them out.
func NewCluster(t testing.TB, opts *ClusterOptions) (*Cluster, *Server) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if mode, _ := serverMode(); mode == "container" {
		t.Fatalf("pgtest: %s needs its own cluster from the local server binaries (it stops, crashes or "+
			"signals its server), which %s=container rules out: run it without %s", t.Name(), EnvServer, EnvServer)
	}
	binDir := FindBinDir()
	if binDir == "" {
		t.Fatal("pgtest: this fault test needs the PostgreSQL server binaries (initdb, postgres): " +
			"apt-get install postgresql, or set PG_BINDIR")
	}
	c, err := StartCluster(ctx, binDir, opts)
	if err != nil {
		t.Fatal(err)
	}
	s := &Server{Kind: "local", AdminURL: c.URL("postgres"), TCPURL: c.URL("postgres"), Cluster: c, stop: func() {}}
	t.Cleanup(func() {
		if s.admin != nil {
			s.admin.Close()
		}
		if t.Failed() {
			t.Logf("pgtest: cluster log tail:\n%s", c.LogTail())
		}
		c.Destroy()
	})
	if err := s.init(ctx); err != nil {
		t.Fatal(err)
	}
	return c, s
}
