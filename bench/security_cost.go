package main

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/pgfence/pgfence/bench/internal/report"
	"github.com/pgfence/pgfence/bench/internal/systems"
)

// callCost is what scenario 8 measured for one systems.CallPair: the time
// per cycle of each batch, the two paths alternating batch by batch.
type callCost struct {
	systems.CallPair
	Cycles             int             // cycles per batch
	OldTimes, NewTimes []time.Duration // per batch: time per cycle
}

// median returns the median of ds.
func median(ds []time.Duration) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	if len(s) == 0 {
		return 0
	}
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// pairedRatio is the median over batches of New/Old of the same batch.
func (c *callCost) pairedRatio() float64 {
	rs := make([]float64, 0, len(c.OldTimes))
	for i := range min(len(c.OldTimes), len(c.NewTimes)) {
		rs = append(rs, float64(c.NewTimes[i])/float64(c.OldTimes[i]))
	}
	slices.Sort(rs)
	if len(rs) == 0 {
		return 0
	}
	if len(rs)%2 == 1 {
		return rs[len(rs)/2]
	}
	return (rs[len(rs)/2-1] + rs[len(rs)/2]) / 2
}

// securityCost is scenario 8: the per-call cost of the least-privilege
// install against the release candidate's statements, one client, inside
// rolled-back transactions (no WAL flush waited for, so the disk's noise
// is out and the server work the change adds is what differs), the two
// paths alternating batch by batch.
func (r *runner) securityCost(ctx context.Context) error {
	b, n := r.cfg.CallBatches, r.cfg.CallCycles
	fmt.Printf("scenario 8: security cost per call, %d alternating batches of %d cycles per path, one connection each, rolled back\n", b, n)
	ns := names("s8-", n)
	for _, pair := range systems.CallPairs {
		oldPath, err := systems.OpenCallPath(ctx, r.env, pair.Old)
		if err != nil {
			return fmt.Errorf("%s: %w", pair.Old, err)
		}
		newPath, err := systems.OpenCallPath(ctx, r.env, pair.New)
		if err != nil {
			oldPath.Close(ctx)
			return fmt.Errorf("%s: %w", pair.New, err)
		}
		res := callCost{CallPair: pair, Cycles: n}
		err = func() error {
			// One unrecorded batch each: plans cached, connections warm.
			for _, p := range []*systems.CallPath{oldPath, newPath} {
				if _, err := p.Time(ctx, ns); err != nil {
					return err
				}
			}
			for i := range b {
				first, second := oldPath, newPath
				if i%2 == 1 {
					first, second = newPath, oldPath
				}
				d1, err := first.Time(ctx, ns)
				if err != nil {
					return err
				}
				d2, err := second.Time(ctx, ns)
				if err != nil {
					return err
				}
				if i%2 == 1 {
					d1, d2 = d2, d1
				}
				res.OldTimes = append(res.OldTimes, d1/time.Duration(n))
				res.NewTimes = append(res.NewTimes, d2/time.Duration(n))
			}
			return nil
		}()
		oldPath.Close(ctx)
		newPath.Close(ctx)
		if err != nil {
			return fmt.Errorf("%s: %w", pair.What, err)
		}
		fmt.Printf("  [8] %-34s %s %v/cycle, %s %v/cycle: new/old %.2f (paired median %.2f)\n", pair.What,
			pair.Old, median(res.OldTimes).Round(100*time.Nanosecond), pair.New, median(res.NewTimes).Round(100*time.Nanosecond),
			float64(median(res.NewTimes))/float64(median(res.OldTimes)), res.pairedRatio())
		r.res.CallCosts = append(r.res.CallCosts, res)
	}
	return nil
}

// renderSecurityCost writes scenario 8, and the throughput of the probe
// pairs when scenario 1 measured them.
func renderSecurityCost(p func(string, ...any), res *results, cfg *config) {
	var tput [][]string
	for _, pair := range systems.CallPairs {
		for _, c := range uniqueClients(res.Uncontended) {
			o, n := cycleTP(res.Uncontended, pair.Old, c), cycleTP(res.Uncontended, pair.New, c)
			if o > 0 && n > 0 {
				tput = append(tput, []string{pair.What, strconv.Itoa(c), report.Rate(o), report.Rate(n), report.Ratio(n, o)})
			}
		}
	}
	if len(res.CallCosts) == 0 && len(tput) == 0 {
		return
	}
	p("## 8. Security cost: the least-privilege install against the release candidate\n\n")
	role := "as the owner (no -app-role)"
	if cfg.AppRole != "" {
		role = "as `" + cfg.AppRole + "`, which holds only migrations.Grant's privileges"
	}
	p("The schema puts every write to the lease table in SECURITY DEFINER functions with a pinned search_path, and the token function checks its sequence. The release candidate's paths (`rc-…`) send its own statements as the table's owner, with its unhardened `pgfence_next_token()`; the new paths (`fn-leasetable`, `raw-advisory-token`) call the installed functions %s. Each pair runs the same cycle from the same client code.\n\n", role)
	if len(res.CallCosts) > 0 {
		c0 := res.CallCosts[0]
		p("Per call: one connection per path, %d batches of %d cycles each, the two paths alternating batch by batch, each batch in a transaction that is rolled back, so no commit waits for the disk and what differs is the server work (and nothing else is committed). The time per cycle includes both statements' round trips.\n\n", len(c0.OldTimes), c0.Cycles)
		t := &report.Table{Header: []string{"cycle", "release candidate", "per cycle (median)", "least privilege", "per cycle (median)", "added per cycle", "new/old", "new/old, paired batches (median)"}, TextColumns: 1}
		for _, c := range res.CallCosts {
			o, n := median(c.OldTimes), median(c.NewTimes)
			t.Rows = append(t.Rows, []string{c.What, c.Old, report.Duration(o), c.New, report.Duration(n), report.Duration(n - o),
				fmt.Sprintf("%.2fx", float64(n)/float64(o)), fmt.Sprintf("%.2fx", c.pairedRatio())})
		}
		p("%s\n", t.Markdown())
	}
	if len(tput) > 0 {
		p("Throughput of the same cycles committed (scenario 1, each statement in autocommit, medians over rounds):\n\n")
		t := &report.Table{Header: []string{"cycle", "clients", "release candidate (cycles/s)", "least privilege (cycles/s)", "new/old"}, TextColumns: 1}
		t.Rows = tput
		p("%s\n", t.Markdown())
	}
}
