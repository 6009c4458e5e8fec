package fence

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgfence/pgfence"
)

// guard holds what every builder shares: the table, the guard column, the
// comparison and the optional lease check. Builders copy it on every
// method call, so a statement can be reused and extended safely.
type guard struct {
	table  pgx.Identifier
	err    error // from the table name, reported by SQL and Exec
	column string
	strict bool
	lease  string
	leased bool
}

func newGuard(table pgx.Identifier, err error) guard {
	if err == nil {
		err = checkIdent(table)
	}
	return guard{table: table, err: err, column: DefaultColumn}
}

// tableName is the table as written in SQL, and in error messages.
func (g *guard) tableName() string { return g.table.Sanitize() }

// check validates the parts every builder shares.
func (g *guard) check() error {
	if g.err != nil {
		return g.err
	}
	if err := checkName("guard column", g.column); err != nil {
		return err
	}
	if g.leased {
		if g.lease == "" {
			return errors.New("fence: empty lease name")
		}
		if len(g.lease) > maxLeaseName {
			return fmt.Errorf("fence: lease name is longer than %d bytes", maxLeaseName)
		}
	}
	return nil
}

// col is the quoted guard column.
func (g *guard) col() string { return pgx.Identifier{g.column}.Sanitize() }

// op is the guard comparison: <= lets one holder write many times, < only
// once per token.
func (g *guard) op() string {
	if g.strict {
		return "<"
	}
	return "<="
}

// leaseCTE requires the lease row to be held with the presented token on the
// database clock, and locks it FOR SHARE until the transaction ends: a
// takeover or release (an UPDATE of the row) in flight makes the statement
// wait and then see the new row, and one that starts later waits for this
// transaction. clock_timestamp(), not now(): inside a long transaction now()
// is the transaction's start, which would let an expired lease pass.
const leaseCTE = `pgfence_lease AS (
    SELECT FROM pgfence_leases
    WHERE name = $%[2]d AND fence = $%[1]d::bigint AND expires_at > clock_timestamp()
    FOR SHARE
), `

// targetCTE locks, FOR UPDATE, every row the caller's WHERE matches and
// reads its guard token. Under READ COMMITTED a row being written
// concurrently is waited for and then re-read in its newest committed
// version (and dropped if it no longer matches), so the tokens are the
// current ones, and they cannot change before this transaction ends.
const targetCTE = `pgfence_target AS (
    SELECT %[1]s AS pgfence_token FROM %[2]s
    WHERE %[3]s%[4]s
    FOR UPDATE
), `

// gateSQL holds the write back, as a one-time filter evaluated before the
// write scans a single row, until pgfence_target has locked every matching
// row; and lets it proceed only if none of them carries a newer (or NULL)
// token: all or nothing.
const gateSQL = `NOT EXISTS (SELECT FROM pgfence_target WHERE (pgfence_token %[1]s $%[2]d) IS NOT TRUE)`

// leaseGate is the condition that the lease check passed.
const leaseGate = `EXISTS (SELECT FROM pgfence_lease)`

// resultSQL is the statement's single result row: rows written, rows
// matched, their newest token, how many have a NULL token, and whether the
// lease check passed.
const resultSQL = `
SELECT (SELECT count(*) FROM pgfence_write), count(*), max(pgfence_token),
    count(*) FILTER (WHERE pgfence_token IS NULL), %s
FROM pgfence_target`

// with renders the WITH clause up to (not including) the write CTE.
// match is the row-matching condition for the target CTE.
func (g *guard) with(match string, tok int) string {
	var b strings.Builder
	b.WriteString("WITH ")
	leaseCond := ""
	if g.leased {
		fmt.Fprintf(&b, leaseCTE, tok, tok+1)
		leaseCond = "\n    AND " + leaseGate
	}
	fmt.Fprintf(&b, targetCTE, g.col(), g.tableName(), match, leaseCond)
	return b.String()
}

// writeWhere is the write's WHERE: the caller's condition, the guard
// predicate (rechecked by PostgreSQL on the newest version of each row), the
// gates, and any extra conditions.
func (g *guard) writeWhere(where string, tok int, extra ...string) string {
	conds := append([]string{where, fmt.Sprintf("%s %s $%d", g.col(), g.op(), tok)}, g.gates(tok)...)
	return and(append(conds, extra...)...)
}

// gates are the conditions that hold the write back: the lease check, and
// the all-or-nothing token check.
func (g *guard) gates(tok int) []string {
	var conds []string
	if g.leased {
		conds = append(conds, leaseGate)
	}
	return append(conds, fmt.Sprintf(gateSQL, g.op(), tok))
}

// and joins conditions into a WHERE clause continued on new lines.
func and(conds ...string) string { return strings.Join(conds, "\n    AND ") }

// result renders the statement's final SELECT.
func (g *guard) result() string {
	if g.leased {
		return fmt.Sprintf(resultSQL, leaseGate)
	}
	return fmt.Sprintf(resultSQL, "true")
}

// outcome is the result row of a guarded statement.
type outcome struct {
	written, matched, nulls int64
	current                 *int64
	leaseHeld               bool
}

// run validates the token, sends the statement and scans its result row.
func (g *guard) run(ctx context.Context, db pgfence.DB, sql string, token int64, args []any) (outcome, error) {
	var o outcome
	if token <= 0 {
		return o, fmt.Errorf("fence: fencing token %d is not positive; tokens come from pgfence_next_token()", token)
	}
	if db == nil {
		return o, errors.New("fence: nil DB")
	}
	all := make([]any, 0, len(args)+2)
	all = append(all, args...)
	all = append(all, token)
	if g.leased {
		all = append(all, g.lease)
	}
	err := db.QueryRow(ctx, sql, all...).Scan(&o.written, &o.matched, &o.current, &o.nulls, &o.leaseHeld)
	if err != nil {
		var stale *StaleTokenError
		if errors.As(Classify(err), &stale) {
			stale.Table = g.tableName()
			return o, stale
		}
		return o, fmt.Errorf("fence: guarded write to %s: %w", g.tableName(), err)
	}
	return o, nil
}

// classify turns an outcome into the builders' errors. noRows says whether
// matching no row is an error (UPDATE, DELETE) or not (an upsert inserts).
func (g *guard) classify(o outcome, token int64, noRows bool) error {
	switch {
	case g.leased && !o.leaseHeld:
		return &LeaseLostError{Lease: g.lease, Presented: token}
	case o.nulls > 0:
		return fmt.Errorf("fence: %d matched row(s) of %s have a NULL %s column; nothing was written "+
			"(make the column NOT NULL DEFAULT 0)", o.nulls, g.tableName(), g.col())
	case o.written > 0:
		return nil
	case o.matched == 0 && noRows:
		return fmt.Errorf("fence: no row of %s matches the WHERE: %w", g.tableName(), pgx.ErrNoRows)
	}
	cur := int64(0)
	if o.current != nil {
		cur = *o.current
	}
	if o.matched > 0 && !g.stale(cur, token) {
		// Every matched row passed the token check yet none was written:
		// only a WHERE that answers differently when evaluated twice (a
		// volatile function) gets here.
		return fmt.Errorf("fence: %d row(s) of %s matched but none was written; "+
			"is the WHERE deterministic?", o.matched, g.tableName())
	}
	return &StaleTokenError{Table: g.tableName(), Presented: token, Current: cur}
}

// stale reports whether a row token rejects the presented token.
func (g *guard) stale(row, token int64) bool {
	if g.strict {
		return row >= token
	}
	return row > token
}

// tag builds the command tag of a successful guarded write.
func tag(verb string, n int64) pgconn.CommandTag {
	return pgconn.NewCommandTag(fmt.Sprintf("%s %d", verb, n))
}
