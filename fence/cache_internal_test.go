package fence

import (
	"github.com/pgfence/pgfence"
	"testing"

	"github.com/stretchr/testify/require"
)

// The statement is rendered once per statement value, argument count and
// lease check; copies made by UnderLease share the cache, copies made by
// any other method get their own, and errors are not cached. (The black-box
// TestSQLIsCachedPerStatement checks the rendered text, which is the same
// with or without the cache.)
func TestCachedRendersOnce(t *testing.T) {
	t.Parallel()
	base := Update("accounts").Set("balance = balance + $1").Where("id = $2")
	renders := 0
	render := func(s *UpdateStmt, nargs int) error {
		t.Helper()
		_, err := s.g.cached(nargs, func(n int) (string, error) { renders++; return s.build(n) })
		return err
	}

	for range 3 {
		require.NoError(t, render(base, 2))
	}
	require.Equal(t, 1, renders, "rendered once for repeated calls")

	require.NoError(t, render(base.UnderLease("a", testSecret), 2))
	require.Equal(t, 2, renders, "the lease check changes the SQL")
	require.NoError(t, render(base.UnderLease("b", testSecret), 2))
	require.Equal(t, 2, renders, "the lease name is a parameter: the UnderLease copies share the rendering")

	for _, derived := range []*UpdateStmt{base.Strict(), base.Column("epoch"), base.Set("balance = $1"), base.Where("true AND id = $2"), base.LeaseSchema("locks")} {
		before := renders
		require.NoError(t, render(derived, 2))
		require.Equal(t, before+1, renders, "a derived statement renders its own SQL")
	}

	before := renders
	require.Error(t, render(base, 3))
	require.Error(t, render(base, 3))
	require.Equal(t, before+2, renders, "errors are not cached")
	require.NoError(t, render(base, 2))
	require.Equal(t, before+2, renders, "the base statement's cache is unchanged by its copies")
}

// testSecret is a Secret for statements that are only rendered.
var testSecret = pgfence.NewSecret("test-secret")
