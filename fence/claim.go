package fence

import (
	"context"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgfence/pgfence"
)

// ClaimStmt claims rows for a fencing token before the caller reads them,
// built with [Claim] or [ClaimIdent]: a guarded UPDATE that sets only the
// guard column to the token, all or nothing, with the stale and missing
// outcomes of every guarded write. Its methods return a modified copy, so a
// statement can be built once and reused, concurrently too. The zero value
// is not usable.
//
// Claim is the first step of a read-modify-write (see "Reading, then
// writing" in the package documentation): once a row carries the new
// holder's token, a write by an older holder is rejected, and one that an
// older holder made and has not committed yet is waited for, so the claim
// returns the row as it is after that write. With Returning, the claim
// reads the row in the same statement:
//
//	var balance int64
//	err := fence.Claim("accounts").Where("id = $1").Returning("balance").
//		QueryRow(ctx, tx, token, id).Scan(&balance)
type ClaimStmt struct {
	u UpdateStmt
}

// Claim starts a claim of rows of table, given as "table" or
// "schema.table", as for [Update].
func Claim(table string) *ClaimStmt {
	id, err := parseTable(table)
	return &ClaimStmt{u: UpdateStmt{g: newGuard(id, err, kindClaim)}}
}

// ClaimIdent starts a claim of rows of the table named by an identifier of
// one part (table) or two (schema, table), taken literally.
func ClaimIdent(table pgx.Identifier) *ClaimStmt {
	return &ClaimStmt{u: UpdateStmt{g: newGuard(table, nil, kindClaim)}}
}

// Where sets the caller's condition choosing the rows, as for
// [UpdateStmt.Where]; for example "id = $1" claims one row, "id = ANY($1)"
// a set. It is required.
func (s *ClaimStmt) Where(frag string) *ClaimStmt { return &ClaimStmt{u: *s.u.Where(frag)} }

// Column sets the guard column; the default is [DefaultColumn].
func (s *ClaimStmt) Column(name string) *ClaimStmt { return &ClaimStmt{u: *s.u.Column(name)} }

// UnderLease makes the claim also require that the lease name is held with
// the token and secret, as for [UpdateStmt.UnderLease].
func (s *ClaimStmt) UnderLease(name string, secret pgfence.Secret) *ClaimStmt {
	return &ClaimStmt{u: *s.u.UnderLease(name, secret)}
}

// LeaseSchema sets the schema pgfence is installed in, as for
// [UpdateStmt.LeaseSchema].
func (s *ClaimStmt) LeaseSchema(name string) *ClaimStmt { return &ClaimStmt{u: *s.u.LeaseSchema(name)} }

// Returning sets the columns to read from the claimed rows, as for
// [UpdateStmt.Returning].
func (s *ClaimStmt) Returning(list string) *ClaimStmt { return &ClaimStmt{u: *s.u.Returning(list)} }

// Observer attaches obs to the statement, as for [UpdateStmt.Observer];
// its Ops have Statement "claim".
func (s *ClaimStmt) Observer(obs pgfence.Observer) *ClaimStmt {
	return &ClaimStmt{u: *s.u.Observer(obs)}
}

// SQL returns the statement that tells every outcome apart in one round
// trip, as for [UpdateStmt.SQL].
func (s *ClaimStmt) SQL(nargs int) (string, error) { return s.u.SQL(nargs) }

// Exec claims the rows the Where matches for token on db (a pool, a
// connection or a pgx.Tx): their guard column is set to token only if none
// of them carries a newer one, all or nothing. The comparison is the
// default one, column <= token, so a holder can claim again, and then
// write with the same token. Results and errors are as for
// [UpdateStmt.Exec], with an "UPDATE n" tag.
//
// A claim writes the rows (a row version each, and WAL) and keeps them
// locked until the transaction ends: claim in the transaction that reads
// and writes them, as close to the read as possible. Outside a
// transaction the claim still lasts, since it is the token on the row,
// but a write by an older holder committed between the claim and the
// caller's write is excluded only because that holder's write is
// rejected.
func (s *ClaimStmt) Exec(ctx context.Context, db pgfence.DB, token int64, args ...any) (pgconn.CommandTag, error) {
	return s.u.Exec(ctx, db, token, args...)
}

// Query claims the rows as Exec does and returns them, with the columns of
// the Returning list, which it requires; the errors are Exec's, returned
// before any row, as for [UpdateStmt.Query].
func (s *ClaimStmt) Query(ctx context.Context, db pgfence.DB, token int64, args ...any) (pgx.Rows, error) {
	return s.u.Query(ctx, db, token, args...)
}

// QueryRow runs Query and returns a pgx.Row whose Scan reads the first row
// claimed, or returns Query's error.
func (s *ClaimStmt) QueryRow(ctx context.Context, db pgfence.DB, token int64, args ...any) pgx.Row {
	return s.u.QueryRow(ctx, db, token, args...)
}
