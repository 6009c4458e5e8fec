//go:build chaos

package chaos_test

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence"
	"github.com/pgfence/pgfence/fence"
	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/leader"
	"github.com/pgfence/pgfence/leasetable"
	"github.com/pgfence/pgfence/migrations"
	"github.com/pgfence/pgfence/test/chaos"
)

// The leader scenarios' work: a row that only the leader may change, and
// an append-only log of every change that committed, each stamped with the
// database's clock_timestamp() taken before the change was checked (so a
// change logged at t was checked, and made, no earlier than t).
const leaderWorkSQL = `
CREATE TABLE leader_work (id int PRIMARY KEY, writes int NOT NULL DEFAULT 0, fence_token bigint NOT NULL DEFAULT 0);
INSERT INTO leader_work (id) VALUES (1);
CREATE TABLE leader_log (id bigserial PRIMARY KEY, token bigint NOT NULL, at timestamptz NOT NULL)`

// leaderElection is the election every leader scenario runs.
const leaderElection = "chaos-leader"

// leaderTTL is the lease TTL of the leader child and of the candidates
// through PgBouncer.
const leaderTTL = 300 * time.Millisecond

// inProcessTTL is the lease TTL of the candidates in this process. Their
// scenarios check when the old leader learnt that its term ended (its
// context's cancellation, stamped by a goroutine of its own) against the
// next term's beginning: the two are a SafetyMargin (TTL/10) apart, which
// 600ms keeps well above a scheduling stall on a loaded machine.
const inProcessTTL = 600 * time.Millisecond

// guardedWork is the leader's write: fenced with the term's token and
// checked against the term's lease (rejected once the lease is not held,
// on the database clock).
var guardedWork = fence.Update("leader_work").Set("writes = writes + 1").Where("id = 1")

// leaderWrite makes one change of the leader's work with token, guarded or
// not (the negative control), and logs it in the same transaction.
func leaderWrite(ctx context.Context, db *pgxpool.Pool, token int64, secret pgfence.Secret, guarded bool) error {
	tx, err := db.Begin(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	if _, err := tx.Exec(ctx, "INSERT INTO leader_log (token, at) VALUES ($1, pg_catalog.clock_timestamp())", token); err != nil {
		return err
	}
	if guarded {
		_, err = guardedWork.UnderLease(leaderElection, secret).Exec(ctx, tx, token)
	} else {
		_, err = tx.Exec(ctx, "UPDATE leader_work SET writes = writes + 1, fence_token = $1 WHERE id = 1", token)
	}
	if err != nil {
		return err
	}
	return tx.Commit(ctx)
}

// termRec is one term of a leader scenario: its token and beginning (the
// database's clock), the holder's local deadline when the term ended
// (Term.Expiry), and when the holder learnt that it ended (its context
// was cancelled), both on the local clock of the same machine.
type termRec struct {
	who      string
	token    int64
	began    time.Time
	deadline time.Time
	learned  time.Time
	// stopped is when the holder stopped acting as leader of its own
	// accord (its OnStartedLeading returned, and Run resigns next); zero
	// when not recorded. learned is stamped by a context.AfterFunc
	// goroutine, which a loaded machine may run after the resignation
	// has already let the next term begin.
	stopped          time.Time
	cause            string
	resignedByCaller bool
}

// writeRec is one committed change of the leader's work.
type writeRec struct {
	token int64
	at    time.Time
}

func readLeaderLog(t *testing.T, ctx context.Context, db pgfence.DB) []writeRec {
	t.Helper()
	rows, err := db.Query(ctx, "SELECT token, at FROM leader_log ORDER BY id")
	require.NoError(t, err)
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (writeRec, error) {
		var w writeRec
		return w, r.Scan(&w.token, &w.at)
	})
	require.NoError(t, err)
	return out
}

// checkTermsDisjoint is the history check by the database's clock: no
// change made under a term may be logged at or after the beginning of a
// later term, so the terms' activity never overlaps. It returns the
// violations.
func checkTermsDisjoint(terms []termRec, writes []writeRec) []string {
	var v []string
	for _, w := range writes {
		for _, tr := range terms {
			if tr.token > w.token && !w.at.Before(tr.began) {
				v = append(v, fmt.Sprintf("a change of term %d at %s is not before term %d began at %s (by %s)",
					w.token, w.at.Format(time.RFC3339Nano), tr.token, tr.began.Format(time.RFC3339Nano),
					w.at.Sub(tr.began)))
			}
		}
	}
	return v
}

// checkDeadlines checks the holder-side deadline: each term's local
// deadline (or its resignation, when earlier) came before the next term
// began. With learned set, it checks
// instead that the holder learnt of the end before the next term began
// (a paused holder cannot: that is the negative control of this check).
func checkDeadlines(terms []termRec, learned bool) []string {
	sorted := append([]termRec(nil), terms...)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i].token < sorted[j].token })
	var v []string
	for i := 0; i+1 < len(sorted); i++ {
		a, b := sorted[i], sorted[i+1]
		at, what := holderEnd(a)
		if learned {
			at, what = a.learned, "learnt of its end"
		}
		if at.IsZero() {
			v = append(v, fmt.Sprintf("term %d (%s) has no %s recorded", a.token, a.who, what))
			continue
		}
		if !at.Before(b.began) {
			v = append(v, fmt.Sprintf("term %d (%s): %s at %s, not before term %d began at %s (by %s)",
				a.token, a.who, what, at.Format(time.RFC3339Nano), b.token, b.began.Format(time.RFC3339Nano), at.Sub(b.began)))
		}
	}
	return v
}

// holderEnd is when the holder stops leading: its local deadline, or when
// it learnt of the end or stopped of its own accord, if that came first
// (a resignation).
func holderEnd(tr termRec) (time.Time, string) {
	if !tr.stopped.IsZero() && (tr.learned.IsZero() || tr.stopped.Before(tr.learned)) &&
		(tr.deadline.IsZero() || tr.stopped.Before(tr.deadline)) {
		return tr.stopped, "stopped leading"
	}
	if !tr.learned.IsZero() && (tr.deadline.IsZero() || tr.learned.Before(tr.deadline)) {
		return tr.learned, "end (resigned)"
	}
	return tr.deadline, "local deadline"
}

// termGrants records the terms as grants, for the suite's token checks.
func termGrants(terms []termRec) chaos.History {
	rec := chaos.NewRecorder()
	sorted := append([]termRec(nil), terms...)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i].began.Before(sorted[j].began) })
	for i, tr := range sorted {
		op := rec.Invoke(chaos.Op{Process: i, Kind: chaos.Acquire, Name: leaderElection})
		op.Complete(chaos.Ok, func(o *chaos.Op) { o.Token = tr.token })
	}
	return rec.History()
}

// requireLeaderHistory runs the history checks of a scenario and logs its
// fault row: terms, their gaps, changes, and the verdict.
func requireLeaderHistory(t *testing.T, scenario string, terms []termRec, writes []writeRec, wantOverlap bool) {
	t.Helper()
	h := termGrants(terms)
	require.Empty(t, chaos.CheckTokensUnique(h), "tokens unique")
	require.Empty(t, chaos.CheckTokensIncreasing(h), "tokens increasing")
	deadlines := checkDeadlines(terms, false)
	overlaps := checkTermsDisjoint(terms, writes)
	sorted := append([]termRec(nil), terms...)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i].token < sorted[j].token })
	for i, tr := range sorted {
		line := fmt.Sprintf("%s: term %d (%s) began %s", scenario, tr.token, tr.who, tr.began.Format("15:04:05.000000"))
		if end, what := holderEnd(tr); i+1 < len(sorted) && !end.IsZero() {
			next := sorted[i+1]
			line += fmt.Sprintf("; %s %v before term %d began", what, next.began.Sub(end).Round(time.Microsecond), next.token)
			if !tr.learned.IsZero() && what == "local deadline" {
				line += fmt.Sprintf(" (learnt of the end %v before it)", next.began.Sub(tr.learned).Round(time.Microsecond))
			}
		}
		if tr.cause != "" {
			line += "; ended: " + tr.cause
		}
		t.Log(line)
	}
	verdict := "terms disjoint"
	if len(overlaps) > 0 || len(deadlines) > 0 {
		verdict = "violation detected"
	}
	t.Logf("%s: %d terms, %d committed changes; deadline violations %d; overlaps by the database's clock %d",
		scenario, len(terms), len(writes), len(deadlines), len(overlaps))
	t.Logf("chaos: scenario=%s ops=%d verdict=%s", scenario, len(terms)+len(writes), verdict)
	require.Empty(t, deadlines, "the old leader's deadline came before the next term")
	if wantOverlap {
		require.NotEmpty(t, overlaps, "negative control: the unguarded late change must be seen overlapping the next term")
		t.Logf("%s: negative control detected as expected: %s", scenario, overlaps[0])
		return
	}
	require.Empty(t, overlaps, "no two terms overlap")
}

// inProcessCandidate is a leader candidate of this process with its own
// pool, Locker and Elector; learned is stamped when a term's context ends.
type inProcessCandidate struct {
	name   string
	pool   *pgxpool.Pool
	locker *leasetable.Locker
	e      *leader.Elector
}

func newInProcessCandidate(t *testing.T, ctx context.Context, name string, pool *pgxpool.Pool) *inProcessCandidate {
	t.Helper()
	k, err := leasetable.New(ctx, pool, &leasetable.Config{TTL: inProcessTTL, QueryTimeout: time.Second})
	require.NoError(t, err)
	t.Cleanup(k.Close)
	e, err := leader.New(ctx, pool, &leader.Config{Locker: k, Election: leaderElection, Value: name})
	require.NoError(t, err)
	t.Cleanup(e.Close)
	return &inProcessCandidate{name: name, pool: pool, locker: k, e: e}
}

// watchTerm returns the record of term, completed (deadline, learned,
// cause) when the term's context ends: the returned channel is closed
// then.
func watchTerm(who string, term *leader.Term) (*termRec, <-chan struct{}) {
	rec := &termRec{who: who, token: term.Token(), began: term.BeganAt()}
	done := make(chan struct{})
	context.AfterFunc(term.Context(), func() {
		rec.learned = time.Now()
		rec.deadline = term.Expiry()
		rec.cause = term.Err().Error()
		close(done)
	})
	return rec, done
}

// newRole creates a login role with pgfence's grants on db and returns
// it; it is dropped when the test ends.
func newRole(t *testing.T, db *pgtest.DB) string {
	t.Helper()
	ctx := context.Background()
	var rnd [6]byte
	_, _ = rand.Read(rnd[:])
	role := "chaos_leader_" + hex.EncodeToString(rnd[:])
	ident := pgx.Identifier{role}.Sanitize()
	_, err := db.Pool.Exec(ctx, "CREATE ROLE "+ident+" LOGIN")
	require.NoError(t, err)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_, _ = db.Pool.Exec(ctx, "ALTER ROLE "+ident+" LOGIN")
		_, _ = chaos.TerminateBackends(ctx, db.Pool, db.Name, "")
		_, err := db.Pool.Exec(ctx, "DROP OWNED BY "+ident)
		require.NoError(t, err)
		_, err = db.Pool.Exec(ctx, "DROP ROLE "+ident)
		require.NoError(t, err)
	})
	require.NoError(t, migrations.Grant(ctx, migrations.Target{Pool: db.Pool}, role, nil, nil))
	_, err = db.Pool.Exec(ctx, "GRANT SELECT, INSERT, UPDATE ON leader_work, leader_log TO "+ident+
		"; GRANT USAGE ON SEQUENCE leader_log_id_seq TO "+ident)
	require.NoError(t, err)
	return role
}

// The leader child: a candidate in a process of its own (the test binary
// run again), which a test can pause with SIGSTOP. It is dispatched from
// init, before TestMain starts the harness, because the package's TestMain
// belongs to the generic holder child (chaos.ChildMain).
const (
	envLeaderChild        = "PGFENCE_CHAOS_LEADER_CHILD"
	envLeaderChildURL     = "PGFENCE_CHAOS_LEADER_CHILD_URL"
	envLeaderChildGuarded = "PGFENCE_CHAOS_LEADER_CHILD_GUARDED"
)

func init() {
	if os.Getenv(envLeaderChild) != "" {
		os.Exit(leaderChildMain(os.Stdin, os.Stdout))
	}
}

// leaderChildMain answers, one line each: "campaign" with "ok TOKEN
// BEGAN_UNIX_NANO" once it leads; "write TOKEN" with "ok", "fenced" or
// "fail MSG"; "waitended" with "ended DEADLINE_UNIX_NANO LEARNED_UNIX_NANO
// CAUSE" once the term ended (or "held" after 30s); "resign" with "ok".
func leaderChildMain(in io.Reader, out io.Writer) int {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv(envLeaderChildURL))
	if err != nil {
		fmt.Fprintf(out, "fail %v\n", err)
		return 1
	}
	defer pool.Close()
	guarded := os.Getenv(envLeaderChildGuarded) == "1"
	k, err := leasetable.New(ctx, pool, &leasetable.Config{TTL: leaderTTL, Owner: fmt.Sprintf("chaos-leader-child/%d", os.Getpid())})
	if err != nil {
		fmt.Fprintf(out, "fail %v\n", err)
		return 1
	}
	defer k.Close()
	e, err := leader.New(ctx, pool, &leader.Config{Locker: k, Election: leaderElection, Value: "child"})
	if err != nil {
		fmt.Fprintf(out, "fail %v\n", err)
		return 1
	}
	defer e.Close()
	var (
		term    *leader.Term
		mu      sync.Mutex
		learned time.Time
		ended   chan struct{}
	)
	fmt.Fprintln(out, "ready")
	sc := bufio.NewScanner(in)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		var reply string
		switch {
		case len(f) == 1 && f[0] == "campaign":
			cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			term, err = e.Campaign(cctx)
			cancel()
			if err != nil {
				reply = "fail " + strings.ReplaceAll(err.Error(), "\n", " ")
				break
			}
			ended = make(chan struct{})
			ch := ended
			context.AfterFunc(term.Context(), func() {
				mu.Lock()
				learned = time.Now()
				mu.Unlock()
				close(ch)
			})
			reply = fmt.Sprintf("ok %d %d", term.Token(), term.BeganAt().UnixNano())
		case len(f) == 2 && f[0] == "write":
			tok, _ := strconv.ParseInt(f[1], 10, 64)
			var secret pgfence.Secret
			if term != nil {
				secret = term.Lease().Secret()
			}
			err := leaderWrite(ctx, pool, tok, secret, guarded)
			switch {
			case err == nil:
				reply = "ok"
			case errors.Is(err, pgfence.ErrFenced):
				reply = "fenced " + strings.ReplaceAll(err.Error(), "\n", " ")
			default:
				reply = "fail " + strings.ReplaceAll(err.Error(), "\n", " ")
			}
		case len(f) == 1 && f[0] == "waitended" && term != nil:
			select {
			case <-ended:
				mu.Lock()
				reply = fmt.Sprintf("ended %d %d %s", term.Expiry().UnixNano(), learned.UnixNano(), term.Err())
				mu.Unlock()
			case <-time.After(30 * time.Second):
				reply = "held"
			}
		case len(f) == 1 && f[0] == "resign" && term != nil:
			if err := term.Resign(ctx); err != nil && !errors.Is(err, pgfence.ErrNotHeld) {
				reply = "fail " + err.Error()
			} else {
				reply = "ok"
			}
		default:
			reply = "fail bad command " + strconv.Quote(sc.Text())
		}
		fmt.Fprintln(out, reply)
	}
	return 0
}

// leaderChild is a running leader child (a chaos.Child in leader mode),
// with the test's failure handling.
type leaderChild struct{ *chaos.Child }

// startLeaderChild runs a leader child on url and waits until it is ready.
func startLeaderChild(t *testing.T, ctx context.Context, url string, guarded bool) *leaderChild {
	t.Helper()
	g := "0"
	if guarded {
		g = "1"
	}
	c, err := chaos.StartChildEnv(ctx, []string{envLeaderChild + "=1", envLeaderChildURL + "=" + url, envLeaderChildGuarded + "=" + g})
	require.NoError(t, err)
	t.Cleanup(c.Close)
	return &leaderChild{c}
}

func (c *leaderChild) send(t *testing.T, line string) {
	t.Helper()
	require.NoError(t, c.Send(line))
}

func (c *leaderChild) recv(t *testing.T, ctx context.Context) string {
	t.Helper()
	l, err := c.Recv(ctx)
	require.NoError(t, err, "no reply from the leader child")
	return l
}

func (c *leaderChild) call(t *testing.T, ctx context.Context, line string) string {
	t.Helper()
	c.send(t, line)
	return c.recv(t, ctx)
}

// stop pauses the child with SIGSTOP and waits until it is stopped.
func (c *leaderChild) stop(t *testing.T, ctx context.Context) {
	t.Helper()
	require.NoError(t, c.Stop(ctx), "the leader child did not stop")
}

func (c *leaderChild) cont(t *testing.T) {
	t.Helper()
	require.NoError(t, c.Cont())
}

func (c *leaderChild) close() { c.Close() }

// parseUnixNano parses a decimal Unix time in nanoseconds.
func parseUnixNano(t *testing.T, s string) time.Time {
	t.Helper()
	n, err := strconv.ParseInt(s, 10, 64)
	require.NoError(t, err)
	return time.Unix(0, n)
}
