package fence

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence"
)

// presentSQL sets pgfence.token until the transaction ends, as
// pgfence_present(token) does in SQL. It takes no lock.
const presentSQL = `SELECT pg_catalog.set_config('pgfence.token', $1::pg_catalog.int8::pg_catalog.text, true)`

// Present presents token to the pgfence triggers for every later UPDATE and
// DELETE of tx's transaction, by any query. tx must be a transaction: a
// *pgxpool.Pool is refused. It returns an error for a token that is not
// positive, a nil tx, or the database's error.
func Present(ctx context.Context, tx pgfence.DB, token int64) error {
	switch tx.(type) {
	case nil:
		return errors.New("fence: Present: nil transaction")
	case *pgxpool.Pool:
		return errors.New("fence: Present needs a transaction, not a pool: a setting made on a pool ends with its statement")
	}
	if token <= 0 {
		return fmt.Errorf("fence: Present: fencing token %d is not positive; tokens come from pgfence_next_token()", token)
	}
	if _, err := tx.Exec(ctx, presentSQL, token); err != nil {
		return fmt.Errorf("fence: Present: %w", err)
	}
	return nil
}
