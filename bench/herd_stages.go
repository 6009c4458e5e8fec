package main

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgfence/pgfence/bench/internal/stats"
)

// Where a one-waiter hand-over of scenario 11 spends its time. At one
// waiter the workers trace their Lockers' lock and unlock statements (a
// pgx QueryTracer on the pool's connection configuration, which the
// advisory Locker's sessions copy) and report each one's wall-clock start
// and end; the benchmark then cuts every hand-over, from the holder's
// Release call to the waiter's Acquire return, at the statements it ran:
//
//	before   Release called → the release statement sent
//	release  the release statement's round trip (its commit sends NOTIFY)
//	wake     its answer → the waiter's acquire statement sent (NOTIFY
//	         delivered to the waiter's LISTEN connection, the waiter woken;
//	         negative when the waiter sent it before the holder read its
//	         answer); zero for a parked advisory wait, whose statement was
//	         sent before the release
//	acquire  the acquire statement's round trip (its token waits for a WAL
//	         flush); for a parked wait, from the release's answer (or the
//	         wait's, if earlier) to the wait's answer
//	after    its answer → Acquire returns
//
// The five parts of one hand-over add up to it. Only statements that
// succeeded are traced; tracing costs two clock reads and an append per
// statement.

// Kinds of traced statements.
const (
	herdStmtAcquire = 1 // leasetable's pgfence_acquire, advisory's pg_try_advisory_lock or parked pg_advisory_lock
	herdStmtRelease = 2 // leasetable's pgfence_release, advisory's pg_advisory_unlock
)

// herdStmtKind classifies a statement of a Locker by its text: 0 for
// statements that are neither (renewals, interest locks on the LISTEN
// connection, pings).
func herdStmtKind(sql string) int {
	switch {
	case strings.Contains(sql, "pgfence_acquire("), strings.Contains(sql, "pg_try_advisory_lock("),
		strings.Contains(sql, "pg_advisory_lock("):
		return herdStmtAcquire
	case strings.Contains(sql, "pgfence_release("), strings.Contains(sql, "pg_advisory_unlock("):
		return herdStmtRelease
	}
	return 0
}

// herdStmt is one traced statement: its kind and wall-clock UnixNano start
// (before it was sent) and end (its last row read).
type herdStmt struct {
	Kind       int
	Start, End int64
}

// MarshalJSON writes a statement as a compact array.
func (s herdStmt) MarshalJSON() ([]byte, error) {
	return json.Marshal([3]int64{int64(s.Kind), s.Start, s.End})
}

// UnmarshalJSON reads the array MarshalJSON writes.
func (s *herdStmt) UnmarshalJSON(b []byte) error {
	var a [3]int64
	if err := json.Unmarshal(b, &a); err != nil {
		return err
	}
	*s = herdStmt{Kind: int(a[0]), Start: a[1], End: a[2]}
	return nil
}

// maxHerdStmts bounds the statements one worker keeps.
const maxHerdStmts = 200_000

// stmtTracer records the lock and unlock statements of a worker's Lockers.
type stmtTracer struct {
	mu    sync.Mutex
	stmts []herdStmt
}

type stmtTraceKey struct{}

type stmtTraceStart struct {
	kind  int
	start int64
}

// TraceQueryStart notes when a lock or unlock statement is sent.
func (t *stmtTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	if kind := herdStmtKind(d.SQL); kind != 0 {
		return context.WithValue(ctx, stmtTraceKey{}, stmtTraceStart{kind, time.Now().UnixNano()})
	}
	return ctx
}

// TraceQueryEnd records a lock or unlock statement that succeeded.
func (t *stmtTracer) TraceQueryEnd(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryEndData) {
	s, ok := ctx.Value(stmtTraceKey{}).(stmtTraceStart)
	if !ok || d.Err != nil {
		return
	}
	end := time.Now().UnixNano()
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(t.stmts) < maxHerdStmts {
		t.stmts = append(t.stmts, herdStmt{Kind: s.kind, Start: s.start, End: end})
	}
}

// take returns the statements recorded so far.
func (t *stmtTracer) take() []herdStmt {
	if t == nil {
		return nil
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	return slices.Clone(t.stmts)
}

// herdStages summarises the parts of the one-waiter hand-overs (see the
// top of this file); N counts the hand-overs that could be cut (both their
// statements found).
type herdStages struct {
	N                                     int
	Before, Release, Wake, Acquire, After stats.Summary
}

// splitHandovers cuts each hand-over (a release start and the next
// holder's acquire return, UnixNano) at its statements: the first release
// statement sent at or after the release start, and the last acquire
// statement that ended at or before the acquire returned and after the
// release start. An acquire statement sent before the release (a parked
// wait) counts from the release statement's answer, or its own if that
// came first. Hand-overs without both are left out.
func splitHandovers(pairs [][2]int64, stmts []herdStmt) herdStages {
	var rel, acq []herdStmt
	for _, s := range stmts {
		switch s.Kind {
		case herdStmtRelease:
			rel = append(rel, s)
		case herdStmtAcquire:
			acq = append(acq, s)
		}
	}
	slices.SortFunc(rel, func(a, b herdStmt) int { return cmpInt64(a.Start, b.Start) })
	slices.SortFunc(acq, func(a, b herdStmt) int { return cmpInt64(a.End, b.End) })
	var before, release, wake, acquire, after []time.Duration
	for _, p := range pairs {
		from, to := p[0], p[1]
		i, _ := slices.BinarySearchFunc(rel, from, func(s herdStmt, t int64) int { return cmpInt64(s.Start, t) })
		j, found := slices.BinarySearchFunc(acq, to, func(s herdStmt, t int64) int { return cmpInt64(s.End, t) })
		if found {
			j++ // the statement that ended exactly then counts
		}
		if i == len(rel) || j == 0 {
			continue
		}
		r, a := rel[i], acq[j-1]
		if r.Start > to || a.End <= from {
			continue
		}
		sent := a.Start
		if sent < from {
			sent = min(r.End, a.End) // parked before the release
		}
		before = append(before, time.Duration(r.Start-from))
		release = append(release, time.Duration(r.End-r.Start))
		wake = append(wake, time.Duration(sent-r.End))
		acquire = append(acquire, time.Duration(a.End-sent))
		after = append(after, time.Duration(to-a.End))
	}
	return herdStages{N: len(release), Before: stats.Summarize(before), Release: stats.Summarize(release),
		Wake: stats.Summarize(wake), Acquire: stats.Summarize(acquire), After: stats.Summarize(after)}
}

// micros formats d in whole microseconds, with its sign.
func micros(d time.Duration) string { return strconv.FormatInt(d.Microseconds(), 10) }

// stagesHeader and stagesRow are the columns of the stages table: the
// median (and mean) of each part, in µs.
var stagesHeader = []string{"cut", "p50 of the whole", "before", "release statement", "wake", "acquire statement", "after"}

func stagesRow(st herdStages, total stats.Summary) []string {
	cell := func(s stats.Summary) string { return micros(s.P50) + " (" + micros(s.Mean) + ")" }
	return []string{strconv.Itoa(st.N), cell(total), cell(st.Before), cell(st.Release), cell(st.Wake), cell(st.Acquire), cell(st.After)}
}

// stagesText is one sentence on where pt's median hand-over went.
func stagesText(pt *herdPoint) string {
	st := pt.Stages
	if st.N == 0 {
		return ""
	}
	return fmt.Sprintf(" Cut at its statements (medians, µs; %d hand-overs): %s before the release statement, %s in it, %s until the acquire statement was sent, %s in it, %s after it.",
		st.N, micros(st.Before.P50), micros(st.Release.P50), micros(st.Wake.P50), micros(st.Acquire.P50), micros(st.After.P50))
}
