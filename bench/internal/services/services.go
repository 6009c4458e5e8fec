// Package services starts the throwaway servers the benchmark runs against:
// a PostgreSQL cluster (through pgfence's test harness, with production
// durability settings), a Redis server and a single-member etcd cluster,
// each on a free loopback port, each dying with the benchmark process.
package services

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/migrations"
)

// PostgresSettings are the server settings of the benchmark cluster:
// production durability (full-page writes, synchronous commit; fsync is in
// PostgresAutoConfSettings) and
// PostgreSQL's default shared_buffers; pgtest's defaults cover the rest
// (max_connections 400, loopback only).
var PostgresSettings = map[string]string{
	"full_page_writes":   "on",
	"synchronous_commit": "on",
	"shared_buffers":     "128MB",
	// For the renewal scenario's statement counts and the profiles of
	// missed targets.
	"shared_preload_libraries": "pg_stat_statements",
}

// PostgresAutoConfSettings are settings of the benchmark cluster kept off
// the server's command line (in postgresql.auto.conf), so that a scenario
// may change them with ALTER SYSTEM and a reload: fsync, which scenario 11
// turns off for one arm and on again.
var PostgresAutoConfSettings = map[string]string{
	"fsync": "on",
}

// Postgres is a running benchmark database.
type Postgres struct {
	URL     string // the migrated benchmark database
	cluster *pgtest.Cluster
}

// StartPostgres starts a throwaway cluster with PostgresSettings and
// PostgresAutoConfSettings, creates
// the database pgfence_bench in it and applies pgfence's migrations.
func StartPostgres(ctx context.Context) (*Postgres, error) {
	c, err := pgtest.StartCluster(ctx, pgtest.FindBinDir(), &pgtest.ClusterOptions{Settings: PostgresSettings, AutoConfSettings: PostgresAutoConfSettings})
	if err != nil {
		return nil, err
	}
	p := &Postgres{cluster: c, URL: c.URL("pgfence_bench")}
	conn, err := pgx.Connect(ctx, c.URL("postgres"))
	if err != nil {
		c.Destroy()
		return nil, err
	}
	_, err = conn.Exec(ctx, `CREATE DATABASE pgfence_bench`)
	_ = conn.Close(ctx)
	if err != nil {
		c.Destroy()
		return nil, fmt.Errorf("create database: %w", err)
	}
	if err := migrations.Up(ctx, migrations.Target{URL: p.URL}, nil); err != nil {
		c.Destroy()
		return nil, err
	}
	if conn, err := pgx.Connect(ctx, p.URL); err == nil {
		// Best effort: without it the benchmark counts with a pgx tracer.
		// Tracking stays off (ALTER SYSTEM, since settings given on the
		// command line could not be changed later) until the benchmark
		// profiles a point, so it does not weigh on the other figures.
		_, _ = conn.Exec(ctx, `CREATE EXTENSION IF NOT EXISTS pg_stat_statements`)
		_, _ = conn.Exec(ctx, `ALTER SYSTEM SET pg_stat_statements.track = 'none'`)
		_, _ = conn.Exec(ctx, `SELECT pg_reload_conf()`)
		_ = conn.Close(ctx)
	}
	return p, nil
}

// AppRole prepares role as the application role of the database at
// ownerURL, whose user owns pgfence's install, and returns the URL to
// connect as it. With create (the benchmark's own cluster, which asks for a
// password over TCP), the role is created with a random password, which the
// URL carries; otherwise it must exist and the URL carries no password (the
// owner's is dropped): the role then needs one from the environment or
// ~/.pgpass, as pgx reads them. Either way it is granted exactly what
// migrations.Grant grants, and nothing else is granted to it here.
func AppRole(ctx context.Context, ownerURL, role string, create bool) (string, error) {
	password := ""
	if create {
		var b [16]byte
		if _, err := rand.Read(b[:]); err != nil {
			return "", err
		}
		password = hex.EncodeToString(b[:])
		conn, err := pgx.Connect(ctx, ownerURL)
		if err != nil {
			return "", err
		}
		var exists bool
		err = conn.QueryRow(ctx, `SELECT EXISTS (SELECT FROM pg_catalog.pg_roles WHERE rolname = $1)`, role).Scan(&exists)
		if err == nil {
			// A hex password needs no quoting beyond the literal's.
			verb := "CREATE"
			if exists {
				verb = "ALTER"
			}
			_, err = conn.Exec(ctx, verb+" ROLE "+pgx.Identifier{role}.Sanitize()+" LOGIN PASSWORD '"+password+"'")
		}
		_ = conn.Close(ctx)
		if err != nil {
			return "", fmt.Errorf("create role %s: %w", role, err)
		}
	}
	if err := migrations.Grant(ctx, migrations.Target{URL: ownerURL}, role, nil, nil); err != nil {
		return "", fmt.Errorf("grant to %s: %w", role, err)
	}
	return withUser(ownerURL, role, password)
}

// withUser returns the connection string s with its user replaced by user
// and its password by password (none when empty): a URL, or a keyword/value
// string (later keywords win).
func withUser(s, user, password string) (string, error) {
	if !strings.Contains(s, "://") {
		q := strings.NewReplacer(`\`, `\\`, `'`, `\'`)
		return s + " user='" + q.Replace(user) + "' password='" + q.Replace(password) + "'", nil
	}
	u, err := url.Parse(s)
	if err != nil {
		return "", fmt.Errorf("parse database URL: %w", err)
	}
	u.User = url.User(user)
	if password != "" {
		u.User = url.UserPassword(user, password)
	}
	return u.String(), nil
}

// Stop stops the cluster and removes its files.
func (p *Postgres) Stop() { p.cluster.Destroy() }

// freePort returns a free TCP port on 127.0.0.1.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// Process is a server process the benchmark started.
type Process struct {
	Addr string // host:port clients connect to
	cmd  *exec.Cmd
	dir  string
	log  string // the server's log file
	done chan struct{}
}

// start runs bin with args, logging to dir/name.log, dying with this
// process: the parent-death signal (SIGTERM) is tied by Linux to the thread
// that started the child, so the child is started from a goroutine locked
// to its thread, which it keeps until the child exits.
func start(bin string, args []string, dir, name string) (*Process, error) {
	logPath := filepath.Join(dir, name+".log")
	log, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr, cmd.Dir = log, log, dir
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGTERM}
	p := &Process{cmd: cmd, dir: dir, log: logPath, done: make(chan struct{})}
	started := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		defer close(p.done)
		defer log.Close()
		if err := cmd.Start(); err != nil {
			started <- fmt.Errorf("start %s: %w", bin, err)
			return
		}
		started <- nil
		_ = cmd.Wait()
	}()
	if err := <-started; err != nil {
		return nil, err
	}
	return p, nil
}

// Stop terminates the server (SIGTERM, then SIGKILL after 10s) and removes
// its temporary directory.
func (p *Process) Stop() {
	if p == nil || p.cmd == nil {
		return
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
	_ = os.RemoveAll(p.dir)
}

func (p *Process) logTail() string {
	b, _ := os.ReadFile(p.log)
	if len(b) > 2000 {
		b = b[len(b)-2000:]
	}
	return string(b)
}

// waitReady calls ready until it succeeds, the process exits or 20s pass.
func (p *Process) waitReady(ctx context.Context, ready func(context.Context) error) error {
	deadline := time.Now().Add(20 * time.Second)
	for {
		cctx, cancel := context.WithTimeout(ctx, time.Second)
		err := ready(cctx)
		cancel()
		if err == nil {
			return nil
		}
		select {
		case <-p.done:
			return fmt.Errorf("%s exited during start-up:\n%s", p.cmd.Path, p.logTail())
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s not ready after 20s: %w\n%s", p.cmd.Path, err, p.logTail())
		}
	}
}

// StartRedis starts redis-server on a free loopback port with persistence
// off (no RDB snapshots, no AOF): Redis as lock services usually run it,
// and as redislock's own tests do. It returns an error when redis-server is
// not installed.
func StartRedis(ctx context.Context) (*Process, error) {
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		return nil, errors.New("redis-server not found (apt-get install redis-server), or pass -redis host:port")
	}
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "pgfence-bench-redis-")
	if err != nil {
		return nil, err
	}
	p, err := start(bin, []string{"--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--save", "",
		"--appendonly", "no", "--daemonize", "no", "--dir", dir}, dir, "redis-server")
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	p.Addr = "127.0.0.1:" + strconv.Itoa(port)
	err = p.waitReady(ctx, func(ctx context.Context) error {
		rc := redis.NewClient(&redis.Options{Addr: p.Addr})
		defer rc.Close()
		return rc.Ping(ctx).Err()
	})
	if err != nil {
		p.Stop()
		return nil, err
	}
	return p, nil
}

// StartEtcd starts a single-member etcd on free loopback ports with its
// data directory in a temporary directory. etcd fsyncs its WAL on every
// commit by default, as PostgreSQL does with synchronous_commit=on.
func StartEtcd(ctx context.Context) (*Process, error) {
	bin, err := exec.LookPath("etcd")
	if err != nil {
		return nil, errors.New("etcd not found (apt-get install etcd-server), or pass -etcd URL")
	}
	clientPort, err := freePort()
	if err != nil {
		return nil, err
	}
	peerPort, err := freePort()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "pgfence-bench-etcd-")
	if err != nil {
		return nil, err
	}
	clientURL := "http://127.0.0.1:" + strconv.Itoa(clientPort)
	peerURL := "http://127.0.0.1:" + strconv.Itoa(peerPort)
	p, err := start(bin, []string{
		"--name", "bench", "--data-dir", filepath.Join(dir, "data"),
		"--listen-client-urls", clientURL, "--advertise-client-urls", clientURL,
		"--listen-peer-urls", peerURL, "--initial-advertise-peer-urls", peerURL,
		"--initial-cluster", "bench=" + peerURL, "--initial-cluster-state", "new",
		"--auto-compaction-mode", "revision", "--auto-compaction-retention", "100000",
		"--logger", "zap", "--log-level", "error",
	}, dir, "etcd")
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	p.Addr = clientURL
	err = p.waitReady(ctx, func(ctx context.Context) error {
		c, err := clientv3.New(clientv3.Config{Endpoints: []string{clientURL}, DialTimeout: time.Second, Logger: zap.NewNop()})
		if err != nil {
			return err
		}
		defer c.Close()
		_, err = c.Status(ctx, clientURL)
		return err
	})
	if err != nil {
		p.Stop()
		return nil, err
	}
	return p, nil
}
