package leader_test

import (
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/leader"
	"github.com/pgfence/pgfence/leasetable"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// candidate is one replica in a test: its own Locker (as a separate
// process would have) and Elector.
type candidate struct {
	locker *leasetable.Locker
	e      *leader.Elector
}

// newCandidate returns a candidate of election on pool, with value, closed
// when the test ends. lcfg and edit may be nil.
func newCandidate(t *testing.T, pool *pgxpool.Pool, election, value string, lcfg *leasetable.Config, edit func(*leader.Config)) candidate {
	t.Helper()
	k, err := leasetable.New(t.Context(), pool, lcfg)
	require.NoError(t, err)
	t.Cleanup(k.Close)
	cfg := &leader.Config{Locker: k, Election: election, Value: value}
	if edit != nil {
		edit(cfg)
	}
	e, err := leader.New(t.Context(), pool, cfg)
	require.NoError(t, err)
	t.Cleanup(e.Close)
	return candidate{locker: k, e: e}
}

// exampleDatabase returns the URL of a migrated database for an Example,
// and a function that drops it.
func exampleDatabase() (url string, drop func()) {
	db, drop := pgtest.ExampleDB()
	db.Pool.Close()
	return db.URL, drop
}
