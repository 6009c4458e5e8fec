package fence

import (
	"context"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgfence/pgfence"
)

// ClaimStmt claims rows for a token before the caller reads them: a guarded
// UPDATE of the guard column alone. With Returning it reads them in the same
// statement, after any older holder's write in flight has ended; from then
// on older holders' writes are rejected:
//
//	var balance int64
//	err := fence.Claim("accounts").Where("id = $1").Returning("balance").
//		QueryRow(ctx, tx, token, id).Scan(&balance)
type ClaimStmt struct {
	u UpdateStmt
}

// Claim starts a claim of rows of table, named as for [Update].
func Claim(table string) *ClaimStmt {
	id, err := parseTable(table)
	return &ClaimStmt{u: UpdateStmt{g: newGuard(id, err, kindClaim)}}
}

// ClaimIdent is [Claim] for an identifier taken literally.
func ClaimIdent(table pgx.Identifier) *ClaimStmt {
	return &ClaimStmt{u: UpdateStmt{g: newGuard(table, nil, kindClaim)}}
}

// Where sets the required condition, as for [UpdateStmt.Where].
func (s *ClaimStmt) Where(frag string) *ClaimStmt { return &ClaimStmt{u: *s.u.Where(frag)} }

// Column sets the guard column; the default is [DefaultColumn].
func (s *ClaimStmt) Column(name string) *ClaimStmt { return &ClaimStmt{u: *s.u.Column(name)} }

// UnderLease is [UpdateStmt.UnderLease].
func (s *ClaimStmt) UnderLease(name string, secret pgfence.Secret) *ClaimStmt {
	return &ClaimStmt{u: *s.u.UnderLease(name, secret)}
}

// LeaseSchema is [UpdateStmt.LeaseSchema].
func (s *ClaimStmt) LeaseSchema(name string) *ClaimStmt { return &ClaimStmt{u: *s.u.LeaseSchema(name)} }

// Returning sets the columns read from the claimed rows.
func (s *ClaimStmt) Returning(list string) *ClaimStmt { return &ClaimStmt{u: *s.u.Returning(list)} }

// Observer is [UpdateStmt.Observer]; its Ops have Statement "claim".
func (s *ClaimStmt) Observer(obs pgfence.Observer) *ClaimStmt {
	return &ClaimStmt{u: *s.u.Observer(obs)}
}

// SQL is [UpdateStmt.SQL] for the claim.
func (s *ClaimStmt) SQL(nargs int) (string, error) { return s.u.SQL(nargs) }

// Exec sets the matched rows' guard column to token, all or nothing, unless
// one carries a newer token (<=, so a holder may claim again). Results and
// errors are [UpdateStmt.Exec]'s. The rows stay locked until the
// transaction ends: claim in the transaction that reads and writes them.
func (s *ClaimStmt) Exec(ctx context.Context, db pgfence.DB, token int64, args ...any) (pgconn.CommandTag, error) {
	return s.u.Exec(ctx, db, token, args...)
}

// Query claims as Exec does and returns the Returning columns.
func (s *ClaimStmt) Query(ctx context.Context, db pgfence.DB, token int64, args ...any) (pgx.Rows, error) {
	return s.u.Query(ctx, db, token, args...)
}

// QueryRow is Query for the first row claimed.
func (s *ClaimStmt) QueryRow(ctx context.Context, db pgfence.DB, token int64, args ...any) pgx.Row {
	return s.u.QueryRow(ctx, db, token, args...)
}
