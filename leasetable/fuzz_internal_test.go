package leasetable

import (
	"context"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence/internal/pgtest"
)

// nameSeeds are the seed corpus of FuzzLeaseName, also checked against the
// database's constraints by TestLeaseNameSeedsMatchDatabase.
var nameSeeds = []string{
	"job", "account:42", "Straße", "日本語", "emoji 🔒", " ", "a\x00b", "\xff\xfe", "bad \xc3", "",
	strings.Repeat("x", MaxNameLength), strings.Repeat("x", MaxNameLength+1), strings.Repeat("é", MaxNameLength/2),
	strings.Repeat("é", MaxNameLength/2) + "x", "'; DROP TABLE pgfence_leases; --", "$1", "\t\n", "line\nforged row", "\x1b[31mred", "del\x7f",
}

// FuzzLeaseName checks the name validation done before anything is sent:
// it accepts exactly the non-empty valid UTF-8 strings without C0 control
// characters (NUL included) or DEL of at most MaxNameLength bytes (what the
// table's CHECK constraints and the text type accept, less the control
// characters, which would forge lines in operators' output), and never
// panics.
func FuzzLeaseName(f *testing.F) {
	for _, s := range nameSeeds {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, name string) {
		err := checkText("lease name", name)
		valid := name != "" && len(name) <= MaxNameLength && utf8.ValidString(name) &&
			!strings.ContainsFunc(name, func(r rune) bool { return r < 0x20 || r == 0x7f })
		if valid {
			require.NoError(t, err, "%q", name)
			return
		}
		require.Error(t, err, "%q", name)
		require.True(t, strings.HasPrefix(err.Error(), "pgfence: leasetable: lease name "), err.Error())
	})
}

// TestLeaseNameSeedsMatchDatabase checks the fuzz seeds against the
// database: a name the Go validation accepts is accepted by the table, and
// one it rejects is rejected by the table or the text type too, except for
// control characters, which only the Go validation refuses.
func TestLeaseNameSeedsMatchDatabase(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.NewDB(t)
	const insert = `INSERT INTO pgfence.pgfence_leases (name, owner, expires_at) VALUES ($1, 'fuzz', now())`
	for _, name := range nameSeeds {
		goErr := checkText("lease name", name)
		_, dbErr := db.Pool.Exec(ctx, insert, name)
		if goErr != nil && strings.Contains(goErr.Error(), "control character") {
			continue // the table accepts them; pgfence does not write them
		}
		require.Equal(t, goErr == nil, dbErr == nil, "name %q: Go says %v, the database says %v", name, goErr, dbErr)
	}
}
