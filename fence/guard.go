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
	secret pgfence.Secret
	leased bool
	// schema is the schema pgfence is installed in, where UnderLease
	// finds pgfence_lease_held.
	schema string
	// returning is the caller's RETURNING list, without the keyword;
	// empty when none.
	returning string
	// kind is the statement's kind as [pgfence.Op] reports it: "update",
	// "delete", "upsert" or "claim".
	kind string
	// obs receives StaleWrite events and, when it implements
	// pgfence.OpObserver, brackets each Exec, Query and QueryRow; nil
	// when none is attached (the cost is then a nil check).
	obs pgfence.Observer
	// testAfterFast, when set (tests only), runs after the fast statement
	// wrote nothing and before the full one is sent; testNoRerun turns off
	// the rerun of an upsert that lost a race (the negative control).
	testAfterFast func()
	testNoRerun   bool
	// cache holds the rendered statements by number of arguments, whether
	// the lease is checked (the lease name is a parameter, so copies made
	// by UnderLease share it) and form. Every other method that changes
	// the statement gives the copy a fresh cache.
	cache *sync.Map
}

// form is which of a builder's statements is rendered.
type form uint8

const (
	// formFull is the statement that tells every outcome apart in one
	// round trip (what SQL returns): it writes, and when it wrote nothing
	// it reads the matched rows' tokens; several matched rows are locked
	// before the write.
	formFull form = 0
	// formFast is the write alone, guarded, for at most one matched row:
	// what Exec sends first. It costs what the hand-written guarded
	// statement costs; when it writes nothing, Exec sends formFull.
	formFast form = 1 << iota
	// formReturning adds the caller's RETURNING list.
	formReturning
)

// sqlKey is a cache key: the SQL depends on nothing else once the builder's
// fields are fixed.
type sqlKey struct {
	nargs  int
	leased bool
	form   form
}

// fresh gives g an empty cache; builder methods call it on their copy.
func (g *guard) fresh() { g.cache = new(sync.Map) }

// setColumn, setStrict, setLease and setSchema are the builders' Column,
// Strict, UnderLease and LeaseSchema, applied to the builder's copy.
// setLease keeps the cache: the lease name is a parameter and the cache key
// says whether it is checked.
func (g *guard) setColumn(name string) { g.column = name; g.fresh() }
func (g *guard) setStrict()            { g.strict = true; g.fresh() }
func (g *guard) setLease(name string, secret pgfence.Secret) {
	g.lease, g.secret, g.leased = name, secret, true
}
func (g *guard) setSchema(name string) { g.schema = name; g.fresh() }

// setReturning is the builders' Returning; setObserver their Observer,
// which does not change the SQL.
func (g *guard) setReturning(list string)         { g.returning = list; g.fresh() }
func (g *guard) setObserver(obs pgfence.Observer) { g.obs = obs }

// cached returns build(nargs), the full statement without RETURNING,
// rendered once per statement value and argument count. Errors are not
// cached.
func (g *guard) cached(nargs int, build func(int) (string, error)) (string, error) {
	return g.cachedForm(nargs, formFull, func(n int, _ form) (string, error) { return build(n) })
}

// cachedForm returns render(nargs, f), rendered once per statement value,
// argument count and form. Errors are not cached.
func (g *guard) cachedForm(nargs int, f form, render func(int, form) (string, error)) (string, error) {
	if g.cache == nil {
		return render(nargs, f)
	}
	k := sqlKey{nargs, g.leased, f}
	if v, ok := g.cache.Load(k); ok {
		return v.(string), nil
	}
	sql, err := render(nargs, f)
	if err == nil {
		g.cache.Store(k, sql)
	}
	return sql, err
}

func newGuard(table pgx.Identifier, err error, kind string) guard {
	if err == nil {
		err = checkIdent(table)
	}
	return guard{table: table, err: err, column: DefaultColumn, schema: defaultSchema, kind: kind, cache: new(sync.Map)}
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
		if g.secret.IsZero() {
			return fmt.Errorf("fence: UnderLease(%q) with the zero Secret; pass the lease's Secret", g.lease)
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

// leaseCTE requires the lease row to be held with the presented token and
// secret on the database clock: pgfence_lease_held checks fence = token, the
// secret's SHA-256 and expires_at >
// clock_timestamp() and locks the row FOR SHARE until the transaction ends,
// so a takeover or release (an UPDATE of the row) in flight makes the
// statement wait and then see the new row, and one that starts later waits
// for this transaction. The function runs as pgfence's owner (SECURITY
// DEFINER), so the writer needs only EXECUTE on it, not the UPDATE privilege
// on pgfence_leases that FOR SHARE takes. The CTE runs once: it is volatile.
const leaseCTE = `pgfence_lease AS (
    SELECT WHERE %[3]s($%[2]d::pg_catalog.text, $%[1]d::pg_catalog.int8, $%[4]d::pg_catalog.text)
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
		fmt.Fprintf(&b, leaseCTE, tok, tok+1, g.leaseFunc(), tok+2)
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

// tail renders the final SELECT, which follows the write CTE. With the
// caller's RETURNING list (form formReturning) the outcome row is joined
// with the rows the write returned: one row per written row, each carrying
// the outcome, or the outcome alone when nothing was written.
func (g *guard) tail(match string, f form) string {
	lease := "true"
	if g.leased {
		lease = leaseGate
	}
	result := fmt.Sprintf(resultSQL, lease, fmt.Sprintf(currentSQL, g.col(), g.tableName(), match, g.leaseCond()))
	if f&formReturning == 0 {
		return result
	}
	return "\nSELECT pgfence_outcome.*, pgfence_write.* FROM (" + result + "\n) AS pgfence_outcome LEFT JOIN pgfence_write ON true"
}

// outcomeColumns is the number of columns of the outcome row.
const outcomeColumns = 5

// cteReturning is the write CTE's RETURNING list: the caller's, or 1.
func (g *guard) cteReturning(f form) string {
	if f&formReturning != 0 {
		return g.returning
	}
	return "1"
}

// fastReturning is the fast statement's RETURNING clause, or nothing.
func (g *guard) fastReturning(f form) string {
	if f&formReturning != 0 {
		return "\nRETURNING " + g.returning
	}
	return ""
}

// fastLease is the lease check of the fast statements: an uncorrelated
// subquery, so it runs once, before the write scans a row.
func (g *guard) fastLease(tok int) string {
	return fmt.Sprintf("(SELECT %s($%d::pg_catalog.text, $%d::pg_catalog.int8, $%d::pg_catalog.text))", g.leaseFunc(), tok+1, tok, tok+2)
}

// singleRowSQL holds the fast statement back (it writes nothing) when its
// snapshot shows more than one row matching the caller's condition; the
// full statement then locks them all before writing. It is uncorrelated: a
// one-time filter evaluated before the write scans a row.
const singleRowSQL = `NOT EXISTS (SELECT FROM %s WHERE %s OFFSET 1)`

// fastWhere is the fast UPDATE's and DELETE's WHERE: the caller's
// condition, the guard predicate, the lease check, the single-row gate and
// the setting of pgfence.token.
func (g *guard) fastWhere(where string, tok int) string {
	conds := []string{where, fmt.Sprintf("%s %s $%d", g.col(), g.op(), tok)}
	if g.leased {
		conds = append(conds, g.fastLease(tok))
	}
	conds = append(conds, fmt.Sprintf(singleRowSQL, g.tableName(), where), fmt.Sprintf(setTokenSQL, tok))
	return and(conds...)
}

// checkReturning validates the RETURNING list: a fragment like the others,
// without placeholders (its forms with and without it take the same
// arguments).
func (g *guard) checkReturning() error {
	if g.returning == "" {
		return nil
	}
	used := map[int]struct{}{}
	h, err := scanParams(g.returning, used)
	if err != nil {
		return fmt.Errorf("fence: Returning fragment %q: %w", g.returning, err)
	}
	if h > 0 {
		return fmt.Errorf("fence: Returning fragment %q uses a placeholder; it may not", g.returning)
	}
	return nil
}

// outcome is the result row of a guarded statement.
type outcome struct {
	written, matched, nulls int64
	current                 *int64
	leaseHeld               bool
}

// renderer renders a builder's statement for nargs arguments in a form.
type renderer func(nargs int, f form) (string, error)

// upsertRetries bounds how often an upsert that lost a race with a
// concurrent insert (the conflicting row is not in its snapshot) is run
// again to read the row's true token.
const upsertRetries = 2

// opInfo describes the statement to an OpObserver.
func (g *guard) opInfo() pgfence.Op {
	op := pgfence.Op{Kind: pgfence.OpFencedWrite, Strategy: pgfence.StrategyFence, Batch: 1,
		Table: g.tableName(), Statement: g.kind}
	if g.leased {
		op.Name = g.lease
	}
	return op
}

// startOp calls the Observer's StartOp, when it has one.
func (g *guard) startOp(ctx context.Context) (context.Context, pgfence.OpObserver) {
	ops, _ := g.obs.(pgfence.OpObserver)
	if ops != nil {
		ctx = ops.StartOp(ctx, g.opInfo())
	}
	return ctx, ops
}

// endOp reports a stale or tokenless write to the Observer, then ends the
// operation.
func (g *guard) endOp(ctx context.Context, ops pgfence.OpObserver, err error) {
	var stale *StaleTokenError
	var none *NoTokenError
	if errors.As(err, &stale) {
		g.obs.Observe(ctx, pgfence.StaleWrite{Table: stale.Table, Presented: stale.Presented, Current: stale.Current})
	} else if errors.As(err, &none) {
		g.obs.Observe(ctx, pgfence.NoTokenWrite{Table: none.Table, Current: none.Current})
	}
	if ops != nil {
		ops.EndOp(ctx, g.opInfo(), err)
	}
}

// exec is the builders' Exec: it sends the fast statement and, only when
// that wrote nothing, the full one, and turns the outcome into the tag or
// an error. noRows is as for classify; verb names the tag.
func (g *guard) exec(ctx context.Context, db pgfence.DB, render renderer, token int64, args []any, noRows bool, verb string) (pgconn.CommandTag, error) {
	if g.obs == nil {
		return g.execOnce(ctx, db, render, token, args, noRows, verb)
	}
	ctx, ops := g.startOp(ctx)
	t, err := g.execOnce(ctx, db, render, token, args, noRows, verb)
	g.endOp(ctx, ops, err)
	return t, err
}

func (g *guard) execOnce(ctx context.Context, db pgfence.DB, render renderer, token int64, args []any, noRows bool, verb string) (pgconn.CommandTag, error) {
	fast, err := g.cachedForm(len(args), formFast, render)
	if err != nil {
		return pgconn.CommandTag{}, err
	}
	all, err := g.bind(db, token, args)
	if err != nil {
		return pgconn.CommandTag{}, err
	}
	t, err := db.Exec(ctx, fast, all...)
	if err != nil {
		return pgconn.CommandTag{}, g.wrap(err)
	}
	if t.RowsAffected() > 0 {
		return t, nil
	}
	full, err := g.cachedForm(len(args), formFull, render)
	if err != nil {
		return pgconn.CommandTag{}, err
	}
	if g.testAfterFast != nil {
		g.testAfterFast()
	}
	for attempt := 0; ; attempt++ {
		o, err := g.run(ctx, db, full, all)
		if err != nil {
			return pgconn.CommandTag{}, err
		}
		if g.lostRace(o) && attempt < upsertRetries {
			continue
		}
		if err := g.classify(o, token, noRows); err != nil {
			return pgconn.CommandTag{}, err
		}
		return tag(verb, o.written), nil
	}
}

// query is the builders' Query: exec's path with the caller's RETURNING
// list, returning the rows written.
func (g *guard) query(ctx context.Context, db pgfence.DB, render renderer, token int64, args []any, noRows bool, verb string) (pgx.Rows, error) {
	if g.obs == nil {
		return g.queryOnce(ctx, db, render, token, args, noRows, verb)
	}
	ctx, ops := g.startOp(ctx)
	rows, err := g.queryOnce(ctx, db, render, token, args, noRows, verb)
	if err != nil {
		g.endOp(ctx, ops, err)
		return nil, err
	}
	r := rows.(*resultRows)
	r.onClose = func(err error) { g.endOp(ctx, ops, err) }
	return r, nil
}

func (g *guard) queryOnce(ctx context.Context, db pgfence.DB, render renderer, token int64, args []any, noRows bool, verb string) (pgx.Rows, error) {
	if g.returning == "" {
		return nil, fmt.Errorf("fence: Query on %s needs a Returning list", g.tableName())
	}
	fast, err := g.cachedForm(len(args), formFast|formReturning, render)
	if err != nil {
		return nil, err
	}
	all, err := g.bind(db, token, args)
	if err != nil {
		return nil, err
	}
	rows, err := db.Query(ctx, fast, all...)
	if err != nil {
		return nil, g.wrap(err)
	}
	if rows.Next() {
		return &resultRows{Rows: rows, g: g, pending: true}, nil
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, g.wrap(err)
	}
	full, err := g.cachedForm(len(args), formFull|formReturning, render)
	if err != nil {
		return nil, err
	}
	if g.testAfterFast != nil {
		g.testAfterFast()
	}
	for attempt := 0; ; attempt++ {
		rows, err := db.Query(ctx, full, all...)
		if err != nil {
			return nil, g.wrap(err)
		}
		var o outcome
		if !rows.Next() {
			rows.Close()
			err := rows.Err()
			if err == nil {
				err = errors.New("the statement returned no outcome row")
			}
			return nil, g.wrap(err)
		}
		dest := make([]any, len(rows.FieldDescriptions()))
		if len(dest) < outcomeColumns {
			rows.Close()
			return nil, g.wrap(fmt.Errorf("the statement returned %d columns", len(dest)))
		}
		dest[0], dest[1], dest[2], dest[3], dest[4] = &o.written, &o.matched, &o.current, &o.nulls, &o.leaseHeld
		if err := rows.Scan(dest...); err != nil {
			rows.Close()
			return nil, g.wrap(err)
		}
		if o.written > 0 && o.nulls == 0 && (!g.leased || o.leaseHeld) {
			return &resultRows{Rows: rows, g: g, pending: true, skip: outcomeColumns, tag: tag(verb, o.written), hasTag: true}, nil
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return nil, g.wrap(err)
		}
		if g.lostRace(o) && attempt < upsertRetries {
			continue
		}
		if err := g.classify(o, token, noRows); err != nil {
			return nil, err
		}
		return nil, g.wrap(errors.New("the statement wrote rows but returned none"))
	}
}

// lostRace reports an upsert that wrote nothing and found no row in its
// snapshot: its ON CONFLICT met a row inserted concurrently, after the
// snapshot, whose token rejected the write. Run again, the statement sees
// the row and reads its token.
func (g *guard) lostRace(o outcome) bool {
	return g.kind == kindUpsert && !g.testNoRerun && o.written == 0 && o.matched == 0 && o.nulls == 0 && (!g.leased || o.leaseHeld)
}

// bind validates the token and db and returns the statement's arguments:
// the caller's, the token, and the lease name and secret with UnderLease.
func (g *guard) bind(db pgfence.DB, token int64, args []any) ([]any, error) {
	if token <= 0 {
		return nil, fmt.Errorf("fence: fencing token %d is not positive; tokens come from pgfence_next_token()", token)
	}
	if db == nil {
		return nil, errors.New("fence: nil DB")
	}
	all := make([]any, 0, len(args)+3)
	all = append(all, args...)
	all = append(all, token)
	if g.leased {
		all = append(all, g.lease, g.secret.Reveal())
	}
	return all, nil
}

// run sends the full statement and scans its result row.
func (g *guard) run(ctx context.Context, db pgfence.DB, sql string, all []any) (outcome, error) {
	var o outcome
	err := db.QueryRow(ctx, sql, all...).Scan(&o.written, &o.matched, &o.current, &o.nulls, &o.leaseHeld)
	if err != nil {
		return o, g.wrap(err)
	}
	return o, nil
}

// wrap maps a database error: a trigger's rejection becomes a
// *StaleTokenError or *NoTokenError naming the table, anything else is
// wrapped.
func (g *guard) wrap(err error) error {
	err = Classify(err)
	var stale *StaleTokenError
	if errors.As(err, &stale) {
		stale.Table = g.tableName()
		return stale
	}
	var none *NoTokenError
	if errors.As(err, &none) {
		none.Table = g.tableName()
		return none
	}
	return fmt.Errorf("fence: guarded write to %s: %w", g.tableName(), err)
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

// The statement kinds, as pgfence.Op reports them.
const (
	kindUpdate = "update"
	kindDelete = "delete"
	kindUpsert = "upsert"
	kindClaim  = "claim"
)

// resultRows are the rows a guarded Query returns: the database's rows,
// the first one already read (to tell an empty result, which sends the
// full statement, from a write), and, from the full statement, with the
// outcome's columns in front, which it hides.
type resultRows struct {
	pgx.Rows
	g       *guard
	pending bool // Next has been called on Rows once, and not by the caller
	skip    int  // leading outcome columns to hide
	tag     pgconn.CommandTag
	hasTag  bool
	onClose func(error)
	closed  bool
}

// Next advances to the next row.
func (r *resultRows) Next() bool {
	if r.pending {
		r.pending = false
		return true
	}
	if r.Rows.Next() {
		return true
	}
	r.Close()
	return false
}

// Scan reads the current row's columns of the RETURNING list.
func (r *resultRows) Scan(dest ...any) error {
	if r.skip == 0 {
		return r.Rows.Scan(dest...)
	}
	all := make([]any, r.skip, r.skip+len(dest))
	return r.Rows.Scan(append(all, dest...)...)
}

// Values returns the current row's values of the RETURNING list.
func (r *resultRows) Values() ([]any, error) {
	v, err := r.Rows.Values()
	if err != nil || len(v) < r.skip {
		return v, err
	}
	return v[r.skip:], nil
}

// RawValues returns the current row's raw values of the RETURNING list.
func (r *resultRows) RawValues() [][]byte {
	v := r.Rows.RawValues()
	if len(v) < r.skip {
		return v
	}
	return v[r.skip:]
}

// FieldDescriptions describes the columns of the RETURNING list.
func (r *resultRows) FieldDescriptions() []pgconn.FieldDescription {
	f := r.Rows.FieldDescriptions()
	if len(f) < r.skip {
		return f
	}
	return f[r.skip:]
}

// CommandTag is the write's tag once the rows are closed.
func (r *resultRows) CommandTag() pgconn.CommandTag {
	if r.hasTag {
		return r.tag
	}
	return r.Rows.CommandTag()
}

// Err is the error that ended the rows, mapped as Exec maps errors.
func (r *resultRows) Err() error {
	if err := r.Rows.Err(); err != nil {
		return r.g.wrap(err)
	}
	return nil
}

// Close closes the rows; it ends the operation for an OpObserver.
func (r *resultRows) Close() {
	r.Rows.Close()
	if r.closed {
		return
	}
	r.closed = true
	if r.onClose != nil {
		r.onClose(r.Err())
	}
}

// resultRow is what QueryRow returns: Scan reads the first row written, or
// returns the write's error.
type resultRow struct {
	rows pgx.Rows
	err  error
}

// Scan scans the first row and closes the rows.
func (r resultRow) Scan(dest ...any) error {
	if r.err != nil {
		return r.err
	}
	defer r.rows.Close()
	if !r.rows.Next() {
		if err := r.rows.Err(); err != nil {
			return err
		}
		return pgx.ErrNoRows
	}
	if err := r.rows.Scan(dest...); err != nil {
		return err
	}
	r.rows.Close()
	return r.rows.Err()
}
