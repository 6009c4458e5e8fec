package fence

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgfence/pgfence"
)

// DeleteStmt is a guarded DELETE; its methods return a modified copy.
type DeleteStmt struct {
	g     guard
	where string
}

// Delete starts a guarded DELETE from table, named as for [Update].
func Delete(table string) *DeleteStmt {
	id, err := parseTable(table)
	return &DeleteStmt{g: newGuard(id, err, kindDelete)}
}

// DeleteIdent is [Delete] for an identifier taken literally.
func DeleteIdent(table pgx.Identifier) *DeleteStmt {
	return &DeleteStmt{g: newGuard(table, nil, kindDelete)}
}

// Where sets the required condition, as for [UpdateStmt.Where].
func (s *DeleteStmt) Where(frag string) *DeleteStmt { c := *s; c.where = frag; c.g.fresh(); return &c }

// Column sets the guard column; the default is [DefaultColumn].
func (s *DeleteStmt) Column(name string) *DeleteStmt { c := *s; c.g.setColumn(name); return &c }

// Strict makes the guard a strict comparison, column < token.
func (s *DeleteStmt) Strict() *DeleteStmt { c := *s; c.g.setStrict(); return &c }

// UnderLease is [UpdateStmt.UnderLease].
func (s *DeleteStmt) UnderLease(name string, secret pgfence.Secret) *DeleteStmt {
	c := *s
	c.g.setLease(name, secret)
	return &c
}

// LeaseSchema is [UpdateStmt.LeaseSchema].
func (s *DeleteStmt) LeaseSchema(name string) *DeleteStmt { c := *s; c.g.setSchema(name); return &c }

// Returning sets the RETURNING list of the deleted rows.
func (s *DeleteStmt) Returning(list string) *DeleteStmt { c := *s; c.g.setReturning(list); return &c }

// Observer is [UpdateStmt.Observer].
func (s *DeleteStmt) Observer(obs pgfence.Observer) *DeleteStmt {
	c := *s
	c.g.setObserver(obs)
	return &c
}

// SQL is [UpdateStmt.SQL] for the DELETE.
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

// deleteCTE deletes the rows if the gates pass and their token is not
// newer; it sets pgfence.token for the trigger.
const deleteCTE = `pgfence_write AS (
    DELETE FROM %[1]s
    WHERE %[2]s
    RETURNING %[3]s
)`

// deleteFast is the guarded DELETE alone, as updateFast is the UPDATE.
const deleteFast = `DELETE FROM %[1]s
WHERE %[2]s`

// Exec deletes the matched rows, all or nothing, unless one carries a newer
// token, and sets the transaction's pgfence.token. Results and errors are
// [UpdateStmt.Exec]'s.
func (s *DeleteStmt) Exec(ctx context.Context, db pgfence.DB, token int64, args ...any) (pgconn.CommandTag, error) {
	return s.g.exec(ctx, db, s.render, token, args, true, "DELETE")
}

// Query deletes as Exec does and returns the Returning columns.
func (s *DeleteStmt) Query(ctx context.Context, db pgfence.DB, token int64, args ...any) (pgx.Rows, error) {
	return s.g.query(ctx, db, s.render, token, args, true, "DELETE")
}

// QueryRow is Query for the first row deleted.
func (s *DeleteStmt) QueryRow(ctx context.Context, db pgfence.DB, token int64, args ...any) pgx.Row {
	rows, err := s.Query(ctx, db, token, args...)
	return resultRow{rows: rows, err: err}
}
