package pgfence

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgfence/pgfence/internal/migrator"
)

// DB is the subset of pgx's query interface that pgfence needs to run a
// statement. It is satisfied by *pgxpool.Pool, *pgxpool.Conn, *pgx.Conn and
// pgx.Tx, so a guarded write can run on a pool, on one connection, or inside
// the caller's transaction.
type DB interface {
	Exec(ctx context.Context, sql string, arguments ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// ErrNotAcquired is returned by the non-blocking acquire calls (TryAcquire,
// TryLock) when the lock is held by someone else. It is not a failure of the
// database: trying again later may succeed.
var ErrNotAcquired = errors.New("pgfence: lock is held by another owner")

// ErrLeaseLost is the cause of a lock handle's context, and the value of its
// Err method, once a lock it held has been lost: the lease expired before it
// could be renewed, another owner took it over, an operator released it, or
// the database session that held it died. Work protected by the lock must
// stop; writes it still makes are rejected by fencing.
var ErrLeaseLost = errors.New("pgfence: lock was lost")

// ErrNotHeld is returned when releasing or renewing a lock that the caller
// does not hold (any more): it was lost, or it was never acquired by this
// owner. Nothing is changed in the database.
var ErrNotHeld = errors.New("pgfence: lock is not held by this owner")

// ErrFenced is matched by errors from guarded writes that were rejected
// because the row carries a newer fencing token than the one presented: a
// later holder of the lock has written it, so the presenting holder's lock
// was lost. The row is left unchanged.
var ErrFenced = errors.New("pgfence: write rejected: row carries a newer fencing token")

// ErrClosed is returned by a Locker's methods after its Close method was
// called.
var ErrClosed = errors.New("pgfence: locker is closed")

// Migrate applies pgfence's embedded migrations to the database at
// databaseURL, a PostgreSQL connection URL or keyword/value string as accepted
// by pgx (for example "postgres://user@host:5432/db?sslmode=disable").
//
// Migrate records its progress in its own table, pgfence_schema_migrations,
// never in the application's schema_migrations. Running it when every
// migration is applied is a no-op that returns nil. Concurrent callers are
// safe: golang-migrate serialises them with an advisory lock, and the later
// caller finds nothing left to do.
//
// ctx bounds the whole run; when it ends, Migrate stops after the statement
// in progress and returns an error wrapping ctx.Err(). Each migration runs in
// its own transaction.
func Migrate(ctx context.Context, databaseURL string) error {
	return migrator.Up(ctx, databaseURL)
}
