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

// seenCTE counts, in the statement's snapshot, whether the caller's WHERE
// matches more than one row (it stops at the second). The write considers
// exactly these rows (a row the snapshot does not match is never written,
// whatever a concurrent transaction does to it), so when at most one
// matches, the write is all or nothing by itself and nothing needs locking
// before it.
const seenCTE = `pgfence_seen AS (
    SELECT count(*) > 1 AS pgfence_several
    FROM (SELECT FROM %[1]s WHERE %[2]s LIMIT 2) AS pgfence_rows
), `

// lockedCTE runs only when several rows match: it locks, FOR UPDATE, every
// row the caller's WHERE matches and reads its guard token before anything
// is written, so the write can be all or nothing. Under READ COMMITTED a row
// being written concurrently is waited for and then re-read in its newest
// committed version (and dropped if it no longer matches), so the tokens
// are the current ones, and they cannot change before this transaction ends.
const lockedCTE = `pgfence_locked AS (
    SELECT %[1]s AS pgfence_token FROM %[2]s
    WHERE %[3]s
    AND (SELECT pgfence_several FROM pgfence_seen)%[4]s
    FOR UPDATE
), `

// currentCTE runs only when nothing was written and the rows were not
// locked before the write (one row or none matched): it locks the matched
// rows FOR UPDATE and reads their guard token. Under READ COMMITTED the lock
// follows a row's update chain to its newest committed version, waiting for
// a writer in flight, and drops the row if that version no longer matches
// (or was deleted): so it reports the token that rejected the write, or no
// row. Its condition on the write's count is uncorrelated, a one-time
// filter evaluated after the write and before a single row is read: a
// successful write reads and locks nothing more than a plain UPDATE.
const currentCTE = `, pgfence_current AS (
    SELECT %[1]s AS pgfence_token FROM %[2]s
    WHERE %[3]s
    AND NOT EXISTS (SELECT FROM pgfence_write)%[4]s%[5]s
    FOR UPDATE
)`

// notSeveral skips currentCTE when lockedCTE has read the rows already.
const notSeveral = "\n    AND NOT (SELECT pgfence_several FROM pgfence_seen)"

// gateSQL lets the write proceed only if none of the rows lockedCTE locked
// carries a newer (or NULL) token: all or nothing. It is a one-time filter
// evaluated before the write scans a single row, so the write also waits
// until lockedCTE has locked every matching row. When lockedCTE did not run,
// it holds no row and the gate passes.
const gateSQL = `NOT EXISTS (SELECT FROM pgfence_locked WHERE (pgfence_token %[1]s $%[2]d) IS NOT TRUE)`

// leaseGate is the condition that the lease check passed.
const leaseGate = `EXISTS (SELECT FROM pgfence_lease)`

// resultSQL is the statement's single result row: rows written, rows read
// (by lockedCTE, or by currentCTE after a write that wrote nothing), their
// newest token, how many have a NULL token, and whether the lease check
// passed. After a successful single-row write it reads no row.
const resultSQL = `
SELECT (SELECT count(*) FROM pgfence_write), count(*), max(pgfence_token),
    count(*) FILTER (WHERE pgfence_token IS NULL), %s
FROM %s`

// with renders the WITH clause up to (not including) the write CTE. match
// is the row-matching condition. several says whether the where may match
// several rows (UPDATE, DELETE), so that seenCTE and lockedCTE are needed;
// an upsert's conflict target matches at most one.
func (g *guard) with(match string, tok int, several bool) string {
	var b strings.Builder
	b.WriteString("WITH ")
	if g.leased {
		fmt.Fprintf(&b, leaseCTE, tok, tok+1)
	}
	if several {
		fmt.Fprintf(&b, seenCTE, g.tableName(), match)
		fmt.Fprintf(&b, lockedCTE, g.col(), g.tableName(), match, g.leaseCond())
	}
	return b.String()
}

// leaseCond is the lease gate as an extra condition, or nothing.
func (g *guard) leaseCond() string {
	if g.leased {
		return "\n    AND " + leaseGate
	}
	return ""
}

// writeWhere is the write's WHERE: the caller's condition, the guard
// predicate (rechecked by PostgreSQL on the newest version of each row), the
// gates, and any extra conditions.
func (g *guard) writeWhere(where string, tok int, extra ...string) string {
	conds := append([]string{where, fmt.Sprintf("%s %s $%d", g.col(), g.op(), tok)}, g.gates(tok, true)...)
	return and(append(conds, extra...)...)
}

// gates are the conditions that hold the write back: the lease check, and,
// when several rows may match, the all-or-nothing token check.
func (g *guard) gates(tok int, several bool) []string {
	var conds []string
	if g.leased {
		conds = append(conds, leaseGate)
	}
	if several {
		conds = append(conds, fmt.Sprintf(gateSQL, g.op(), tok))
	}
	return conds
}

// and joins conditions into a WHERE clause continued on new lines.
func and(conds ...string) string { return strings.Join(conds, "\n    AND ") }

// tail renders what follows the write CTE: currentCTE and the final SELECT.
func (g *guard) tail(match string, several bool) string {
	skip, from := "", "pgfence_current"
	if several {
		skip, from = notSeveral, "(TABLE pgfence_locked UNION ALL TABLE pgfence_current) AS pgfence_read"
	}
	lease := "true"
	if g.leased {
		lease = leaseGate
	}
	return fmt.Sprintf(currentCTE, g.col(), g.tableName(), match, g.leaseCond(), skip) +
		fmt.Sprintf(resultSQL, lease, from)
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
