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
		q("### leasetable throughput: the release's NOTIFY serialises commits\n\n")
		q("At %d clients pgfence-leasetable ran %s cycles/s against %s for raw-2update (%s), but %s for raw-2update-notify, the same two raw UPDATEs with a pg_notify in the release (leasetable / notify ceiling = %s). ",
			c, rate("pgfence-leasetable"), rate("raw-2update"), ratio("pgfence-leasetable", "raw-2update"), rate("raw-2update-notify"), ratio("pgfence-leasetable", "raw-2update-notify"))
		q("While leasetable ran, %s of the active backend observations waited on `Lock:object` (raw-2update-notify: %s; raw-2update: %s, whose backends wait on the WAL instead: `LWLock:WALWrite` %s). ",
			share(lw, "Lock:object"), share(nw, "Lock:object"), share(rw, "Lock:object"), share(rw, "LWLock:WALWrite"))
		q("The statements themselves are cheap on the server (pg_stat_statements mean: acquire %s, release %s; the raw UPDATEs %s).\n\n",
			stmtMean(lw, "INSERT INTO pgfence_leases"), stmtMean(lw, "WITH released"), stmtMean(rw, "UPDATE bench_ceiling_leases"))
		q("The rest of the gap, between leasetable and the notify ceiling, moves from run to run on this loaded machine (the two are bound by the same serialised flushes); its candidates are the acquire's INSERT ... ON CONFLICT DO UPDATE, which locks the conflicting row before updating it (an extra heap-lock WAL record, as in the fence builder below), and the token draw in a PL/pgSQL function. The benchmark's own CPU is not the limit: profile a point with `-cpuprofile` to check on another machine.\n\n")
		q("Cause: leasetable's release (`releaseSQL`) calls pg_notify in the releasing transaction. At commit, PostgreSQL's PreCommit_Notify takes a heavyweight lock on the database object (`LockSharedObject(DatabaseRelationId, InvalidOid, 0, AccessExclusiveLock)`, the `Lock:object` wait) and holds it until the transaction has committed, *including its WAL flush*. So all notifying commits of the database run one after another, each paying a full fsync: group commit, which lets raw-2update's 16 clients share flushes, is impossible, and the release rate is bounded by 1 / (fsync time) whatever the number of clients. The acquire (one flush, no notify) is not the bottleneck.\n\n")
		q("What would fix it (for whoever owns leasetable's release path; not changed here): (1) notify only when someone waits: e.g. the release statement notifies only if a waiter registered interest (a waiter row or counter in the table, set by Acquire before it sleeps), so uncontended cycles never take the lock; (2) or send the notification in a separate transaction with `synchronous_commit = off` (the lock is then held for a commit that does not wait for the disk), at the price of one more round trip on contended names only if combined with (1); (3) batching concurrent releases of one Locker into one statement divides the serialised flushes by the batch size but keeps them serialised. Any of these must keep the guarantee that a waiter is woken after the release is visible (NOTIFY is delivered at commit; a post-commit notify is too).\n\n")
	}

	if missed(ts, "advisory (session") || missed(ts, "advisory-xact") {
		aw, tw := waitOf(res.WaitEvents, "pgfence-advisory"), waitOf(res.WaitEvents, "raw-advisory-token")
		q("### advisory throughput: the durable token costs a WAL flush per grant\n\n")
		q("At %d clients: raw-advisory %s cycles/s, raw-advisory-token (the same statements plus `pgfence_next_token()` on a grant) %s (%s of raw), pgfence-advisory %s (%s of raw, %s of raw-advisory-token); raw-advisory-xact %s, pgfence-advisory-xact %s (%s). ",
			c, rate("raw-advisory"), rate("raw-advisory-token"), ratio("raw-advisory-token", "raw-advisory"), rate("pgfence-advisory"),
			ratio("pgfence-advisory", "raw-advisory"), ratio("pgfence-advisory", "raw-advisory-token"),
			rate("raw-advisory-xact"), rate("pgfence-advisory-xact"), ratio("pgfence-advisory-xact", "raw-advisory-xact"))
		q("Backends of pgfence-advisory waited on the WAL (`LWLock:WALWrite` + `IO:WALSync`) in %s + %s of observations (raw-advisory-token: %s + %s); raw advisory lock/unlock writes no WAL at all. The lock statement's mean server time is %s with the token (pg_stat_statements) against about 0.001 ms without.\n\n",
			share(aw, "LWLock:WALWrite"), share(aw, "IO:WALSync"), share(tw, "LWLock:WALWrite"), share(tw, "IO:WALSync"), stmtMean(aw, "pg_try_advisory_lock"))
		q("Cause: by design every grant draws its token with `pgfence_next_token()`, which assigns a transaction id and forces `synchronous_commit = on`, so the statement's commit waits for a WAL flush (no token is reissued after a crash). The ceiling for *an advisory lock with a durable fencing token* is raw-advisory-token, and the library is at %s of it; the rest of the gap to raw-advisory is the flush. The target (≥ 0.7x of a lock that writes nothing) compares against a ceiling that has no fencing token; it can only be met by making the draw cheaper, e.g. drawing tokens in batches per session (one flushed nextval per N grants, handing out a durable reserved range: SEQUENCE ... CACHE-like, `setval` ahead and hand out locally) — a design change for the owner of advisory/ and migration 000001.\n\n",
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
				q("Each waiter has its own Locker and wakes on the NOTIFY, delivered after the release's commit (one WAL flush); then all %d waiters run the acquire statement at once and one wins. Every attempt, the losing ones too, evaluates `pgfence_next_token()` in the INSERT's VALUES before the conflict is detected, so each assigns a transaction id and its commit waits for a WAL flush: a hand-over costs the release's flush, the notification's delivery, and a burst of %d flushing acquires of which one matters. Drawing the token only on the paths that take the row (not in VALUES when the row exists and is held), or waking one waiter instead of all, would cut that.\n", cfg.HandoverWaiters, cfg.HandoverWaiters)
			case "pgfence-advisory":
				q("Each waiter has its own Locker (as separate processes would), and Locker.Lock waits by polling pg_try_advisory_lock with a pause that starts at 5 ms and doubles up to MaxPollInterval (200 ms): a release by another Locker is only seen at the waiter's next poll, so the hand-over takes up to the current pause (it is immediate only within one Locker). Fix: wake cross-Locker waiters through LISTEN/NOTIFY as leasetable does, or cap the poll pause lower for short holds.\n")
			case "pgfence-advisory-xact":
				q("LockTx blocks in pg_advisory_xact_lock, so the server wakes the next waiter as soon as the holder's COMMIT releases the lock; what remains is the new holder's token draw, whose commit waits for a WAL flush on a loaded 2-core machine.\n")
			}
		}
		q("\n")
	}

	if missed(ts, "fence.Update vs") || missed(ts, "fence.Update.UnderLease") {
		fw, pw, gw, uw := waitOf(res.WriteWaits, "fence.Update"), waitOf(res.WriteWaits, "plain UPDATE"), waitOf(res.WriteWaits, "guarded UPDATE"), waitOf(res.WriteWaits, "fence.Update.UnderLease")
		q("### fenced writes: the builder's row lock doubles the WAL per write\n\n")
		plain := writeTP(res.Writes, "plain UPDATE")
		q("%d clients: plain UPDATE %s writes/s, raw guarded UPDATE (the predicate only) %s (%s), fence.Update %s (%s), fence.Update.UnderLease %s (%s), raw lease-checked UPDATE %s (%s). ",
			cfg.WriteClients, report.Rate(plain), report.Rate(writeTP(res.Writes, "guarded UPDATE")), report.Ratio(writeTP(res.Writes, "guarded UPDATE"), plain),
			report.Rate(writeTP(res.Writes, "fence.Update")), report.Ratio(writeTP(res.Writes, "fence.Update"), plain),
			report.Rate(writeTP(res.Writes, "fence.Update.UnderLease")), report.Ratio(writeTP(res.Writes, "fence.Update.UnderLease"), plain),
			report.Rate(writeTP(res.Writes, "lease-checked UPDATE")), report.Ratio(writeTP(res.Writes, "lease-checked UPDATE"), plain))
		q("EXPLAIN ANALYZE of one write: plain UPDATE WAL %s, execution %s; guarded UPDATE WAL %s, %s; fence.Update WAL %s, %s; fence.Update.UnderLease WAL %s, %s. All paths are bound by the commit's WAL flush (`LWLock:WALWrite`: plain %s, fence.Update %s).\n\n",
			planLine(pw, "WAL:"), planLine(pw, "Execution Time:"), planLine(gw, "WAL:"), planLine(gw, "Execution Time:"),
			planLine(fw, "WAL:"), planLine(fw, "Execution Time:"), planLine(uw, "WAL:"), planLine(uw, "Execution Time:"),
			share(pw, "LWLock:WALWrite"), share(fw, "LWLock:WALWrite"))
		q("Cause: the builder sends one statement that first locks the matched rows with `SELECT ... FOR UPDATE` in a CTE (to tell a stale token from a missing row and to return the newest token), then updates them. Locking a row writes it (xmax set, an extra heap-lock WAL record) before the UPDATE writes it again, so each write logs two heap records instead of one, and the statement does twice the buffer work; the raw guarded UPDATE, which only adds `fence_token <= $3` to the WHERE, costs the same as the plain one. With UnderLease the FOR SHARE lock on the lease row adds a third record. Suggestion for the fence owner: run the single guarded `UPDATE ... WHERE ... AND fence_token <= $t RETURNING` first and only when it changes no row run the diagnostic query (stale vs missing, newest token) — the success path then costs what the raw guarded UPDATE costs, and failures, which are rare, pay a second round trip. For UnderLease, the lease check can stay an `EXISTS (... FOR SHARE)` on the lease row (the raw lease-checked UPDATE above), without the extra lock on the written rows.\n\n")
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
		q("In scenario 3 pgfence-advisory completed %s cycles/s while answering %s busy TryLocks per second (raw-advisory: %s cycles/s, %s busy/s). A key held by another caller of the same Locker is refused in-process, without a round trip, so the %d benchmark clients, which retry the next name at once, spin on the Locker: a Go CPU profile (`-cpuprofile`) shows that spin dominated by building the ErrNotAcquired error (fmt.Errorf with Key.String) while the holders wait to be scheduled for their Unlock round trip on 2 cores. Real callers back off between attempts, but a cheaper refusal (a preformatted error wrapping pgfence.ErrNotAcquired) would make the fast path cheaper still. The raw ceiling's refusals cost a round trip each, which paces its clients.\n\n",
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
		q("\nCause: with the defaults, a Locker opens a new session whenever every open session already holds a lock, up to Config.MaxSessions (default %d), so under concurrent use it settles at MaxSessions sessions however few locks it holds. The count does not grow with the number of locks (10,000 locks fit on one session, as the MaxSessions 1 row shows), so the target holds with MaxSessions ≤ 2; the default trades connections for parallel lock round trips (compare the times to lock all). Either lower DefaultMaxSessions to 2 or state in the docs that a Locker uses up to MaxSessions connections.\n\n", advisory.DefaultMaxSessions)
	}

	if b.Len() == 0 {
		return
	}
	p("## Why targets were missed\n\n%s", b.String())
}
