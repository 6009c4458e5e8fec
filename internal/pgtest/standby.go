package pgtest

import (
	"context"
	"testing"
	"time"

	"github.com/pgfence/pgfence/internal/pgserver"
)

// StandbyOptions configures a streaming standby; see
// [pgserver.StandbyOptions].
type StandbyOptions = pgserver.StandbyOptions

// NewStandby starts a streaming standby of c for a test (see
// [pgserver.Cluster.NewStandby]) and destroys it when t ends.
func NewStandby(t testing.TB, c *Cluster, opts *StandbyOptions) *Cluster {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	sb, err := c.NewStandby(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("pgtest: standby log tail:\n%s", sb.LogTail())
		}
		sb.Destroy()
	})
	return sb
}
