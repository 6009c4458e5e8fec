package systems

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"cirello.io/pglock"
	"github.com/bsm/redislock"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/redis/go-redis/v9"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"

	"github.com/pgfence/pgfence/bench/internal/harness"
)

// PglockConfig sets pglock's timing. Its waiting Acquire polls once per
// lease duration, so hand-over takes up to one lease: the benchmark shortens
// the library defaults (20s lease, 5s heartbeat) so a hand-over round fits
// the time bound.
type PglockConfig struct {
	Lease     time.Duration
	Heartbeat time.Duration
}

// Pglock returns the spec of cirello.io/pglock through pgx's database/sql
// driver and pglock.UnsafeNew, with its default table ("locks") and release
// mode (DELETE).
func Pglock(cfg PglockConfig) harness.Spec {
	return harness.Spec{
		Name: "pglock",
		Kind: harness.Peer,
		Note: fmt.Sprintf("cirello.io/pglock v1.16.1 via pgx stdlib + UnsafeNew; acquire = nextval + upsert, release = DELETE (3 statements), plus a first heartbeat (nextval + UPDATE) that pglock starts in the background right after acquiring (a quick release cancels it); lease %v, heartbeat %v; waiting Acquire retries once per lease", cfg.Lease, cfg.Heartbeat),
		Open: func(ctx context.Context, env *harness.Env, clients int) (harness.System, error) {
			connCfg, err := pgx.ParseConfig(env.DatabaseURL)
			if err != nil {
				return nil, fmt.Errorf("parse database URL: %w", err)
			}
			if env.WriteDelay > 0 {
				connCfg.DialFunc = delayedDial(connCfg.DialFunc, env.WriteDelay)
			}
			db := stdlib.OpenDB(*connCfg)
			db.SetMaxOpenConns(clients)
			db.SetMaxIdleConns(clients)
			if err := db.PingContext(ctx); err != nil {
				db.Close()
				return nil, err
			}
			c, err := pglock.UnsafeNew(db, pglock.WithLeaseDuration(cfg.Lease), pglock.WithHeartbeatFrequency(cfg.Heartbeat))
			if err != nil {
				db.Close()
				return nil, err
			}
			if err := c.TryCreateTable(); err != nil {
				db.Close()
				return nil, err
			}
			return &pglockSystem{db: db, c: c}, nil
		},
	}
}

type pglockSystem struct {
	db *sql.DB
	c  *pglock.Client
}

func (s *pglockSystem) TryAcquire(ctx context.Context, name string) (harness.Release, error) {
	l, err := s.c.AcquireContext(ctx, name, pglock.FailIfLocked())
	if errors.Is(err, pglock.ErrNotAcquired) {
		return nil, harness.ErrBusy
	}
	if err != nil {
		return nil, err
	}
	return s.release(l), nil
}

func (s *pglockSystem) Acquire(ctx context.Context, name string) (harness.Release, error) {
	l, err := s.c.AcquireContext(ctx, name)
	if err != nil {
		if l != nil {
			_ = s.c.ReleaseContext(context.WithoutCancel(ctx), l)
		}
		return nil, err
	}
	return s.release(l), nil
}

func (s *pglockSystem) release(l *pglock.Lock) harness.Release {
	return func(ctx context.Context) error { return s.c.ReleaseContext(ctx, l) }
}

func (s *pglockSystem) Reset(ctx context.Context) error {
	_, err := s.db.ExecContext(ctx, `TRUNCATE locks`)
	return err
}

func (s *pglockSystem) Tables() []string { return []string{"locks"} }

// pglockFill adds held locks (a record version number set) on names never
// acquired.
const pglockFill = `INSERT INTO locks (name, record_version_number, data, owner)
SELECT 'fill-' || g, g, NULL, 'filler' FROM generate_series(1, $1::int) AS g
ON CONFLICT (name) DO NOTHING`

func (s *pglockSystem) FillLive(ctx context.Context, n int) error {
	_, err := s.db.ExecContext(ctx, pglockFill, n)
	return err
}

func (s *pglockSystem) Close() error { return s.db.Close() }

// RedisConfig sets redislock's parameters.
type RedisConfig struct {
	TTL   time.Duration // lock TTL
	Retry time.Duration // linear back-off of a waiting Obtain
}

// Redislock returns the spec of github.com/bsm/redislock on a go-redis
// client.
func Redislock(cfg RedisConfig) harness.Spec {
	return harness.Spec{
		Name: "redislock",
		Kind: harness.Peer,
		Note: fmt.Sprintf("github.com/bsm/redislock v0.9.4 (go-redis v9) on a local Redis over loopback; SET NX PX + Lua DEL (2 round trips); TTL %v; waiting Obtain polls every %v", cfg.TTL, cfg.Retry),
		Open: func(ctx context.Context, env *harness.Env, clients int) (harness.System, error) {
			rc := redis.NewClient(&redis.Options{Addr: env.RedisAddr, PoolSize: clients, MinIdleConns: clients})
			if err := rc.Ping(ctx).Err(); err != nil {
				_ = rc.Close()
				return nil, err
			}
			return &redisSystem{rc: rc, l: redislock.New(rc), cfg: cfg}, nil
		},
	}
}

type redisSystem struct {
	rc  *redis.Client
	l   *redislock.Client
	cfg RedisConfig
}

func (s *redisSystem) TryAcquire(ctx context.Context, name string) (harness.Release, error) {
	lk, err := s.l.Obtain(ctx, "bench:"+name, s.cfg.TTL, nil)
	if errors.Is(err, redislock.ErrNotObtained) {
		return nil, harness.ErrBusy
	}
	if err != nil {
		return nil, err
	}
	return lk.Release, nil
}

func (s *redisSystem) Acquire(ctx context.Context, name string) (harness.Release, error) {
	opt := &redislock.Options{RetryStrategy: redislock.LinearBackoff(s.cfg.Retry)}
	for {
		// Obtain gives up after one TTL; keep waiting until ctx ends.
		lk, err := s.l.Obtain(ctx, "bench:"+name, s.cfg.TTL, opt)
		if errors.Is(err, redislock.ErrNotObtained) && ctx.Err() == nil {
			continue
		}
		if err != nil {
			return nil, err
		}
		return lk.Release, nil
	}
}

func (s *redisSystem) Close() error { return s.rc.Close() }

// EtcdConfig sets the etcd mutex's parameters.
type EtcdConfig struct {
	SessionTTL int // seconds
}

// EtcdMutex returns the spec of etcd's concurrency.Mutex, one session
// (lease) per concurrent holder, all on one client connection.
func EtcdMutex(cfg EtcdConfig) harness.Spec {
	return harness.Spec{
		Name: "etcd-mutex",
		Kind: harness.Peer,
		Note: fmt.Sprintf("go.etcd.io/etcd/client/v3 concurrency.Mutex on a single local etcd (fsync on); TryLock = txn + get, Unlock = delete; one session (TTL %ds) per concurrent holder; Lock waits by watching the previous key", cfg.SessionTTL),
		Open: func(ctx context.Context, env *harness.Env, clients int) (harness.System, error) {
			c, err := clientv3.New(clientv3.Config{Endpoints: env.EtcdEndpoints, DialTimeout: 5 * time.Second, Logger: nopLogger()})
			if err != nil {
				return nil, err
			}
			s := &etcdSystem{c: c, ttl: cfg.SessionTTL, sessions: make(chan *concurrency.Session, clients+1)}
			// Open the sessions up front so their creation is not measured.
			for i := 0; i < clients; i++ {
				sess, err := concurrency.NewSession(c, concurrency.WithTTL(cfg.SessionTTL))
				if err != nil {
					_ = s.Close()
					return nil, err
				}
				s.sessions <- sess
			}
			return s, nil
		},
	}
}

type etcdSystem struct {
	c        *clientv3.Client
	ttl      int
	sessions chan *concurrency.Session
}

func (s *etcdSystem) session() (*concurrency.Session, error) {
	select {
	case sess := <-s.sessions:
		return sess, nil
	default:
		return concurrency.NewSession(s.c, concurrency.WithTTL(s.ttl))
	}
}

func (s *etcdSystem) put(sess *concurrency.Session) {
	select {
	case s.sessions <- sess:
	default:
		_ = sess.Close()
	}
}

func (s *etcdSystem) TryAcquire(ctx context.Context, name string) (harness.Release, error) {
	return s.lock(ctx, name, true)
}

func (s *etcdSystem) Acquire(ctx context.Context, name string) (harness.Release, error) {
	return s.lock(ctx, name, false)
}

func (s *etcdSystem) lock(ctx context.Context, name string, try bool) (harness.Release, error) {
	sess, err := s.session()
	if err != nil {
		return nil, err
	}
	m := concurrency.NewMutex(sess, "/bench/"+name)
	if try {
		err = m.TryLock(ctx)
	} else {
		err = m.Lock(ctx)
	}
	if errors.Is(err, concurrency.ErrLocked) {
		s.put(sess)
		return nil, harness.ErrBusy
	}
	if err != nil {
		// A failed Lock deletes its own key; the session is still usable.
		s.put(sess)
		return nil, err
	}
	return func(ctx context.Context) error {
		err := m.Unlock(ctx)
		s.put(sess)
		return err
	}, nil
}

func (s *etcdSystem) Close() error {
	close(s.sessions)
	for sess := range s.sessions {
		_ = sess.Close()
	}
	return s.c.Close()
}
