package main

import (
	"bufio"
	"context"
	"os"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// machineInfo describes where the figures were measured.
type machineInfo struct {
	CPU        string
	Cores      int
	MemoryGiB  float64
	LoadAvg    string // at the start of the run
	LoadAvgEnd string // at the end
	GoVersion  string
	OS         string
	Postgres   map[string]string // server_version and the settings that decide commit cost
	Redis      string
	Etcd       string
}

// postgresSettings are the settings reported with every run.
var postgresSettings = []string{"server_version", "fsync", "synchronous_commit", "full_page_writes",
	"wal_sync_method", "shared_buffers", "max_connections", "wal_level", "autovacuum"}

func gatherMachine(ctx context.Context, dbURL, redisAddr string, etcd []string) machineInfo {
	m := machineInfo{Cores: runtime.NumCPU(), GoVersion: runtime.Version(), OS: runtime.GOOS + "/" + runtime.GOARCH,
		Postgres: map[string]string{}}
	if f, err := os.Open("/proc/cpuinfo"); err == nil {
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			if k, v, ok := strings.Cut(sc.Text(), ":"); ok && strings.TrimSpace(k) == "model name" {
				m.CPU = strings.TrimSpace(v)
				break
			}
		}
		f.Close()
	}
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if f := strings.Fields(line); len(f) >= 2 && f[0] == "MemTotal:" {
				kb, _ := strconv.ParseFloat(f[1], 64)
				m.MemoryGiB = kb / 1024 / 1024
			}
		}
	}
	m.LoadAvg = loadAvg()
	if dbURL != "" {
		_ = withConn(ctx, dbURL, func(c *pgx.Conn) error {
			for _, s := range postgresSettings {
				var v string
				if err := c.QueryRow(ctx, "SELECT current_setting($1)", s).Scan(&v); err == nil {
					m.Postgres[s] = v
				}
			}
			return nil
		})
	}
	if redisAddr != "" {
		rc := redis.NewClient(&redis.Options{Addr: redisAddr})
		if info, err := rc.Info(ctx, "server", "persistence").Result(); err == nil {
			var parts []string
			for _, line := range strings.Split(info, "\r\n") {
				if strings.HasPrefix(line, "redis_version:") || strings.HasPrefix(line, "aof_enabled:") {
					parts = append(parts, line)
				}
			}
			m.Redis = strings.Join(parts, ", ")
		}
		_ = rc.Close()
	}
	if len(etcd) > 0 {
		if c, err := clientv3.New(clientv3.Config{Endpoints: etcd, Logger: zap.NewNop()}); err == nil {
			if st, err := c.Status(ctx, etcd[0]); err == nil {
				m.Etcd = "server " + st.Version + ", single member, client " + depVersion("go.etcd.io/etcd/client/v3")
			}
			_ = c.Close()
		}
	}
	return m
}

// depVersion returns the version of a module linked into this binary.
func depVersion(path string) string {
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, d := range bi.Deps {
			if d.Path == path {
				return d.Version
			}
		}
	}
	return "unknown"
}

func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return ""
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return ""
	}
	return strings.Join(f[:3], " ")
}
