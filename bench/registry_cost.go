package main

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgfence/pgfence/bench/internal/report"
)

// registryArm is one statement mix of scenario 14, run in a transaction
// per cycle.
type registryArm struct {
	Name  string
	Stmts []string
}

// registryArms are scenario 14's arms: the plain single-row UPDATE the
// check is compared with first.
var registryArms = []registryArm{
	{"plain single-row UPDATE", []string{`UPDATE bench_registry_rows SET n = n + 1 WHERE id = 1`}},
	{"pgfence_fence_check", []string{`SELECT pgfence.pgfence_fence_check('bench-registry', 1)`}},
	{"pgfence_fence_check + UPDATE", []string{`SELECT pgfence.pgfence_fence_check('bench-registry', 1)`,
		`UPDATE bench_registry_rows SET n = n + 1 WHERE id = 1`}},
}

// registryCostResult is what scenario 14 measured: per mode ("rolled
// back", "committed") and arm, the time per cycle of each batch.
type registryCostResult struct {
	Batches, Cycles int
	Modes           []string
	Times           map[string][][]time.Duration // mode -> arm -> per batch
}

const registrySetupSQL = `
CREATE TABLE IF NOT EXISTS bench_registry_rows (id int PRIMARY KEY, n bigint NOT NULL) WITH (fillfactor = 75);
INSERT INTO bench_registry_rows VALUES (1, 0) ON CONFLICT (id) DO NOTHING`

// registryCost is scenario 14: the fence registry's check beside a plain
// single-row UPDATE (and the two together), one connection per arm, each
// cycle a transaction of its own, rolled back (the server's work) or
// committed (with the WAL flush), the arms alternating batch by batch.
func (r *runner) registryCost(ctx context.Context) error {
	b, n := r.cfg.CallBatches, r.cfg.CallCycles
	fmt.Printf("scenario 14: fence registry check vs a single-row UPDATE, %d alternating batches of %d transactions per arm and mode\n", b, n)
	res := &registryCostResult{Batches: b, Cycles: n, Modes: []string{"rolled back", "committed"}, Times: map[string][][]time.Duration{}}
	conns := make([]*pgx.Conn, len(registryArms))
	defer func() {
		for _, c := range conns {
			if c != nil {
				_ = c.Close(context.WithoutCancel(ctx))
			}
		}
	}()
	for i := range conns {
		c, err := pgx.Connect(ctx, r.env.DatabaseURL)
		if err != nil {
			return err
		}
		conns[i] = c
	}
	if _, err := conns[0].Exec(ctx, registrySetupSQL); err != nil {
		return err
	}
	batch := func(c *pgx.Conn, arm registryArm, commit bool) (time.Duration, error) {
		start := time.Now()
		for range n {
			tx, err := c.Begin(ctx)
			if err != nil {
				return 0, err
			}
			for _, s := range arm.Stmts {
				if _, err := tx.Exec(ctx, s); err != nil {
					_ = tx.Rollback(ctx)
					return 0, err
				}
			}
			if commit {
				err = tx.Commit(ctx)
			} else {
				err = tx.Rollback(ctx)
			}
			if err != nil {
				return 0, err
			}
		}
		return time.Since(start) / time.Duration(n), nil
	}
	for _, mode := range res.Modes {
		commit := mode == "committed"
		times := make([][]time.Duration, len(registryArms))
		for i, arm := range registryArms { // one unrecorded batch each: plans cached
			if _, err := batch(conns[i], arm, commit); err != nil {
				return fmt.Errorf("%s: %w", arm.Name, err)
			}
		}
		for k := range b {
			for j := range registryArms {
				i := (j + k) % len(registryArms) // rotate which arm goes first
				d, err := batch(conns[i], registryArms[i], commit)
				if err != nil {
					return fmt.Errorf("%s: %w", registryArms[i].Name, err)
				}
				times[i] = append(times[i], d)
			}
		}
		res.Times[mode] = times
		for i, arm := range registryArms {
			fmt.Printf("  [14] %-11s %-30s %v/transaction\n", mode, arm.Name, median(times[i]).Round(100*time.Nanosecond))
		}
	}
	r.res.Registry = res
	return nil
}

// renderRegistryCost writes scenario 14.
func renderRegistryCost(p func(string, ...any), res *results) {
	rc := res.Registry
	if rc == nil {
		return
	}
	p("## 14. Fence registry check beside a single-row UPDATE\n\n")
	p("`pgfence_fence_check(resource, token)` (the check `fence.CheckResource` and `fencehttp` run) against a plain `UPDATE` of one row by primary key, and the two in one transaction, as a fenced service request runs them. One connection per arm, the owner's role, %d batches of %d transactions per arm, the arms rotating which goes first; each transaction is `BEGIN`, the statements, then `ROLLBACK` (the server's work, no WAL flush) or `COMMIT` (with the flush). Medians over batches of the time per transaction, round trips included.\n\n", rc.Batches, rc.Cycles)
	t := &report.Table{Header: []string{"transaction ends with", "statements", "per transaction (median)", "vs plain UPDATE"}, TextColumns: 2}
	for _, mode := range rc.Modes {
		times := rc.Times[mode]
		base := median(times[0])
		for i, arm := range registryArms {
			d := median(times[i])
			t.Rows = append(t.Rows, []string{mode, arm.Name, report.Duration(d), fmt.Sprintf("%.2fx", float64(d)/float64(base))})
		}
	}
	p("%s\n", t.Markdown())
}
