package chaos

import (
	"context"
	"errors"
	"fmt"

	"github.com/pgfence/pgfence"
)

// terminateSQL terminates the client backends of database $1 whose
// application_name is $2 (all when $2 is empty), except the caller's,
// waiting up to 5s for each to exit.
const terminateSQL = `SELECT count(*) FILTER (WHERE pg_terminate_backend(pid, 5000))
FROM pg_stat_activity
WHERE datname = $1 AND backend_type = 'client backend' AND pid <> pg_backend_pid()
  AND ($2 = '' OR application_name = $2)`

// TerminateBackends kills, with pg_terminate_backend(pid, 5000), the
// client connections to database whose application_name is appName (every
// one when appName is empty), except admin's own, and returns how many it
// terminated. admin needs the privilege to terminate them.
func TerminateBackends(ctx context.Context, admin pgfence.DB, database, appName string) (int, error) {
	if admin == nil || database == "" {
		return 0, errors.New("chaos: TerminateBackends needs an admin connection and a database")
	}
	var n int
	if err := admin.QueryRow(ctx, terminateSQL, database, appName).Scan(&n); err != nil {
		return 0, fmt.Errorf("chaos: terminate backends: %w", err)
	}
	return n, nil
}
