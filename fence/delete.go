package fence

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgfence/pgfence"
)

// DeleteStmt is a guarded DELETE, built with [Delete] or [DeleteIdent]. Its
// methods return a modified copy, so a statement can be built once and
// reused. The zero value is not usable.
type DeleteStmt struct {
	g     guard
	where string
}

// Delete starts a guarded DELETE from table, given as "table" or
// "schema.table", as for [Update].
func Delete(table string) *DeleteStmt {
	id, err := parseTable(table)
	return &DeleteStmt{g: newGuard(id, err, kindDelete)}
}

// DeleteIdent starts a guarded DELETE from the table named by an identifier
// of one part (table) or two (schema, table), taken literally.
func DeleteIdent(table pgx.Identifier) *DeleteStmt {
	return &DeleteStmt{g: newGuard(table, nil, kindDelete)}
}

// Where sets the caller's condition choosing the rows, as for
// [UpdateStmt.Where]. It is required.
func (s *DeleteStmt) Where(frag string) *DeleteStmt { c := *s; c.where = frag; c.g.fresh(); return &c }

// Column sets the guard column; the default is [DefaultColumn].
func (s *DeleteStmt) Column(name string) *DeleteStmt { c := *s; c.g.setColumn(name); return &c }

// Strict makes the guard a strict comparison, column < token.
func (s *DeleteStmt) Strict() *DeleteStmt { c := *s; c.g.setStrict(); return &c }

// UnderLease makes the delete also require that the lease name is held
// with the token and secret, as for [UpdateStmt.UnderLease].
func (s *DeleteStmt) UnderLease(name string, secret pgfence.Secret) *DeleteStmt {
	c := *s
	c.g.setLease(name, secret)
	return &c
}

// LeaseSchema sets the schema pgfence is installed in, as for
// [UpdateStmt.LeaseSchema].
func (s *DeleteStmt) LeaseSchema(name string) *DeleteStmt { c := *s; c.g.setSchema(name); return &c }

// Returning sets the caller's RETURNING list, as for
// [UpdateStmt.Returning]: Query and QueryRow return the rows deleted.
func (s *DeleteStmt) Returning(list string) *DeleteStmt { c := *s; c.g.setReturning(list); return &c }

// Observer attaches obs to the statement, as for [UpdateStmt.Observer].
func (s *DeleteStmt) Observer(obs pgfence.Observer) *DeleteStmt {
	c := *s
	c.g.setObserver(obs)
	return &c
}

// SQL returns the statement that tells every outcome apart in one round
// trip, as for [UpdateStmt.SQL].
func (s *DeleteStmt) SQL(nargs int) (string, error) {
	return s.g.cached(nargs, s.build)
}

// build renders the full statement, as SQL returns it.
func (s *DeleteStmt) build(nargs int) (string, error) { return s.render(nargs, formFull) }

// render renders the statement in form f.
func (s *DeleteStmt) render(nargs int, f form) (string, error) {
	if err := s.g.check(); err != nil {
		return "", err
	}
	if s.where == "" {
		return "", fmt.Errorf("fence: Delete(%s) has no Where fragment; Where(\"true\") guards every row", s.g.tableName())
	}
	if err := checkParams(nargs, fragment{"Where", s.where}); err != nil {
		return "", err
	}
	if err := s.g.checkReturning(); err != nil {
		return "", err
	}
	tok := nargs + 1
	where := "(" + s.where + ")"
	if f&formFast != 0 {
		return fmt.Sprintf(deleteFast, s.g.tableName(), s.g.fastWhere(where, tok)) + s.g.fastReturning(f), nil
	}
	return s.g.with(where, tok, true) + fmt.Sprintf(deleteCTE,
		s.g.tableName(), s.g.writeWhere(where, tok), s.g.cteReturning(f)) + s.g.tail(where, f), nil
}

// deleteCTE deletes the rows, only if the gates pass, and only rows whose
// token the presented one does not make stale. It also sets pgfence.token
// for the rest of the transaction, so the pgfence_guard trigger checks each
// row against the token too.
const deleteCTE = `pgfence_write AS (
    DELETE FROM %[1]s
    WHERE %[2]s
    RETURNING %[3]s
)`

// deleteFast is the guarded DELETE alone, as updateFast is the UPDATE.
const deleteFast = `DELETE FROM %[1]s
WHERE %[2]s`

// Exec runs the guarded DELETE on db with the caller's args and the fencing
// token, in one round trip on success: the rows the Where matches are deleted only if
// none of them carries a newer token. Results and errors are as for
// [UpdateStmt.Exec], with a "DELETE n" tag. As a side effect, the
// transaction's pgfence.token setting is set to token (see the package
// documentation on the trigger).
func (s *DeleteStmt) Exec(ctx context.Context, db pgfence.DB, token int64, args ...any) (pgconn.CommandTag, error) {
	return s.g.exec(ctx, db, s.render, token, args, true, "DELETE")
}

// Query runs the guarded DELETE as Exec does and returns the rows deleted,
// with the columns of the Returning list, as for [UpdateStmt.Query].
func (s *DeleteStmt) Query(ctx context.Context, db pgfence.DB, token int64, args ...any) (pgx.Rows, error) {
	return s.g.query(ctx, db, s.render, token, args, true, "DELETE")
}

// QueryRow runs Query and returns a pgx.Row whose Scan reads the first row
// deleted, or returns Query's error.
func (s *DeleteStmt) QueryRow(ctx context.Context, db pgfence.DB, token int64, args ...any) pgx.Row {
	rows, err := s.Query(ctx, db, token, args...)
	return resultRow{rows: rows, err: err}
}
