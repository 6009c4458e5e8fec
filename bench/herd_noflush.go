package main

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgfence/pgfence/bench/internal/report"
)

// Scenario 11 without the WAL flush: the one-waiter hand-over of the raw
// NOTIFY chain and of the lease table once more, with fsync off on the
// benchmark's own cluster, so that a commit's flush costs nothing. The lease
// table's acquire waits for a flush on every hand-over (its grant must be
// durable), and the flush of this machine's disk is a large part of the
// chain: this is what the hand-over comes to on a server whose flush is
// nearly free (NVMe with power-loss protection), the rest being round trips
// and the CPU of the 2 shared cores. Reported, not a target; measured last
// in scenario 11, and fsync is on again (with a CHECKPOINT) before scenario
// 12. Skipped with -database, whose server the benchmark does not own.

// herdNoFlush is the arm's measurement.
type herdNoFlush struct {
	Raw        rawChainResult
	Leasetable herdPoint // Lockers in separate processes, one waiter
}

// setFsync sets fsync on the benchmark's cluster and waits until a new
// session sees it.
func setFsync(ctx context.Context, url string, on bool) error {
	stmt := `ALTER SYSTEM SET fsync = off`
	want := "off"
	if on {
		stmt, want = `ALTER SYSTEM RESET fsync`, "on"
	}
	if err := withConn(ctx, url, func(c *pgx.Conn) error {
		if _, err := c.Exec(ctx, stmt); err != nil {
			return err
		}
		_, err := c.Exec(ctx, `SELECT pg_catalog.pg_reload_conf()`)
		return err
	}); err != nil {
		return err
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		var got string
		if err := withConn(ctx, url, func(c *pgx.Conn) error {
			return c.QueryRow(ctx, `SELECT pg_catalog.current_setting('fsync')`).Scan(&got)
		}); err != nil {
			return err
		}
		if got == want {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("fsync still %s 10s after the reload", got)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// herdNoFlushArm runs the arm; idx numbers its lease table point after
// scenario 11's others.
func (r *runner) herdNoFlushArm(ctx context.Context, dir string, cpu *serverCPU, idx int) (nf *herdNoFlush, err error) {
	url := r.env.DatabaseURL
	if err := setFsync(ctx, url, false); err != nil {
		return nil, fmt.Errorf("fsync off: %w", err)
	}
	defer func() {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
		defer cancel()
		if rerr := setFsync(rctx, url, true); rerr != nil {
			nf, err = nil, fmt.Errorf("fsync back on: %w", rerr)
			return
		}
		if rerr := withConn(rctx, url, func(c *pgx.Conn) error { _, e := c.Exec(rctx, `CHECKPOINT`); return e }); rerr != nil {
			nf, err = nil, fmt.Errorf("checkpoint after fsync on: %w", rerr)
		}
	}()
	c := r.cfg
	nf = &herdNoFlush{Raw: rawNotifyChain(ctx, url, c.HoldShort, c.Warmup, c.Duration)}
	if nf.Raw.Err != "" {
		r.note("11 raw NOTIFY chain, fsync off: %s", nf.Raw.Err)
	}
	nf.Leasetable = r.herdPoint(ctx, dir, cpu, idx, "leasetable", herdProcesses, 1, 1)
	if p := nf.Leasetable; p.FirstErr != "" {
		r.note("11 leasetable, fsync off: %d errors, first: %s", p.Errors, p.FirstErr)
	}
	fmt.Printf("  [11] fsync off: raw NOTIFY chain p50=%s p99=%s; leasetable processes p50=%s p99=%s srvCPU/ho=%s cliCPU/ho=%s load %s\n",
		report.Duration(nf.Raw.Latency.P50), report.Duration(nf.Raw.Latency.P99),
		report.Duration(nf.Leasetable.Latency.P50), report.Duration(nf.Leasetable.Latency.P99),
		herdCPUCell(&nf.Leasetable, nf.Leasetable.ServerCPU, nf.Leasetable.ServerOK),
		herdCPUCell(&nf.Leasetable, nf.Leasetable.ClientCPU, true), loadAvg())
	return nf, nil
}

// ok reports whether both arms measured hand-overs.
func (nf *herdNoFlush) ok() bool {
	return nf != nil && nf.Raw.ok() && nf.Leasetable.Latency.N > 0
}

// markdown renders the arm for herd.md, next to the lease table's
// one-waiter point of the same run with fsync on (on may be nil).
func (nf *herdNoFlush) markdown(hold time.Duration, raw *rawChainResult, on *herdPoint) string {
	t := &report.Table{Header: []string{"hand-over, one waiter, hold " + report.Duration(hold), "fsync", "hand-overs", "p50", "p99",
		"server CPU µs / hand-over", "client CPU µs / hand-over", "p50 ÷ raw chain (same fsync)"}, TextColumns: 2}
	add := func(what, fsync string, n int, p50, p99 time.Duration, srv, cli string, rawP50 time.Duration) {
		t.Rows = append(t.Rows, []string{what, fsync, report.Thousands(int64(n)), report.Duration(p50), report.Duration(p99), srv, cli,
			report.Ratio(float64(p50), float64(rawP50))})
	}
	if raw.ok() {
		add("raw NOTIFY chain", "on", raw.Latency.N, raw.Latency.P50, raw.Latency.P99, "n/a", "n/a", raw.Latency.P50)
		if on != nil && on.Latency.N > 0 {
			add("leasetable, Lockers in separate processes", "on", on.Latency.N, on.Latency.P50, on.Latency.P99,
				herdCPUCell(on, on.ServerCPU, on.ServerOK), herdCPUCell(on, on.ClientCPU, true), raw.Latency.P50)
		}
	}
	lt := &nf.Leasetable
	add("raw NOTIFY chain", "off", nf.Raw.Latency.N, nf.Raw.Latency.P50, nf.Raw.Latency.P99, "n/a", "n/a", nf.Raw.Latency.P50)
	add("leasetable, Lockers in separate processes", "off", lt.Latency.N, lt.Latency.P50, lt.Latency.P99,
		herdCPUCell(lt, lt.ServerCPU, lt.ServerOK), herdCPUCell(lt, lt.ClientCPU, true), nf.Raw.Latency.P50)
	return "## The one-waiter hand-over without the WAL flush\n\n" +
		"Last in this scenario, with fsync off on the benchmark's own cluster (a commit's flush then costs nothing), the raw NOTIFY chain and the lease table's one-waiter point ran once more, timed as above; fsync was on again, with a CHECKPOINT, before the next scenario. " +
		"The lease table's grant waits for a WAL flush on every hand-over, and this machine's disk makes that flush a large part of the chain: the rows with fsync off show what the hand-over comes to where the flush is nearly free (NVMe with power-loss protection); what remains is the round trips and the CPU of the cores that the workers and PostgreSQL share here. Reported, not a target.\n\n" +
		t.Markdown() + "\n"
}
