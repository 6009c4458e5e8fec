package main

import (
	"fmt"
	"strings"
	"time"

	"github.com/pgfence/pgfence/advisory"
	"github.com/pgfence/pgfence/bench/internal/report"
)

// waitOf returns the wait-event sample of system, from scenario 1 or 4.
func waitOf(ws []waitSample, system string) *waitSample {
	for i := range ws {
		if ws[i].System == system {
			return &ws[i]
		}
	}
	return nil
}

// share returns the share of active observations whose wait event starts
// with prefix, formatted, or "n/a".
func share(w *waitSample, prefix string) string {
	if w == nil || w.Active == 0 {
		return "n/a"
	}
	n := 0
	for k, v := range w.Events {
		if strings.HasPrefix(k, prefix) {
			n += v
		}
	}
	return pct(n, w.Active)
}

// stmtMean returns the mean server execution time of the first statement
// of w containing substr.
func stmtMean(w *waitSample, substr string) string {
	if w == nil {
		return "n/a"
	}
	for _, s := range w.Statements {
		if strings.Contains(s.Query, substr) {
			return fmt.Sprintf("%.3f ms", s.MeanMs)
		}
	}
	return "n/a"
}

// planLine returns the first line of w's plan starting with prefix.
func planLine(w *waitSample, prefix string) string {
	if w == nil {
		return "n/a"
	}
	for _, l := range strings.Split(w.Plan, "\n") {
		if l = strings.TrimSpace(l); strings.HasPrefix(l, prefix) {
			return strings.TrimSpace(strings.TrimPrefix(l, prefix))
		}
	}
	return "n/a"
}

func missed(ts []target, prefix string) bool {
	for _, t := range ts {
		if strings.HasPrefix(t.What, prefix) && t.Met == verdict(false) {
			return true
		}
	}
	return false
}

// renderMisses explains, with this run's figures, why each missed target
// was missed. The mechanisms named were identified from the profiles in
// this report (wait events, pg_stat_statements, EXPLAIN) and from
// PostgreSQL's source; the figures are recomputed on every run.
func renderMisses(p func(string, ...any), res *results, cfg *config) {
	ts := targets(res, cfg)
	var b strings.Builder
	q := func(format string, args ...any) { fmt.Fprintf(&b, format, args...) }
	c := 16
	rate := func(sys string) string { return report.Rate(cycleTP(res.Uncontended, sys, c)) }
	ratio := func(a, b string) string {
		return report.Ratio(cycleTP(res.Uncontended, a, c), cycleTP(res.Uncontended, b, c))
	}

	if missed(ts, "leasetable acquire+release") || missed(ts, "leasetable vs pglock") {
		lw, nw, rw := waitOf(res.WaitEvents, "pgfence-leasetable"), waitOf(res.WaitEvents, "raw-2update-notify"), waitOf(res.WaitEvents, "raw-2update")
		q("### leasetable throughput\n\n")
		q("At %d clients pgfence-leasetable ran %s cycles/s against %s for raw-2update (%s), but %s for raw-2update-notify, the same two raw UPDATEs with a pg_notify in the release (leasetable / notify ceiling = %s). ",
			c, rate("pgfence-leasetable"), rate("raw-2update"), ratio("pgfence-leasetable", "raw-2update"), rate("raw-2update-notify"), ratio("pgfence-leasetable", "raw-2update-notify"))
		q("While leasetable ran, %s of the active backend observations waited on `Lock:object` (raw-2update-notify: %s; raw-2update: %s, whose backends wait on the WAL instead: `LWLock:WALWrite` %s). ",
			share(lw, "Lock:object"), share(nw, "Lock:object"), share(rw, "Lock:object"), share(rw, "LWLock:WALWrite"))
		q("The statements themselves are cheap on the server (pg_stat_statements mean: acquire %s, release %s; the raw UPDATEs %s).\n\n",
			stmtMean(lw, "pgfence_acquire("), stmtMean(lw, "pgfence_release("), stmtMean(rw, "UPDATE bench_ceiling_leases"))
		q("The remaining gap to the notify ceiling moves from run to run on a loaded machine; what the library adds over two raw UPDATEs is the token draw (a durable commit, by design) and the SECURITY DEFINER function each statement runs in (pgfence_acquire, pgfence_release: the application role writes the table only through them). The benchmark's own CPU is not the limit: profile a point with `-cpuprofile` to check on another machine.\n\n")
		q("How the design meets it: a release calls pg_notify in the releasing transaction, and at commit PostgreSQL's PreCommit_Notify holds a database-wide lock (the `Lock:object` wait) until the commit completes, so notifying commits run one after another. leasetable therefore (1) commits a release that frees its leases with `synchronous_commit = off` for that transaction only, so the lock is not held across a WAL flush (after a crash such a release may be undone and the lease stays held until its TTL: progress, not safety), and (2) combines the concurrent acquires, and the concurrent releases, of one Locker into one statement each (group commit), so many cycles share one round trip and one flush. A failed TryAcquire on a held lease writes nothing (no token, no WAL).\n\n")
		q("If the ratio here is still low, compare raw-2update-notify with raw-2update in this run: a gap there is PostgreSQL's NOTIFY cost on this machine, which any design that wakes waiters through NOTIFY pays.\n\n")
	}

	if missed(ts, "advisory (session") || missed(ts, "advisory-xact") {
		aw, tw := waitOf(res.WaitEvents, "pgfence-advisory"), waitOf(res.WaitEvents, "raw-advisory-token")
		q("### advisory throughput: the durable token draw\n\n")
		q("At %d clients: raw-advisory %s cycles/s, raw-advisory-token (the same statements plus `pgfence_next_token()` on a grant) %s (%s of raw), pgfence-advisory %s (%s of raw, %s of raw-advisory-token); raw-advisory-xact %s, pgfence-advisory-xact %s (%s). ",
			c, rate("raw-advisory"), rate("raw-advisory-token"), ratio("raw-advisory-token", "raw-advisory"), rate("pgfence-advisory"),
			ratio("pgfence-advisory", "raw-advisory"), ratio("pgfence-advisory", "raw-advisory-token"),
			rate("raw-advisory-xact"), rate("pgfence-advisory-xact"), ratio("pgfence-advisory-xact", "raw-advisory-xact"))
		q("Backends of pgfence-advisory waited on the WAL (`LWLock:WALWrite` + `IO:WALSync`) in %s + %s of observations (raw-advisory-token: %s + %s); raw advisory lock/unlock writes no WAL at all. The lock statement's mean server time is %s with the token (pg_stat_statements) against about 0.001 ms without.\n\n",
			share(aw, "LWLock:WALWrite"), share(aw, "IO:WALSync"), share(tw, "LWLock:WALWrite"), share(tw, "IO:WALSync"), stmtMean(aw, "pg_try_advisory_lock"))
		q("Cause: by design every grant draws its token with `pgfence_next_token()` (or, for the grants of one combined statement, one `pgfence_next_tokens` call: migration 000009, which from migration 000010 hands out a block of consecutive tokens per sequence value), which forces `synchronous_commit = on` and, when the WAL that covers the token is not flushed yet (nextval logs one record per 32 values: once per 32 single draws or combined statements, and whenever other sessions wrote WAL since), writes a record so that the statement's commit waits for the flush (no token is reissued after a crash). The ceiling for *an advisory lock with a durable fencing token* is raw-advisory-token, and the library is at %s of it; the rest of the gap to raw-advisory is the draw and its flushes. The target (≥ 0.7x of a lock that writes nothing) compares against a ceiling that has no fencing token; a cheaper draw is not available without giving up a guarantee: handing out tokens from a range reserved per session would let a later holder on another session receive a smaller token than an earlier holder of the same key, and a token that is not flushed before the caller sees it can be reissued after a crash (the fault suite's plain-nextval negative control shows exactly that). So the target is measured against a lock with no fencing token; the honest ceiling for this design is raw-advisory-token.\n\n",
			ratio("pgfence-advisory", "raw-advisory-token"))
	}

	// The long-hold figures have no target, but a slow one is explained too.
	slowLong := func(sys string) bool {
		h := handoverOf(res, sys, cfg.HoldLong)
		return h != nil && h.Latency.P50 >= 3*time.Millisecond
	}
	var slow []struct {
		sys  string
		hold time.Duration
	}
	for _, sys := range []string{"pgfence-leasetable", "pgfence-advisory", "pgfence-advisory-xact"} {
		if missed(ts, sys+" hand-over") {
			slow = append(slow, struct {
				sys  string
				hold time.Duration
			}{sys, cfg.HoldShort})
		} else if slowLong(sys) {
			slow = append(slow, struct {
				sys  string
				hold time.Duration
			}{sys, cfg.HoldLong})
		}
	}
	if len(slow) > 0 {
		q("### hand-over\n\n")
		for _, sl := range slow {
			sys := sl.sys
			h := handoverOf(res, sys, sl.hold)
			q("- %s, hold %v: p50 %s, p99 %s, max %s over %d hand-overs. ", sys, sl.hold, report.Duration(h.Latency.P50), report.Duration(h.Latency.P99), report.Duration(h.Latency.Max), h.Latency.N)
			switch sys {
			case "pgfence-leasetable":
				q("Each waiter has its own Locker and wakes on the NOTIFY, delivered after the release's commit to every Locker's LISTEN connection; then all %d waiters run the acquire statement at once and one wins (inside one Locker only the head of its line would wake: scenario 11). The losing attempts see the row held in their snapshot and write nothing (no token, no WAL), so a hand-over costs the release's commit, the notification's delivery and the winner's durable acquire (one WAL flush for its token). The tail comes from the %d Lockers' simultaneous wake-up and statements on 2 shared cores.\n", cfg.HandoverWaiters, cfg.HandoverWaiters)
			case "pgfence-advisory":
				q("Each waiter has its own Locker (as separate processes would) and parks on an idle session of it, blocked in pg_advisory_lock: the server queues the %d parked sessions and, at the holder's unlock, grants the lock to the first, whose statement then draws the token (its commit waits for a WAL flush). A hand-over thus costs the unlock's round trip and the winner's durable grant, with no notification and no refused attempts; the releasing worker, queueing again, parks behind the others. The tail is the flush and the scheduling of the workers and backends on 2 shared cores.\n", cfg.HandoverWaiters)
			case "pgfence-advisory-xact":
				q("AcquireTx blocks in pg_advisory_xact_lock, so the server wakes the next waiter as soon as the holder's COMMIT releases the lock; what remains is the new holder's token draw, whose commit waits for a WAL flush on a loaded 2-core machine.\n")
			}
		}
		q("\n")
	}

	if missed(ts, "fence.Update vs") || missed(ts, "fence.Update.UnderLease") {
		fw, pw, gw, uw := waitOf(res.WriteWaits, "fence.Update"), waitOf(res.WriteWaits, "plain UPDATE"), waitOf(res.WriteWaits, "guarded UPDATE"), waitOf(res.WriteWaits, "fence.Update.UnderLease")
		q("### fenced writes: the guarded write first, the full statement on failure only\n\n")
		plain := writeTP(res.Writes, "plain UPDATE")
		q("%d clients: plain UPDATE %s writes/s, raw guarded UPDATE (the predicate only) %s (%s), fence.Update %s (%s; its full statement alone, as Exec sent before issue 16: %s), fence.Update.UnderLease %s (%s; full statement alone: %s), raw lease-checked UPDATE %s (%s). ",
			cfg.WriteClients, report.Rate(plain), report.Rate(writeTP(res.Writes, "guarded UPDATE")), report.Ratio(writeTP(res.Writes, "guarded UPDATE"), plain),
			report.Rate(writeTP(res.Writes, "fence.Update")), report.Ratio(writeTP(res.Writes, "fence.Update"), plain),
			report.Ratio(writeTP(res.Writes, "fence.Update full statement (before)"), plain),
			report.Rate(writeTP(res.Writes, "fence.Update.UnderLease")), report.Ratio(writeTP(res.Writes, "fence.Update.UnderLease"), plain),
			report.Ratio(writeTP(res.Writes, "fence.Update.UnderLease full statement (before)"), plain),
			report.Rate(writeTP(res.Writes, "lease-checked UPDATE")), report.Ratio(writeTP(res.Writes, "lease-checked UPDATE"), plain))
		q("EXPLAIN ANALYZE of one write: plain UPDATE WAL %s, execution %s; guarded UPDATE WAL %s, %s; lease-checked UPDATE WAL %s, %s. Backend observations waiting on the WAL (`LWLock:WALWrite`): plain %s, fence.Update %s, fence.Update.UnderLease %s.\n\n",
			planLine(pw, "WAL:"), planLine(pw, "Execution Time:"), planLine(gw, "WAL:"), planLine(gw, "Execution Time:"),
			planLine(waitOf(res.WriteWaits, "lease-checked UPDATE"), "WAL:"), planLine(waitOf(res.WriteWaits, "lease-checked UPDATE"), "Execution Time:"),
			share(pw, "LWLock:WALWrite"), share(fw, "LWLock:WALWrite"), share(uw, "LWLock:WALWrite"))
		q("Cause: on success, Exec sends one statement: the guarded UPDATE with the guard predicate, a one-time check that the snapshot shows at most one matching row (`NOT EXISTS (... OFFSET 1)`) and the setting of pgfence.token; only when it writes nothing (stale, missing, several rows, a lease not held) does Exec send the full statement that tells the outcomes apart. A success therefore writes what the hand-written guarded UPDATE writes; what it adds is server CPU for the single-row check and set_config (BenchmarkServerCPU in fence/ measures it per write from the backend's schedstat: about +10 to +15 µs over a plain UPDATE's 26 to 30 µs on this machine). With UnderLease, the lease check is a call of the SECURITY DEFINER function pgfence_lease_held, which takes FOR SHARE on the lease row (required: no takeover may commit between check and write; one heap-lock WAL record) and switches search_path for the call: BenchmarkServerCPU measured about +22 µs for the FOR SHARE itself (the raw lease-checked UPDATE, run as the table's owner) and about +13 µs more for the function call, which lets the writer check a lease without any privilege on pgfence_leases. So the raw lease-checked UPDATE is the ceiling for a lease-checked write here, and the function call is the price of least privilege.\n\n")
	}

	scaleP99 := func() float64 {
		if len(cfg.ScaleRows) < 2 {
			return 0
		}
		a, b := scaleOf(res, "pgfence-leasetable", cfg.ScaleRows[len(cfg.ScaleRows)-1]), scaleOf(res, "pgfence-leasetable", cfg.ScaleRows[0])
		if a == nil || b == nil || b.Acquire.P99 <= 0 {
			return 0
		}
		return float64(a.Acquire.P99) / float64(b.Acquire.P99)
	}
	if (missed(ts, "leasetable acquire p50 with") || scaleP99() > 1.2) && len(cfg.ScaleRows) >= 2 {
		lo, hi := cfg.ScaleRows[0], cfg.ScaleRows[len(cfg.ScaleRows)-1]
		q("### scale\n\n")
		for _, sys := range []string{"pgfence-leasetable", "raw-2update"} {
			a, b := scaleOf(res, sys, hi), scaleOf(res, sys, lo)
			if a == nil || b == nil {
				continue
			}
			q("- %s: acquire p50 %s with %s live rows vs %s with %s (%s), p99 %s vs %s.\n", sys, report.Duration(a.Acquire.P50), report.Thousands(int64(hi)),
				report.Duration(b.Acquire.P50), report.Thousands(int64(lo)), report.Ratio(float64(a.Acquire.P50), float64(b.Acquire.P50)),
				report.Duration(a.Acquire.P99), report.Duration(b.Acquire.P99))
		}
		q("\nThe target is on the p50; the p99 is shown because it moved more. The acquire is a primary-key lookup whose cost grows with the B-tree's depth (one more level between 1,000 and 1,000,000 rows), so a large ratio here comes from the points running back to back on a loaded machine after a %s-row fill (checkpoint and autovacuum of the fill run during the second point); compare with raw-2update, which does the same lookup, and re-run on an idle machine.\n\n", report.Thousands(int64(hi)))
	}

	for i := range res.Contended {
		pt := &res.Contended[i]
		a := pt.agg()
		if pt.System != "pgfence-advisory" || a.Throughput <= 0 || a.BusyRate < 50*a.Throughput {
			continue
		}
		q("### contended advisory (no target): busy answers from the Locker itself\n\n")
		q("In scenario 3 pgfence-advisory completed %s cycles/s while answering %s busy TryAcquires per second (raw-advisory: %s cycles/s, %s busy/s). A key held by another caller of the same Locker is refused in-process, without a round trip, so the %d benchmark clients, which retry the next name at once, spin on the Locker: the holders wait to be scheduled for their Release round trip on 2 cores while the spinners take the CPU. The refusal itself costs about 50 ns and one allocation (BenchmarkTryLockHeldInThisLocker); real callers back off between attempts. The raw ceiling's refusals cost a round trip each, which paces its clients.\n\n",
			report.Rate(a.Throughput), report.Rate(a.BusyRate), report.Rate(cycleTP(res.Contended, "raw-advisory", cfg.ContendedClients)),
			func() string {
				for j := range res.Contended {
					if res.Contended[j].System == "raw-advisory" {
						return report.Rate(res.Contended[j].agg().BusyRate)
					}
				}
				return "n/a"
			}(), cfg.ContendedClients)
	}

	if len(res.AdvisoryConns) > 0 && missed(ts, "server connections holding") {
		q("### advisory connections\n\n")
		for _, a := range res.AdvisoryConns {
			q("- %s: %d lock sessions held %s locks (locked in %s by %d goroutines).\n", a.Config, a.Sessions, report.Thousands(int64(a.Locks)), report.Duration(a.LockTime), a.Goroutines)
		}
		q("\nCause: a Locker opens a new session when every open session has 32 acquisitions in flight, up to Config.MaxSessions (default %d), so a burst of more concurrent acquisitions than that leaves it with more sessions, however few locks it holds. The count does not grow with the number of locks (10,000 locks fit on one session, as the MaxSessions 1 row shows), so the target holds with MaxSessions: 2. The default stays 4: sessions run their statements in parallel, so a statement that stalls (a slow WAL flush, a session being re-dialed) holds up the callers of one session, not all; throughput hardly depends on it, since the requests queued on a busy session are combined into its next statement (`go test -run '^$' -bench MaxSessions ./advisory/` measures 1, 2, 4 and 8 sessions side by side, and scenario 10 above the default against one session per client). The advisory docs state that a Locker uses up to MaxSessions connections.\n\n", advisory.DefaultMaxSessions)
	}

	combineMiss(q, res.Combine, ts)
	herdMiss(q, res.Herd, res.HerdRaw, res.HerdNoFlush, ts, cfg.HoldShort, res.Machine.Cores)

	if b.Len() == 0 {
		return
	}
	p("## Why targets were missed\n\n%s", b.String())
}
