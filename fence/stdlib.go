package fence

import (
	"context"
	"database/sql"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/pgfence/pgfence"
)

// StdlibQuerier is what *sql.DB, *sql.Conn and *sql.Tx share.
type StdlibQuerier interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// Stdlib adapts a *sql.DB, *sql.Conn or *sql.Tx opened with pgx's driver
// (github.com/jackc/pgx/v5/stdlib) to [pgfence.DB], so the builders run on
// it:
//
//	_, err := stmt.Exec(ctx, fence.Stdlib(db), token, amount, id)
//
// Errors come through unchanged. Its CommandTag carries only the rows
// affected, its rows' FieldDescriptions only names, and its QueryRow's
// missing row matches both pgx.ErrNoRows and sql.ErrNoRows.
func Stdlib(q StdlibQuerier) pgfence.DB { return stdlibDB{q} }

type stdlibDB struct{ q StdlibQuerier }

func (d stdlibDB) Exec(ctx context.Context, query string, args ...any) (pgconn.CommandTag, error) {
	res, err := d.q.ExecContext(ctx, query, args...)
	if err != nil {
		return pgconn.CommandTag{}, err
	}
	n, err := res.RowsAffected()
	if err != nil {
		return pgconn.CommandTag{}, err
	}
	return pgconn.NewCommandTag(fmt.Sprintf("EXEC %d", n)), nil
}

func (d stdlibDB) Query(ctx context.Context, query string, args ...any) (pgx.Rows, error) {
	rows, err := d.q.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	cols, err := rows.Columns()
	if err != nil {
		_ = rows.Close()
		return nil, err
	}
	fields := make([]pgconn.FieldDescription, len(cols))
	for i, c := range cols {
		fields[i].Name = c
	}
	return &stdlibRows{rows: rows, fields: fields}, nil
}

func (d stdlibDB) QueryRow(ctx context.Context, query string, args ...any) pgx.Row {
	rows, err := d.Query(ctx, query, args...)
	return stdlibRow{rows: rows, err: err}
}

// stdlibRows is a *sql.Rows as pgx.Rows.
type stdlibRows struct {
	rows   *sql.Rows
	fields []pgconn.FieldDescription
	err    error
	closed bool
}

func (r *stdlibRows) Close() {
	if r.closed {
		return
	}
	r.closed = true
	if err := r.rows.Close(); err != nil && r.err == nil {
		r.err = err
	}
}

func (r *stdlibRows) Err() error {
	if r.err != nil {
		return r.err
	}
	return r.rows.Err()
}

func (r *stdlibRows) CommandTag() pgconn.CommandTag { return pgconn.CommandTag{} }

func (r *stdlibRows) FieldDescriptions() []pgconn.FieldDescription { return r.fields }

func (r *stdlibRows) Next() bool {
	if r.closed {
		return false
	}
	if r.rows.Next() {
		return true
	}
	r.Close()
	return false
}

// Scan scans the current row; a nil destination skips its column.
func (r *stdlibRows) Scan(dest ...any) error {
	copied := false
	for i, d := range dest {
		if d == nil {
			if !copied {
				dest, copied = append([]any(nil), dest...), true
			}
			dest[i] = new(any)
		}
	}
	if err := r.rows.Scan(dest...); err != nil {
		r.err = err
		r.Close()
		return err
	}
	return nil
}

func (r *stdlibRows) Values() ([]any, error) {
	v := make([]any, len(r.fields))
	dest := make([]any, len(v))
	for i := range v {
		dest[i] = &v[i]
	}
	if err := r.rows.Scan(dest...); err != nil {
		return nil, err
	}
	return v, nil
}

func (r *stdlibRows) RawValues() [][]byte { return nil }

func (r *stdlibRows) Conn() *pgx.Conn { return nil }

// TypeMap returns nil: the values were decoded by the database/sql driver.
func (r *stdlibRows) TypeMap() *pgtype.Map { return nil }

// stdlibRow is QueryRow's row.
type stdlibRow struct {
	rows pgx.Rows
	err  error
}

// errNoRows matches both pgx.ErrNoRows and sql.ErrNoRows.
var errNoRows = fmt.Errorf("%w (%w)", pgx.ErrNoRows, sql.ErrNoRows)

func (r stdlibRow) Scan(dest ...any) error {
	if r.err != nil {
		return r.err
	}
	defer r.rows.Close()
	if !r.rows.Next() {
		if err := r.rows.Err(); err != nil {
			return err
		}
		return errNoRows
	}
	if err := r.rows.Scan(dest...); err != nil {
		return err
	}
	r.rows.Close()
	return r.rows.Err()
}

// CheckResult is [Check] for an sql.Result; a missing row matches both
// pgx.ErrNoRows and sql.ErrNoRows.
func CheckResult(res sql.Result, err error) (sql.Result, error) {
	if err != nil {
		return res, Classify(err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return res, err
	}
	if n == 0 {
		return res, fmt.Errorf("pgfence: statement affected no row: %w", errNoRows)
	}
	return res, nil
}
