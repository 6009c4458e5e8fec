package fence

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgfence/pgfence"
)

// UpdateStmt is a guarded UPDATE. Its methods return a modified copy, so a
// statement can be built once and used concurrently.
type UpdateStmt struct {
	g     guard
	set   string
	where string
}

// Update starts a guarded UPDATE of table, "table" or "schema.table".
func Update(table string) *UpdateStmt {
	id, err := parseTable(table)
	return &UpdateStmt{g: newGuard(id, err, kindUpdate)}
}

// UpdateIdent is [Update] for an identifier taken literally.
func UpdateIdent(table pgx.Identifier) *UpdateStmt {
	return &UpdateStmt{g: newGuard(table, nil, kindUpdate)}
}

// Set sets the SET list, such as "balance = balance + $1"; it must not
// assign the guard column.
func (s *UpdateStmt) Set(frag string) *UpdateStmt { c := *s; c.set = frag; c.g.fresh(); return &c }

// Where sets the required condition, such as "id = $2". It is evaluated
// more than once, so it should not call volatile functions.
func (s *UpdateStmt) Where(frag string) *UpdateStmt { c := *s; c.where = frag; c.g.fresh(); return &c }

// Column sets the guard column; the default is [DefaultColumn].
func (s *UpdateStmt) Column(name string) *UpdateStmt { c := *s; c.g.setColumn(name); return &c }

// Strict makes the guard column < token: each token writes a row once.
func (s *UpdateStmt) Strict() *UpdateStmt { c := *s; c.g.setStrict(); return &c }

// UnderLease also requires, in the same statement, that the lease name is
// held with the token and secret, locking its row FOR SHARE until the
// transaction ends.
func (s *UpdateStmt) UnderLease(name string, secret pgfence.Secret) *UpdateStmt {
	c := *s
	c.g.setLease(name, secret)
	return &c
}

// LeaseSchema sets pgfence's schema for UnderLease; the default is "pgfence".
func (s *UpdateStmt) LeaseSchema(name string) *UpdateStmt { c := *s; c.g.setSchema(name); return &c }

// Returning sets the RETURNING list for Query and QueryRow.
func (s *UpdateStmt) Returning(list string) *UpdateStmt { c := *s; c.g.setReturning(list); return &c }

// Observer reports each stale write to obs as a [pgfence.StaleWrite] event
// and, for a [pgfence.OpObserver], brackets each call; nil detaches it.
func (s *UpdateStmt) Observer(obs pgfence.Observer) *UpdateStmt {
	c := *s
	c.g.setObserver(obs)
	return &c
}

// SQL returns the statement that tells every outcome apart, for nargs
// arguments: the token is $nargs+1, with UnderLease the name and secret
// $nargs+2 and $nargs+3. Exec sends it only when the guarded UPDATE alone
// wrote nothing. It reports invalid names and misused placeholders.
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

// updateCTE writes the rows if the gates pass and their token is not newer;
// its WHERE sets pgfence.token for the strict trigger.
const updateCTE = `pgfence_write AS (
    UPDATE %[1]s SET %[2]s
    WHERE %[3]s
    RETURNING %[4]s
)`

// updateFast is the guarded UPDATE alone, without row locks; it writes
// nothing when its snapshot shows several matching rows.
const updateFast = `UPDATE %[1]s SET %[2]s
WHERE %[3]s`

// Exec runs the UPDATE with args ($1..$n) and token: the matched rows are
// written, all or nothing, unless one carries a newer token. ctx covers its
// one statement, and the second sent when nothing was written.
//
// It returns a [*LeaseLostError] when UnderLease's lease is not held, a
// [*StaleTokenError] when a row carries a newer token, an error matching
// pgx.ErrNoRows when no row matches, or an input or database error.
func (s *UpdateStmt) Exec(ctx context.Context, db pgfence.DB, token int64, args ...any) (pgconn.CommandTag, error) {
	return s.g.exec(ctx, db, s.render, token, args, true, "UPDATE")
}

// Query runs the UPDATE as Exec does and returns the written rows' Returning
// columns; Exec's errors come before any row.
func (s *UpdateStmt) Query(ctx context.Context, db pgfence.DB, token int64, args ...any) (pgx.Rows, error) {
	return s.g.query(ctx, db, s.render, token, args, true, "UPDATE")
}

// QueryRow is Query for the first row written, like pgx's QueryRow.
func (s *UpdateStmt) QueryRow(ctx context.Context, db pgfence.DB, token int64, args ...any) pgx.Row {
	rows, err := s.Query(ctx, db, token, args...)
	return resultRow{rows: rows, err: err}
}
