package main_test

import (
	"context"
	"encoding/json"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/leader"
	"github.com/pgfence/pgfence/leasetable"
)

// lsLeader is one election of ls --json.
type lsLeader struct {
	Election          string     `json:"election"`
	Leading           bool       `json:"leading"`
	Token             int64      `json:"token"`
	Owner             string     `json:"owner"`
	Value             string     `json:"value"`
	Proclaimed        bool       `json:"proclaimed"`
	BeganAt           *time.Time `json:"began_at"`
	ExpiresAt         *time.Time `json:"expires_at"`
	LeadingForSeconds float64    `json:"leading_for_seconds"`
	ExpiresInSeconds  float64    `json:"expires_in_seconds"`
}

// ls shows each election's leader (its value, owner and term) and, with
// --terms, the recent terms.
func TestLsLeaders(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.NewDB(t)
	env := dbEnv(db)
	k, err := leasetable.New(ctx, db.Pool, &leasetable.Config{Owner: "replica-1"})
	require.NoError(t, err)
	t.Cleanup(k.Close)
	newElector := func(election, value string) *leader.Elector {
		e, err := leader.New(ctx, db.Pool, &leader.Config{Locker: k, Election: election, Value: value})
		require.NoError(t, err)
		t.Cleanup(e.Close)
		return e
	}
	sched := newElector("scheduler", "10.0.0.1:8080")
	relay := newElector("relay", "a\x1bb")
	first, err := sched.Campaign(ctx)
	require.NoError(t, err)
	require.NoError(t, first.Resign(ctx))
	term, err := sched.Campaign(ctx)
	require.NoError(t, err)
	rt, err := relay.Campaign(ctx)
	require.NoError(t, err)
	require.NoError(t, rt.Resign(ctx))

	r := pgfence(t, env, "", "ls", "--json")
	require.Equal(t, 0, r.code, r.stderr)
	out := decodeLs(t, r.stdout)
	require.Len(t, out.Leaders, 2)
	require.Equal(t, lsLeader{Election: "relay"}, out.Leaders[0], "resigned: nobody leads")
	l := out.Leaders[1]
	require.Equal(t, "scheduler", l.Election)
	require.True(t, l.Leading)
	require.True(t, l.Proclaimed)
	require.Equal(t, term.Token(), l.Token)
	require.Equal(t, "replica-1", l.Owner)
	require.Equal(t, "10.0.0.1:8080", l.Value)
	require.NotNil(t, l.ExpiresAt)
	require.True(t, l.ExpiresAt.After(out.Now))
	require.Greater(t, l.ExpiresInSeconds, 0.0)

	r = pgfence(t, env, "", "ls")
	require.Equal(t, 0, r.code, r.stderr)
	require.Contains(t, r.stdout, "ELECTION")
	// The leaders' section: after its header, up to the blank line.
	var rows [][]string
	in := false
	for _, line := range strings.Split(r.stdout, "\n") {
		f := strings.Fields(line)
		switch {
		case len(f) > 0 && f[0] == "ELECTION":
			require.Equal(t, []string{"ELECTION", "LEADER", "OWNER", "TERM", "LEADING", "FOR", "EXPIRES", "IN"}, f)
			in = true
		case in && len(f) == 0:
			in = false
		case in:
			rows = append(rows, f)
		}
	}
	require.Len(t, rows, 2, r.stdout)
	require.Equal(t, [][]string{
		{"relay", "-", "-", "-", "-", "-"},
		{"scheduler", "10.0.0.1:8080", "replica-1", strconv.FormatInt(term.Token(), 10)},
	}, [][]string{rows[0], rows[1][:4]})

	r = pgfence(t, env, "", "ls", "--terms", "--json")
	require.Equal(t, 0, r.code, r.stderr)
	var terms struct {
		Terms []struct {
			Election  string     `json:"election"`
			Token     int64      `json:"token"`
			Owner     string     `json:"owner"`
			Value     string     `json:"value"`
			BeganAt   time.Time  `json:"began_at"`
			Leading   bool       `json:"leading"`
			ExpiresAt *time.Time `json:"expires_at"`
		} `json:"terms"`
	}
	dec := json.NewDecoder(strings.NewReader(r.stdout))
	dec.DisallowUnknownFields()
	require.NoError(t, dec.Decode(&terms), r.stdout)
	require.Len(t, terms.Terms, 3)
	require.Equal(t, "relay", terms.Terms[0].Election)
	require.Equal(t, "a\x1bb", terms.Terms[0].Value, "--json keeps values exact")
	require.False(t, terms.Terms[0].Leading)
	require.Equal(t, term.Token(), terms.Terms[1].Token)
	require.True(t, terms.Terms[1].Leading)
	require.NotNil(t, terms.Terms[1].ExpiresAt)
	require.Equal(t, first.Token(), terms.Terms[2].Token)
	require.False(t, terms.Terms[2].Leading)
	require.Nil(t, terms.Terms[2].ExpiresAt)

	r = pgfence(t, env, "", "ls", "--terms")
	require.Equal(t, 0, r.code, r.stderr)
	require.Contains(t, r.stdout, `"a\x1bb"`, "the table escapes control characters")
	require.Contains(t, r.stdout, "leading")
	require.Contains(t, r.stdout, "ended")

	r = pgfence(t, env, "", "ls", "--terms", "--forced")
	require.Equal(t, 2, r.code)
	require.Contains(t, r.stderr, "pass one")
	require.NoError(t, term.Resign(ctx))
}
