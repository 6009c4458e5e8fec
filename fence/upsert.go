package fence

import (
	"context"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgfence/pgfence"
)

// UpsertStmt is a guarded INSERT ... ON CONFLICT DO UPDATE: it inserts the
// row with the token, or updates the conflicting row unless that carries a
// newer token. Its methods return a modified copy.
type UpsertStmt struct {
	g        guard
	columns  []string
	values   []string
	conflict []string
	// constraint is the OnConstraint name, when onConstraint is set.
	constraint   string
	onConstraint bool
	set          string
}

// Upsert starts a guarded upsert into table, named as for [Update].
func Upsert(table string) *UpsertStmt {
	id, err := parseTable(table)
	return &UpsertStmt{g: newGuard(id, err, kindUpsert)}
}

// UpsertIdent is [Upsert] for an identifier taken literally.
func UpsertIdent(table pgx.Identifier) *UpsertStmt {
	return &UpsertStmt{g: newGuard(table, nil, kindUpsert)}
}

// Columns sets the inserted columns, the guard column excepted.
func (s *UpsertStmt) Columns(names ...string) *UpsertStmt {
	c := *s
	c.g.fresh()
	c.columns = append([]string(nil), names...)
	return &c
}

// Values sets one expression per column, such as Values("$1", "$2"). The
// OnConflict columns' expressions may be evaluated twice: no volatile
// functions.
func (s *UpsertStmt) Values(exprs ...string) *UpsertStmt {
	c := *s
	c.g.fresh()
	c.values = append([]string(nil), exprs...)
	return &c
}

// OnConflict names the conflict target's columns, each one of Columns.
func (s *UpsertStmt) OnConflict(columns ...string) *UpsertStmt {
	c := *s
	c.g.fresh()
	c.conflict = append([]string(nil), columns...)
	c.constraint, c.onConstraint = "", false
	return &c
}

// OnConstraint makes the conflict target the constraint name; columns are
// its columns, each one of Columns, to find the existing row.
func (s *UpsertStmt) OnConstraint(name string, columns ...string) *UpsertStmt {
	c := *s
	c.g.fresh()
	c.conflict = append([]string(nil), columns...)
	c.constraint, c.onConstraint = name, true
	return &c
}

// Set sets the conflict case's SET list, such as
// "balance = accounts.balance + excluded.balance"; without it every
// non-conflict column is set from excluded.
func (s *UpsertStmt) Set(frag string) *UpsertStmt { c := *s; c.set = frag; c.g.fresh(); return &c }

// Returning sets the RETURNING list of the row written.
func (s *UpsertStmt) Returning(list string) *UpsertStmt { c := *s; c.g.setReturning(list); return &c }

// Observer is [UpdateStmt.Observer].
func (s *UpsertStmt) Observer(obs pgfence.Observer) *UpsertStmt {
	c := *s
	c.g.setObserver(obs)
	return &c
}

// Column sets the guard column; the default is [DefaultColumn].
func (s *UpsertStmt) Column(name string) *UpsertStmt { c := *s; c.g.setColumn(name); return &c }

// Strict makes the guard t.column < excluded.column.
func (s *UpsertStmt) Strict() *UpsertStmt { c := *s; c.g.setStrict(); return &c }

// UnderLease is [UpdateStmt.UnderLease].
func (s *UpsertStmt) UnderLease(name string, secret pgfence.Secret) *UpsertStmt {
	c := *s
	c.g.setLease(name, secret)
	return &c
}

// LeaseSchema is [UpdateStmt.LeaseSchema].
func (s *UpsertStmt) LeaseSchema(name string) *UpsertStmt { c := *s; c.g.setSchema(name); return &c }

// SQL is [UpdateStmt.SQL] for the upsert.
func (s *UpsertStmt) SQL(nargs int) (string, error) {
	return s.g.cached(nargs, s.build)
}

// build renders the full statement, as SQL returns it.
func (s *UpsertStmt) build(nargs int) (string, error) { return s.render(nargs, formFull) }

// render renders the statement in form f.
func (s *UpsertStmt) render(nargs int, f form) (string, error) {
	if err := s.check(); err != nil {
		return "", err
	}
	if err := s.g.checkReturning(); err != nil {
		return "", err
	}
	frags := []fragment{{"Set", s.set}}
	for _, v := range s.values {
		frags = append(frags, fragment{"Values", v})
	}
	if err := checkParams(nargs, frags...); err != nil {
		return "", err
	}
	tok := nargs + 1
	col := s.g.col()
	valueOf := make(map[string]string, len(s.columns))
	cols := make([]string, 0, len(s.columns)+1)
	values := make([]string, len(s.values))
	for i, name := range s.columns {
		// Each value in parentheses: a value cannot add a column or a
		// SELECT of its own.
		values[i] = "(" + s.values[i] + ")"
		valueOf[name] = values[i]
		cols = append(cols, pgx.Identifier{name}.Sanitize())
	}
	cols = append(cols, col)
	var match, conflict []string
	isConflict := make(map[string]bool, len(s.conflict))
	for _, name := range s.conflict {
		q := pgx.Identifier{name}.Sanitize()
		isConflict[name] = true
		match = append(match, fmt.Sprintf("%s = %s", q, valueOf[name]))
		conflict = append(conflict, q)
	}
	set := s.set
	if set == "" {
		var sets []string
		for _, name := range s.columns {
			if !isConflict[name] {
				q := pgx.Identifier{name}.Sanitize()
				sets = append(sets, q+" = excluded."+q)
			}
		}
		set = strings.Join(sets, ", ")
	}
	if set != "" {
		set += ", "
	}
	// The existing row is named by the table's last part, which ON CONFLICT
	// accepts for a schema-qualified table too.
	existing := pgx.Identifier{s.g.table[len(s.g.table)-1]}.Sanitize()
	vals := strings.Join(values, ", ")
	target := "(" + strings.Join(conflict, ", ") + ")"
	if s.onConstraint {
		target = "ON CONSTRAINT " + pgx.Identifier{s.constraint}.Sanitize()
	}
	if f&formFast != 0 {
		var conds []string
		if s.g.leased {
			conds = append(conds, s.g.fastLease(tok))
		}
		gate := "\nWHERE " + and(append(conds, fmt.Sprintf(setTokenSQL, tok))...)
		return fmt.Sprintf(upsertFast, s.g.tableName(), strings.Join(cols, ", "), vals, tok, gate,
			target, set, col, existing, s.g.op()) + s.g.fastReturning(f), nil
	}
	gate := "\n    WHERE " + and(append(s.g.gates(tok, false), fmt.Sprintf(setTokenSQL, tok))...)
	m := strings.Join(match, " AND ")
	return s.g.with(m, tok, false) + fmt.Sprintf(upsertCTE,
		s.g.tableName(), strings.Join(cols, ", "), vals, tok, gate,
		target, set, col, existing, s.g.op(), s.g.cteReturning(f)) + s.g.tail(m, f), nil
}

// upsertCTE inserts or updates the row if the gates pass; an INSERT ...
// SELECT so they can hold it back. Its WHERE sets pgfence.token first.
const upsertCTE = `pgfence_write AS (
    INSERT INTO %[1]s (%[2]s)
    SELECT %[3]s, $%[4]d::pg_catalog.int8%[5]s
    ON CONFLICT %[6]s DO UPDATE SET %[7]s%[8]s = excluded.%[8]s
    WHERE %[9]s.%[8]s %[10]s excluded.%[8]s
    RETURNING %[11]s
)`

// upsertFast is the guarded upsert alone: Exec sends it first, and the full
// statement only when it wrote nothing.
const upsertFast = `INSERT INTO %[1]s (%[2]s)
SELECT %[3]s, $%[4]d::pg_catalog.int8%[5]s
ON CONFLICT %[6]s DO UPDATE SET %[7]s%[8]s = excluded.%[8]s
WHERE %[9]s.%[8]s %[10]s excluded.%[8]s`

func (s *UpsertStmt) check() error {
	if err := s.g.check(); err != nil {
		return err
	}
	t := s.g.tableName()
	if len(s.columns) == 0 {
		return fmt.Errorf("fence: Upsert(%s) has no Columns", t)
	}
	if len(s.values) != len(s.columns) {
		return fmt.Errorf("fence: Upsert(%s) has %d Columns but %d Values", t, len(s.columns), len(s.values))
	}
	if len(s.conflict) == 0 {
		if s.onConstraint {
			return fmt.Errorf("fence: Upsert(%s): OnConstraint names no columns of the constraint", t)
		}
		return fmt.Errorf("fence: Upsert(%s) has no OnConflict columns", t)
	}
	if s.onConstraint {
		if err := checkName("constraint", s.constraint); err != nil {
			return err
		}
	}
	seen := make(map[string]bool, len(s.columns))
	for i, name := range s.columns {
		if err := checkName("column", name); err != nil {
			return err
		}
		if name == s.g.column {
			return fmt.Errorf("fence: Upsert(%s): the guard column %q is set by the statement; leave it out of Columns", t, name)
		}
		if seen[name] {
			return fmt.Errorf("fence: Upsert(%s): column %q is listed twice", t, name)
		}
		seen[name] = true
		if strings.TrimSpace(s.values[i]) == "" {
			return fmt.Errorf("fence: Upsert(%s): empty value for column %q", t, name)
		}
	}
	for _, name := range s.conflict {
		if !seen[name] {
			return fmt.Errorf("fence: Upsert(%s): conflict column %q is not one of Columns", t, name)
		}
	}
	return nil
}

// Exec inserts or updates the row, returning "INSERT 0 1". It returns a
// [*LeaseLostError] (UnderLease), a [*StaleTokenError] when the existing row
// carries a newer token, or an input or database error; never pgx.ErrNoRows.
// A row inserted concurrently is read by running the statement again, at
// most twice; Current is 0 only if it was replaced that often.
func (s *UpsertStmt) Exec(ctx context.Context, db pgfence.DB, token int64, args ...any) (pgconn.CommandTag, error) {
	t, err := s.g.exec(ctx, db, s.render, token, args, false, "INSERT 0")
	if err != nil {
		return pgconn.CommandTag{}, err
	}
	if t.RowsAffected() != 1 {
		return t, nil
	}
	return pgconn.NewCommandTag("INSERT 0 1"), nil
}

// Query upserts as Exec does and returns the Returning columns.
func (s *UpsertStmt) Query(ctx context.Context, db pgfence.DB, token int64, args ...any) (pgx.Rows, error) {
	return s.g.query(ctx, db, s.render, token, args, false, "INSERT 0")
}

// QueryRow is Query for the row written.
func (s *UpsertStmt) QueryRow(ctx context.Context, db pgfence.DB, token int64, args ...any) pgx.Row {
	rows, err := s.Query(ctx, db, token, args...)
	return resultRow{rows: rows, err: err}
}
