// Command bench measures pgfence against its peers and against raw-SQL
// ceilings, side by side in one run on one machine and one PostgreSQL, and
// writes results/latest.md with SVG charts.
//
// Run every scenario (about two minutes):
//
//	cd bench && go run . -quick
//
// Without -quick each point runs longer and the scale scenario does
// 1,000,000 acquire/release cycles. By default the command starts its own
// servers on loopback and stops them at the end: a PostgreSQL cluster
// (fsync, full_page_writes and synchronous_commit on), redis-server and a
// single-member etcd. -database, -redis and -etcd point it at existing
// ones instead; the database must be disposable (the benchmark creates and
// truncates its tables and pgfence's). -app-role connects pgfence's lockers
// as a role holding only what migrations.Grant grants, as an application
// should run.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/pgfence/pgfence/bench/internal/harness"
	"github.com/pgfence/pgfence/bench/internal/services"
	"github.com/pgfence/pgfence/bench/internal/systems"
	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/leasetable"
	"github.com/pgfence/pgfence/migrations"
)

// config holds the run's parameters, all printed and reported.
type config struct {
	Quick            bool
	Duration         time.Duration
	Warmup           time.Duration
	Clients          []int
	Scenarios        []int
	Systems          []string
	DatabaseURL      string
	AppRole          string
	RedisAddr        string
	EtcdURL          string
	Out              string
	Pgbench          string
	HandoverWaiters  int
	HoldShort        time.Duration
	HoldLong         time.Duration
	HandoversLong    int
	HandoversMin     int
	Rounds           int
	LongDuration     time.Duration
	ContendedClients int
	ContendedNames   int
	WriteClients     int
	ScaleClients     int
	ScaleRows        []int
	ScaleCycles      int64
	ScaleNames       int
	ScaleTimeout     time.Duration
	PglockLease      time.Duration
	RedisRetry       time.Duration
	RenewalLeases    int
	RenewalTTL       time.Duration
	RenewalIntervals int
	AdvisoryLocks    int
	CallBatches      int
	CallCycles       int
	ObserveBatches   int
	ObserveClients   int
	CPUProfile       string
	HerdWaiters      []int
	HerdNames        int
	HerdProcesses    int
	WriteDelay       time.Duration
	OwnershipRounds  int
}

func parseFlags(args []string) (*config, error) {
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	c := &config{}
	var clients, scenarios, sysList, rows, herdWaiters string
	fs.BoolVar(&c.Quick, "quick", false, "short points and a small scale run: the whole suite in about two minutes")
	fs.DurationVar(&c.Duration, "duration", 0, "measured time per point (default 5s, 1s with -quick)")
	fs.DurationVar(&c.WriteDelay, "write-delay", 0, "sleep this long before every write to PostgreSQL on the connections of the compared PostgreSQL systems (ceilings, pglock, pgfence and its Lockers' sessions), as a network round trip would delay each statement; scenarios 6, 7, 9 and 11 open their own connections and ignore it (Go rounds short sleeps up, to about 1ms on some machines: the raw arms' cycle p50 shows the delay that ran)")
	fs.DurationVar(&c.Warmup, "warmup", 0, "unmeasured warm-up per point (default 1s, 250ms with -quick)")
	fs.StringVar(&clients, "clients", "1,4,16,64", "client counts of the uncontended scenario")
	fs.StringVar(&scenarios, "scenarios", "1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16", "scenarios to run")
	fs.StringVar(&sysList, "systems", "", "comma-separated system names to run (default all)")
	fs.StringVar(&c.DatabaseURL, "database", "", "a disposable, empty PostgreSQL database to use instead of starting a cluster; pgfence migrations are applied")
	fs.StringVar(&c.AppRole, "app-role", "", "connect pgfence's lockers (and raw-advisory-token) as this role, granted only what migrations.Grant grants; created in the benchmark's own cluster, must exist with -database (default: the owner that migrated)")
	fs.StringVar(&c.RedisAddr, "redis", "", "host:port of a Redis to use instead of starting redis-server")
	fs.StringVar(&c.EtcdURL, "etcd", "", "client URL of an etcd to use instead of starting one")
	fs.StringVar(&c.Out, "out", "results", "directory for latest.md and the SVG charts")
	fs.StringVar(&c.Pgbench, "pgbench", "", "pgbench binary (default: next to the PostgreSQL server binaries, then PATH; \"off\" skips it)")
	fs.IntVar(&c.HandoverWaiters, "handover-waiters", 8, "waiters on the one name in the hand-over scenario")
	fs.DurationVar(&c.HoldShort, "hold-short", time.Millisecond, "short hold time in the hand-over scenario")
	fs.DurationVar(&c.HoldLong, "hold-long", time.Second, "long hold time in the hand-over scenario")
	fs.IntVar(&c.HandoversLong, "handovers-long", 0, "hand-overs measured with long holds (default 20, 4 with -quick)")
	fs.IntVar(&c.HandoversMin, "handovers-min", 5, "short-hold hand-over runs go on past -duration until this many hand-overs (at most -long-duration)")
	fs.IntVar(&c.Rounds, "rounds", 0, "rounds of scenarios 1, 3 and 4, interleaved across systems; figures are medians over rounds (default 3, 1 with -quick)")
	fs.DurationVar(&c.LongDuration, "long-duration", 0, "time bound of a hand-over run (default 30s, 6s with -quick)")
	fs.IntVar(&c.ContendedClients, "contended-clients", 16, "clients of the contended scenario")
	fs.IntVar(&c.ContendedNames, "contended-names", 4, "names the contended clients share")
	fs.IntVar(&c.WriteClients, "write-clients", 16, "clients of the fenced-write scenario")
	fs.IntVar(&c.ScaleClients, "scale-clients", 4, "clients of the scale scenario")
	fs.StringVar(&rows, "scale-rows", "1000,1000000", "live rows in the lock table for the scale latency points")
	fs.Int64Var(&c.ScaleCycles, "scale-cycles", 0, "acquire/release cycles on -scale-names names before measuring table size and HOT ratio (default 1000000, 10000 with -quick)")
	fs.IntVar(&c.ScaleNames, "scale-names", 100, "names cycled in the scale scenario")
	fs.DurationVar(&c.ScaleTimeout, "scale-timeout", 0, "time bound of the scale cycles per system (default 10m, 30s with -quick)")
	fs.DurationVar(&c.PglockLease, "pglock-lease", 2*time.Second, "pglock lease duration (heartbeat a quarter of it); its hand-over waits up to one lease")
	fs.DurationVar(&c.RedisRetry, "redis-retry", 5*time.Millisecond, "redislock's linear retry interval while waiting")
	fs.IntVar(&c.RenewalLeases, "renewal-leases", 10_000, "leases one Locker holds in the renewal scenario")
	fs.DurationVar(&c.RenewalTTL, "renewal-ttl", 3*time.Second, "lease TTL in the renewal scenario (renewed every TTL/3)")
	fs.IntVar(&c.RenewalIntervals, "renewal-intervals", 0, "renewal intervals measured (default 10, 3 with -quick)")
	fs.IntVar(&c.AdvisoryLocks, "advisory-locks", 10_000, "session locks one advisory Locker holds in scenario 7")
	fs.IntVar(&c.CallBatches, "call-batches", 0, "batches per path in the security-cost, ownership-cost and registry-cost scenarios (8, 13, 14), alternating between the paths (default 20, 6 with -quick)")
	fs.IntVar(&c.CallCycles, "call-cycles", 200, "cycles per batch in the security-cost, ownership-cost and registry-cost scenarios (8, 13, 14)")
	fs.IntVar(&c.OwnershipRounds, "ownership-rounds", 50, "hand-overs per batch and version in the ownership-cost scenario (13)")
	fs.IntVar(&c.ObserveBatches, "observe-batches", 0, "batches of the observer-cost scenario, each running every observer arm at once for -duration (default 10, 4 with -quick)")
	fs.IntVar(&c.ObserveClients, "observe-clients", 4, "clients of each arm of the observer-cost scenario")
	fs.StringVar(&herdWaiters, "herd-waiters", "1,10,100,1000", "waiters on one name in scenario 11")
	fs.IntVar(&c.HerdNames, "herd-names", 10_000, "names with one waiter each in scenario 11's many-names point")
	fs.IntVar(&c.HerdProcesses, "herd-processes", 10, "worker processes (one Locker each), or Lockers in one process, in scenario 11")
	fs.StringVar(&c.CPUProfile, "cpuprofile", "", "write a Go CPU profile of the whole run (benchmark clients and libraries) to this file")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	def := func(d *time.Duration, full, quick time.Duration) {
		if *d == 0 {
			*d = full
			if c.Quick {
				*d = quick
			}
		}
	}
	def(&c.Duration, 5*time.Second, time.Second)
	def(&c.Warmup, time.Second, 250*time.Millisecond)
	def(&c.LongDuration, 30*time.Second, 6*time.Second)
	def(&c.ScaleTimeout, 10*time.Minute, 30*time.Second)
	if c.HandoversLong == 0 {
		c.HandoversLong = 20
		if c.Quick {
			c.HandoversLong = 4
		}
	}
	if c.RenewalIntervals == 0 {
		c.RenewalIntervals = 10
		if c.Quick {
			c.RenewalIntervals = 3
		}
	}
	if c.CallBatches == 0 {
		c.CallBatches = 20
		if c.Quick {
			c.CallBatches = 6
		}
	}
	if c.ObserveBatches == 0 {
		c.ObserveBatches = 10
		if c.Quick {
			c.ObserveBatches = 4
		}
	}
	if c.Rounds == 0 {
		c.Rounds = 3
		if c.Quick {
			c.Rounds = 1
		}
	}
	if c.ScaleCycles == 0 {
		c.ScaleCycles = 1_000_000
		if c.Quick {
			c.ScaleCycles = 10_000
		}
	}
	var err error
	if c.Clients, err = parseInts(clients); err != nil {
		return nil, fmt.Errorf("-clients: %w", err)
	}
	if c.Scenarios, err = parseInts(scenarios); err != nil {
		return nil, fmt.Errorf("-scenarios: %w", err)
	}
	for _, s := range c.Scenarios {
		if s < 1 || s > 16 {
			return nil, fmt.Errorf("-scenarios: no scenario %d", s)
		}
	}
	if c.HerdWaiters, err = parseInts(herdWaiters); err != nil {
		return nil, fmt.Errorf("-herd-waiters: %w", err)
	}
	if c.ScaleRows, err = parseInts(rows); err != nil {
		return nil, fmt.Errorf("-scale-rows: %w", err)
	}
	if sysList != "" {
		c.Systems = strings.Split(sysList, ",")
	}
	for _, v := range []struct {
		name string
		n    int
	}{{"-handover-waiters", c.HandoverWaiters}, {"-contended-clients", c.ContendedClients},
		{"-contended-names", c.ContendedNames}, {"-write-clients", c.WriteClients},
		{"-scale-clients", c.ScaleClients}, {"-scale-names", c.ScaleNames}, {"-rounds", c.Rounds},
		{"-renewal-leases", c.RenewalLeases}, {"-advisory-locks", c.AdvisoryLocks},
		{"-call-batches", c.CallBatches}, {"-call-cycles", c.CallCycles},
		{"-observe-batches", c.ObserveBatches}, {"-observe-clients", c.ObserveClients},
		{"-herd-names", c.HerdNames}, {"-herd-processes", c.HerdProcesses}, {"-ownership-rounds", c.OwnershipRounds}} {
		if v.n < 1 {
			return nil, fmt.Errorf("%s must be at least 1", v.name)
		}
	}
	if c.ScaleNames < c.ScaleClients {
		return nil, fmt.Errorf("-scale-names (%d) must be at least -scale-clients (%d)", c.ScaleNames, c.ScaleClients)
	}
	if c.RenewalTTL < leasetable.MinTTL {
		return nil, fmt.Errorf("-renewal-ttl %v is shorter than leasetable.MinTTL (%v)", c.RenewalTTL, leasetable.MinTTL)
	}
	if c.PglockLease < 40*time.Millisecond {
		return nil, fmt.Errorf("-pglock-lease %v is too short", c.PglockLease)
	}
	if c.WriteDelay < 0 {
		return nil, fmt.Errorf("-write-delay %v is negative", c.WriteDelay)
	}
	return c, nil
}

func parseInts(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			return nil, fmt.Errorf("%q is not a positive integer", f)
		}
		out = append(out, n)
	}
	return out, nil
}

// specs returns every system the run compares, in report order: ceilings,
// pgfence, then peers.
func specs(c *config) []harness.Spec {
	return []harness.Spec{
		systems.UpdateCeiling,
		systems.UpdateNotifyCeiling,
		systems.AdvisoryCeiling,
		systems.AdvisoryXactCeiling,
		systems.AdvisoryTokenCeiling,
		systems.RCLeasetableSQL,
		systems.FnLeasetable,
		systems.RCAdvisoryToken,
		systems.Leasetable,
		systems.Advisory,
		systems.AdvisoryXact,
		systems.Pglock(systems.PglockConfig{Lease: c.PglockLease, Heartbeat: c.PglockLease / 4}),
		systems.Redislock(systems.RedisConfig{TTL: 30 * time.Second, Retry: c.RedisRetry}),
		systems.EtcdMutex(systems.EtcdConfig{SessionTTL: 30}),
	}
}

// writerSpecs returns the write paths of the fenced-write scenario, the
// baseline first: the raw statements, then pgfence's fence builder.
func writerSpecs() []harness.WriterSpec {
	return append(append(slices.Clone(systems.RawWriters), systems.FenceWriters...), systems.FenceBeforeWriters...)
}

func main() {
	// Scenario 11 runs parts of itself in worker processes of this binary.
	if os.Getenv(herdWorkerEnv) == "herd" {
		os.Exit(herdWorkerMain())
	}
	cfg, err := parseFlags(os.Args[1:])
	if errors.Is(err, flag.ErrHelp) {
		return
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, cfg); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, cfg *config) error {
	started := time.Now()
	if cfg.CPUProfile != "" {
		f, err := os.Create(cfg.CPUProfile)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}
	r := &runner{cfg: cfg, res: &results{Started: started.UTC(), Args: os.Args[1:]}}
	printParams(cfg)

	env := &harness.Env{DatabaseURL: cfg.DatabaseURL, RedisAddr: cfg.RedisAddr, WriteDelay: cfg.WriteDelay}
	if cfg.EtcdURL != "" {
		env.EtcdEndpoints = []string{cfg.EtcdURL}
	}
	if env.DatabaseURL == "" {
		fmt.Println("starting PostgreSQL ...")
		pg, err := services.StartPostgres(ctx)
		if err != nil {
			return fmt.Errorf("start PostgreSQL: %w", err)
		}
		defer pg.Stop()
		env.DatabaseURL = pg.URL
		r.ownCluster = true
	} else if err := migrations.Up(ctx, migrations.Target{URL: env.DatabaseURL}, nil); err != nil {
		return fmt.Errorf("migrate %s: %w", cfg.DatabaseURL, err)
	}
	if cfg.AppRole != "" {
		u, err := services.AppRole(ctx, env.DatabaseURL, cfg.AppRole, r.ownCluster)
		if err != nil {
			return fmt.Errorf("-app-role: %w", err)
		}
		env.AppDatabaseURL = u
	}
	if env.RedisAddr == "" {
		fmt.Println("starting redis-server ...")
		p, err := services.StartRedis(ctx)
		if err != nil {
			r.note("redislock skipped: %v", err)
		} else {
			defer p.Stop()
			env.RedisAddr = p.Addr
		}
	}
	if env.EtcdEndpoints == nil {
		fmt.Println("starting etcd ...")
		p, err := services.StartEtcd(ctx)
		if err != nil {
			r.note("etcd-mutex skipped: %v", err)
		} else {
			defer p.Stop()
			env.EtcdEndpoints = []string{p.Addr}
		}
	}
	r.env = env
	r.res.Machine = gatherMachine(ctx, env.DatabaseURL, env.RedisAddr, env.EtcdEndpoints)

	for _, s := range specs(cfg) {
		if (len(cfg.Systems) > 0 || s.OptIn) && !slices.Contains(cfg.Systems, s.Name) {
			continue
		}
		if (s.Name == "redislock" && env.RedisAddr == "") || (s.Name == "etcd-mutex" && env.EtcdEndpoints == nil) {
			continue
		}
		r.specs = append(r.specs, s)
		r.res.Systems = append(r.res.Systems, systemInfo{Name: s.Name, Kind: string(s.Kind), Note: s.Note})
	}
	for _, w := range writerSpecs() {
		r.res.Writers = append(r.res.Writers, systemInfo{Name: w.Name, Kind: string(w.Kind), Note: w.Note})
	}

	scenarios := map[int]func(context.Context) error{
		1: r.uncontended, 2: r.handover, 3: r.contended, 4: r.fencedWrites, 5: r.scale,
		6: r.renewal, 7: r.advisoryScale, 8: r.securityCost, 9: r.observeCost,
		10: r.advisoryCombine, 11: r.herdScenario, 12: r.clientScale, 13: r.ownershipCost,
		14: r.registryCost,
		15: r.permits,
		16: r.neighbour,
	}
	for _, n := range cfg.Scenarios {
		f, ok := scenarios[n]
		if !ok {
			return fmt.Errorf("no scenario %d", n)
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		t0 := time.Now()
		if err := f(ctx); err != nil {
			return fmt.Errorf("scenario %d: %w", n, err)
		}
		fmt.Printf("scenario %d done in %v\n", n, time.Since(t0).Round(time.Second))
	}
	r.res.Machine.LoadAvgEnd = loadAvg()
	r.res.Elapsed = time.Since(started)

	if err := os.MkdirAll(cfg.Out, 0o755); err != nil {
		return err
	}
	files, err := render(r.res, cfg)
	if err != nil {
		return err
	}
	for name, data := range files {
		if err := os.WriteFile(filepath.Join(cfg.Out, name), data, 0o644); err != nil {
			return err
		}
		fmt.Println("wrote", filepath.Join(cfg.Out, name))
	}
	fmt.Printf("total %v\n", r.res.Elapsed.Round(time.Second))
	return nil
}

func printParams(c *config) {
	fmt.Printf("parameters: quick=%v duration=%v warmup=%v rounds=%d clients=%v scenarios=%v\n", c.Quick, c.Duration, c.Warmup, c.Rounds, c.Clients, c.Scenarios)
	role := "the owner of the install"
	if c.AppRole != "" {
		role = c.AppRole + " (migrations.Grant only)"
	}
	fmt.Printf("  pgfence's lockers connect as %s\n", role)
	if c.WriteDelay > 0 {
		fmt.Printf("  every write to PostgreSQL of the compared systems delayed by %v (-write-delay)\n", c.WriteDelay)
	}
	fmt.Printf("  hand-over: waiters=%d hold-short=%v (at least %d hand-overs) hold-long=%v handovers-long=%d long-duration=%v\n",
		c.HandoverWaiters, c.HoldShort, c.HandoversMin, c.HoldLong, c.HandoversLong, c.LongDuration)
	fmt.Printf("  contended: clients=%d names=%d; writes: clients=%d\n", c.ContendedClients, c.ContendedNames, c.WriteClients)
	fmt.Printf("  scale: clients=%d rows=%v cycles=%d names=%d timeout=%v\n", c.ScaleClients, c.ScaleRows, c.ScaleCycles, c.ScaleNames, c.ScaleTimeout)
	fmt.Printf("  renewal: leases=%d ttl=%v intervals=%d; advisory: locks=%d\n", c.RenewalLeases, c.RenewalTTL, c.RenewalIntervals, c.AdvisoryLocks)
	fmt.Printf("  pglock lease=%v heartbeat=%v; redislock retry=%v\n", c.PglockLease, c.PglockLease/4, c.RedisRetry)
}

// pgbenchBin finds pgbench, or returns "" when it is switched off or absent.
func pgbenchBin(c *config) string {
	switch c.Pgbench {
	case "off":
		return ""
	case "":
		// Next to the server binaries (following symlinks to the real
		// installation), then PATH.
		if d := pgtest.FindBinDir(); d != "" {
			if real, err := filepath.EvalSymlinks(filepath.Join(d, "postgres")); err == nil {
				d = filepath.Dir(real)
			}
			if _, err := os.Stat(filepath.Join(d, "pgbench")); err == nil {
				return filepath.Join(d, "pgbench")
			}
		}
		if p, err := exec.LookPath("pgbench"); err == nil {
			return p
		}
		return ""
	default:
		return c.Pgbench
	}
}
