package fence

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgfence/pgfence"
)

// UpdateStmt is a guarded UPDATE, built with [Update] or [UpdateIdent]. Its
// methods return a modified copy, so a statement can be built once and
// reused, concurrently too. The zero value is not usable.
type UpdateStmt struct {
	g     guard
	set   string
	where string
}

// Update starts a guarded UPDATE of table, given as "table" or
// "schema.table" (a dot always separates the schema). For a name that
// contains a dot or a double quote, use [UpdateIdent]. An invalid name is
// reported by SQL and Exec.
func Update(table string) *UpdateStmt {
	id, err := parseTable(table)
	return &UpdateStmt{g: newGuard(id, err, kindUpdate)}
}

// UpdateIdent starts a guarded UPDATE of the table named by an identifier
// of one part (table) or two (schema, table), taken literally.
func UpdateIdent(table pgx.Identifier) *UpdateStmt {
	return &UpdateStmt{g: newGuard(table, nil, kindUpdate)}
}

// Set sets the caller's SET list, without the SET keyword, for example
// "balance = balance + $1". It replaces an earlier Set. The guard column
// must not be assigned here: the statement sets it to the token.
func (s *UpdateStmt) Set(frag string) *UpdateStmt { c := *s; c.set = frag; c.g.fresh(); return &c }

// Where sets the caller's condition choosing the rows, without the WHERE
// keyword, for example "id = $2". It replaces an earlier Where. It is
// required; Where("true") guards every row of the table. It is evaluated
// more than once in the statement (see "One round trip, and what several
// rows mean" in the package documentation), so it should not call volatile
// functions.
func (s *UpdateStmt) Where(frag string) *UpdateStmt { c := *s; c.where = frag; c.g.fresh(); return &c }

// Column sets the guard column; the default is [DefaultColumn].
func (s *UpdateStmt) Column(name string) *UpdateStmt { c := *s; c.g.setColumn(name); return &c }

// Strict makes the guard a strict comparison, column < token, so each token
// writes a row at most once. The default, column <= token, lets one holder
// write the same row many times.
func (s *UpdateStmt) Strict() *UpdateStmt { c := *s; c.g.setStrict(); return &c }

// UnderLease makes the write also require, in the same statement, that the
// lease name is held with the token and secret (the lease's Secret), on
// the database clock, locking its row FOR SHARE until the transaction
// ends. A zero secret is an error from SQL and Exec. The check calls pgfence_lease_held in the schema set
// with LeaseSchema, so the writer needs EXECUTE on it (and USAGE on the
// schema). See "Lease-checked writes" in the package documentation.
func (s *UpdateStmt) UnderLease(name string, secret pgfence.Secret) *UpdateStmt {
	c := *s
	c.g.setLease(name, secret)
	return &c
}

// LeaseSchema sets the schema pgfence is installed in, where UnderLease
// calls pgfence_lease_held; the default is "pgfence". The name is quoted
// with pgx.Identifier; an invalid one is reported by SQL and Exec.
func (s *UpdateStmt) LeaseSchema(name string) *UpdateStmt { c := *s; c.g.setSchema(name); return &c }

// Returning sets the caller's RETURNING list, without the keyword, for
// example "balance, updated_at": the rows written are returned by Query
// and QueryRow. It replaces an earlier Returning. It may not use
// placeholders. Exec ignores it.
func (s *UpdateStmt) Returning(list string) *UpdateStmt { c := *s; c.g.setReturning(list); return &c }

// Observer attaches obs to the statement: a write rejected with a
// [*StaleTokenError] is reported to it as a [pgfence.StaleWrite] event, on
// the caller's goroutine and ctx, before Exec, Query or QueryRow return;
// and when obs also implements [pgfence.OpObserver], each call is
// bracketed by StartOp and EndOp with an [pgfence.Op] of Kind
// OpFencedWrite (see "Observing fenced writes" in the package
// documentation). nil detaches it. It does not change the SQL.
func (s *UpdateStmt) Observer(obs pgfence.Observer) *UpdateStmt {
	c := *s
	c.g.setObserver(obs)
	return &c
}

// SQL returns the statement that tells every outcome apart in one round
// trip, for a call with nargs arguments: the fragments use $1..$nargs, the
// token is $nargs+1 and, with UnderLease, the lease name $nargs+2 and its
// secret $nargs+3; it returns one row (rows written, rows matched, their newest token, how
// many have a NULL token, whether the lease check passed). Exec sends it
// only when a cheaper statement, the guarded UPDATE alone, wrote nothing
// (see "One round trip, and what several rows mean" in the package
// documentation). It reports invalid names, a missing Set or Where, and
// fragments whose placeholders are not exactly $1..$nargs.
func (s *UpdateStmt) SQL(nargs int) (string, error) {
	return s.g.cached(nargs, s.build)
}

// build renders the full statement, as SQL returns it.
func (s *UpdateStmt) build(nargs int) (string, error) { return s.render(nargs, formFull) }

// render renders the statement in form f.
func (s *UpdateStmt) render(nargs int, f form) (string, error) {
	if err := s.g.check(); err != nil {
		return "", err
	}
	name := "Update"
	if s.g.kind == kindClaim {
		name = "Claim"
	} else if s.set == "" {
		return "", fmt.Errorf("fence: Update(%s) has no Set fragment", s.g.tableName())
	}
	if s.where == "" {
		return "", fmt.Errorf("fence: %s(%s) has no Where fragment; Where(\"true\") guards every row", name, s.g.tableName())
	}
	frags := []fragment{{"Where", s.where}}
	if s.set != "" {
		frags = append([]fragment{{"Set", s.set}}, frags...)
	}
	if err := checkParams(nargs, frags...); err != nil {
		return "", err
	}
	if err := s.g.checkReturning(); err != nil {
		return "", err
	}
	tok := nargs + 1
	where := "(" + s.where + ")"
	set := fmt.Sprintf("%s = $%d", s.g.col(), tok)
	if s.set != "" {
		set = s.set + ", " + set
	}
	if f&formFast != 0 {
		return fmt.Sprintf(updateFast, s.g.tableName(), set, s.g.fastWhere(where, tok)) + s.g.fastReturning(f), nil
	}
	return s.g.with(where, tok, true) + fmt.Sprintf(updateCTE,
		s.g.tableName(), set, s.g.writeWhere(where, tok), s.g.cteReturning(f)) + s.g.tail(where, f), nil
}

// updateCTE writes the rows, only if the gates pass, and only rows whose
// token the presented one does not make stale (rechecked by PostgreSQL on
// the newest committed version of each row). Its WHERE also sets
// pgfence.token, for the pgfence_guard_strict trigger.
const updateCTE = `pgfence_write AS (
    UPDATE %[1]s SET %[2]s
    WHERE %[3]s
    RETURNING %[4]s
)`

// updateFast is the guarded UPDATE alone: it writes the row the caller's
// condition matches if its token is not newer, and nothing when its
// snapshot shows several matching rows (see singleRowSQL). It takes no row
// lock before writing and reads nothing after.
const updateFast = `UPDATE %[1]s SET %[2]s
WHERE %[3]s`

// Exec runs the guarded UPDATE on db (a pool, a connection or a pgx.Tx)
// with the caller's args ($1..$n) and the fencing token, in one round trip
// on success. The rows the Where matches are written, and their guard
// column set to token, only if none of them carries a newer token: all or
// nothing.
//
// On success the tag says how many rows were written. Otherwise nothing was
// written and the error is, checked in this order:
//
//   - a [*LeaseLostError] (errors.Is pgfence.ErrLeaseLost and
//     pgfence.ErrFenced) when UnderLease is set and the lease is not held
//     with token;
//   - a [*StaleTokenError] (errors.Is pgfence.ErrFenced) when a matched row
//     carries a newer token (or, with Strict, the same one), also when the
//     pgfence_guard trigger rejected the write;
//   - an error matching pgx.ErrNoRows when no row matches the Where;
//   - an error describing bad input (see SQL, and token <= 0), before
//     anything is sent, or the database's error, wrapped.
//
// A rejection by the builder's own predicate is not a database error: in a
// transaction, the transaction is still usable. A rejection raised by a
// pgfence_guard trigger is a database error, which aborts the transaction
// (see "How a rejection leaves the transaction" in the package
// documentation). ctx covers the statements: one on success, a second
// one only when the first wrote nothing.
func (s *UpdateStmt) Exec(ctx context.Context, db pgfence.DB, token int64, args ...any) (pgconn.CommandTag, error) {
	return s.g.exec(ctx, db, s.render, token, args, true, "UPDATE")
}

// Query runs the guarded UPDATE as Exec does and returns the rows written,
// with the columns of the Returning list, which it requires. The errors
// are Exec's, returned before any row: a returned pgx.Rows means the write
// succeeded. Close the rows (or read them to the end); the write's tag is
// then the rows' CommandTag.
func (s *UpdateStmt) Query(ctx context.Context, db pgfence.DB, token int64, args ...any) (pgx.Rows, error) {
	return s.g.query(ctx, db, s.render, token, args, true, "UPDATE")
}

// QueryRow runs Query and returns a pgx.Row whose Scan reads the first row
// written, or returns Query's error, like pgx's QueryRow.
func (s *UpdateStmt) QueryRow(ctx context.Context, db pgfence.DB, token int64, args ...any) pgx.Row {
	rows, err := s.Query(ctx, db, token, args...)
	return resultRow{rows: rows, err: err}
}
