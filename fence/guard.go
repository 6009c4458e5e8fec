package fence

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"

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
	// schema is the schema pgfence is installed in, where UnderLease
	// finds pgfence_lease_held.
	schema string
	// cache holds the rendered statements by number of arguments and
	// whether the lease is checked (the lease name is a parameter, so
	// copies made by UnderLease share it). Every other method that changes
	// the statement gives the copy a fresh cache.
	cache *sync.Map
}

// sqlKey is a cache key: the SQL depends on nothing else once the builder's
// fields are fixed.
type sqlKey struct {
	nargs  int
	leased bool
}

// fresh gives g an empty cache; builder methods call it on their copy.
func (g *guard) fresh() { g.cache = new(sync.Map) }

// setColumn, setStrict, setLease and setSchema are the builders' Column,
// Strict, UnderLease and LeaseSchema, applied to the builder's copy.
// setLease keeps the cache: the lease name is a parameter and the cache key
// says whether it is checked.
func (g *guard) setColumn(name string) { g.column = name; g.fresh() }
func (g *guard) setStrict()            { g.strict = true; g.fresh() }
func (g *guard) setLease(name string)  { g.lease, g.leased = name, true }
func (g *guard) setSchema(name string) { g.schema = name; g.fresh() }

// cached returns build(nargs), rendered once per statement value and
// argument count. Errors are not cached.
func (g *guard) cached(nargs int, build func(int) (string, error)) (string, error) {
	if g.cache == nil {
		return build(nargs)
	}
	k := sqlKey{nargs, g.leased}
	if v, ok := g.cache.Load(k); ok {
		return v.(string), nil
	}
	sql, err := build(nargs)
	if err == nil {
		g.cache.Store(k, sql)
	}
	return sql, err
}

func newGuard(table pgx.Identifier, err error) guard {
	if err == nil {
		err = checkIdent(table)
	}
	return guard{table: table, err: err, column: DefaultColumn, schema: defaultSchema, cache: new(sync.Map)}
}

// defaultSchema is the schema the builders expect pgfence to be installed
// in unless told otherwise with LeaseSchema.
const defaultSchema = pgfence.DefaultSchema

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
	if err := checkName("lease schema", g.schema); err != nil {
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
// once per token. It is pg_catalog's operator whatever the caller's
// search_path.
func (g *guard) op() string {
	if g.strict {
		return "OPERATOR(pg_catalog.<)"
	}
	return "OPERATOR(pg_catalog.<=)"
}

// leaseCTE requires the lease row to be held with the presented token on the
// database clock: pgfence_lease_held checks fence = token and expires_at >
// clock_timestamp() and locks the row FOR SHARE until the transaction ends,
// so a takeover or release (an UPDATE of the row) in flight makes the
// statement wait and then see the new row, and one that starts later waits
// for this transaction. The function runs as pgfence's owner (SECURITY
// DEFINER), so the writer needs only EXECUTE on it, not the UPDATE privilege
// on pgfence_leases that FOR SHARE takes. The CTE runs once: it is volatile.
const leaseCTE = `pgfence_lease AS (
    SELECT WHERE %[3]s($%[2]d::pg_catalog.text, $%[1]d::pg_catalog.int8)
), `

// leaseFunc is the qualified name of pgfence_lease_held.
func (g *guard) leaseFunc() string {
	return pgx.Identifier{g.schema, "pgfence_lease_held"}.Sanitize()
}

// lockedCTE runs only when the caller's WHERE matches several rows in the
// statement's snapshot (the count stops at the second): it locks, FOR
// UPDATE, every matching row and reads its guard token before anything is
// written, so the write can be all or nothing. Under READ COMMITTED a row
// being written concurrently is waited for and then re-read in its newest
// committed version (and dropped if it no longer matches), so the tokens
// are the current ones, and they cannot change before this transaction ends.
// The write considers exactly the rows the snapshot matches (a row it does
// not match is never written, whatever a concurrent transaction does to
// it), so when at most one matches, the write is all or nothing by itself
// and nothing is locked before it.
const lockedCTE = `pgfence_locked AS (
    SELECT %[1]s AS pgfence_token FROM %[2]s
    WHERE %[3]s
    AND (SELECT pg_catalog.count(*) OPERATOR(pg_catalog.>) 1 FROM (SELECT FROM %[2]s WHERE %[3]s LIMIT 2) AS pgfence_rows)%[4]s
    FOR UPDATE
), `

// currentSQL reads the rows for the result, only when nothing was written:
// it locks the matched rows FOR UPDATE and reads their guard token. Under
// READ COMMITTED the lock follows a row's update chain to its newest
// committed version, waiting for a writer in flight, and drops the row if
// that version no longer matches (or was deleted): so it reports the token
// that rejected the write, or no row. Its condition on the write is
// uncorrelated, a one-time filter evaluated after the write and before a
// single row is read: a successful write reads and locks nothing more.
const currentSQL = `(
    SELECT %[1]s AS pgfence_token FROM %[2]s
    WHERE %[3]s
    AND NOT EXISTS (SELECT FROM pgfence_write)%[4]s
    FOR UPDATE
) AS pgfence_current`

// gateSQL lets the write proceed only if none of the rows lockedCTE locked
// carries a newer (or NULL) token: all or nothing. It is a one-time filter
// evaluated before the write scans a single row, so the write also waits
// until lockedCTE has locked every matching row. When lockedCTE did not run,
// it holds no row and the gate passes.
const gateSQL = `NOT EXISTS (SELECT FROM pgfence_locked WHERE (pgfence_token %[1]s $%[2]d) IS NOT TRUE)`

// setTokenSQL sets pgfence.token to the token for the rest of the
// transaction. It is a condition of the write (always true), evaluated for
// each row before the row is written, so the pgfence_guard triggers see it:
// pgfence_guard checks deletes against it, pgfence_guard_strict every write.
const setTokenSQL = `pg_catalog.set_config('pgfence.token', $%d::pg_catalog.int8::pg_catalog.text, true) IS NOT NULL`

// leaseGate is the condition that the lease check passed.
const leaseGate = `EXISTS (SELECT FROM pgfence_lease)`

// resultSQL is the statement's single result row: rows written, rows read
// by currentSQL (none after a write that wrote a row), their newest token,
// how many have a NULL token, and whether the lease check passed.
const resultSQL = `
SELECT (SELECT pg_catalog.count(*) FROM pgfence_write), pg_catalog.count(*), pg_catalog.max(pgfence_token),
    pg_catalog.count(*) FILTER (WHERE pgfence_token IS NULL), %s
FROM %s`

// with renders the WITH clause up to (not including) the write CTE. match
// is the row-matching condition. several says whether it may match several
// rows (UPDATE, DELETE), which needs lockedCTE; an upsert's conflict target
// matches at most one.
func (g *guard) with(match string, tok int, several bool) string {
	var b strings.Builder
	b.WriteString("WITH ")
	if g.leased {
		fmt.Fprintf(&b, leaseCTE, tok, tok+1, g.leaseFunc())
	}
	if several {
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
// gates, and the setting of pgfence.token.
func (g *guard) writeWhere(where string, tok int) string {
	conds := append([]string{where, fmt.Sprintf("%s %s $%d", g.col(), g.op(), tok)}, g.gates(tok, true)...)
	return and(append(conds, fmt.Sprintf(setTokenSQL, tok))...)
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

// tail renders the final SELECT, which follows the write CTE.
func (g *guard) tail(match string) string {
	lease := "true"
	if g.leased {
		lease = leaseGate
	}
	return fmt.Sprintf(resultSQL, lease, fmt.Sprintf(currentSQL, g.col(), g.tableName(), match, g.leaseCond()))
}

// outcome is the result row of a guarded statement.
type outcome struct {
	written, matched, nulls int64
	current                 *int64
	leaseHeld               bool
}

// exec is the builders' Exec: it renders the statement for len(args)
// arguments (cached), runs it and turns the outcome into an error. noRows is
// as for classify.
func (g *guard) exec(ctx context.Context, db pgfence.DB, build func(int) (string, error), token int64, args []any, noRows bool) (outcome, error) {
	sql, err := g.cached(len(args), build)
	if err != nil {
		return outcome{}, err
	}
	o, err := g.run(ctx, db, sql, token, args)
	if err != nil {
		return o, err
	}
	return o, g.classify(o, token, noRows)
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
		err = Classify(err)
		var stale *StaleTokenError
		if errors.As(err, &stale) {
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
		// only a WHERE that answers differently when evaluated again (a
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
