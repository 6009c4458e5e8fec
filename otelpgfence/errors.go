package otelpgfence

import (
	"context"
	"errors"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
	"go.opentelemetry.io/otel/attribute"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"

	"github.com/pgfence/pgfence"
)

// errorType returns the error.type attribute of err: a short name for
// pgfence's sentinels and ctx errors, the SQLSTATE of a database error (as
// the semantic conventions for databases ask), else "_OTHER". The set of
// values is small, so it can label metrics.
func errorType(err error) attribute.KeyValue {
	return semconv.ErrorTypeKey.String(ErrorType(err))
}

// ErrorType returns the value of the error.type attribute for err, the
// error of an operation or event: "not_acquired", "already_held",
// "unavailable", "closed", "lease_lost", "not_held", "fenced", "no_token", "canceled",
// "timeout", the SQLSTATE of a *pgconn.PgError (e.g. "57P01"), or "_OTHER";
// "" for nil. pgfence's sentinels are matched first, so an
// [pgfence.ErrUnavailable] that wraps a PgError is "unavailable".
func ErrorType(err error) string {
	var pgErr *pgconn.PgError
	switch {
	case err == nil:
		return ""
	case errors.Is(err, pgfence.ErrAlreadyHeld):
		return "already_held"
	case errors.Is(err, pgfence.ErrNotAcquired):
		return "not_acquired"
	case errors.Is(err, pgfence.ErrUnavailable):
		return "unavailable"
	case errors.Is(err, pgfence.ErrClosed):
		return "closed"
	case errors.Is(err, pgfence.ErrFenced):
		return "fenced"
	case errors.Is(err, pgfence.ErrNoToken):
		return "no_token"
	case errors.Is(err, pgfence.ErrLeaseLost):
		return "lease_lost"
	case errors.Is(err, pgfence.ErrNotHeld):
		return "not_held"
	case errors.Is(err, context.Canceled):
		return "canceled"
	case errors.Is(err, context.DeadlineExceeded):
		return "timeout"
	case errors.As(err, &pgErr):
		return pgErr.Code
	}
	return semconv.ErrorTypeOther.Value.AsString()
}

// LossCause returns the value of the pgfence.loss.cause attribute for the
// Cause of a [pgfence.Lost] event:
//   - "expired": no renewal succeeded before the lock's local deadline
//     ([pgfence.ErrLeaseExpired]);
//   - "taken_over": the database no longer holds it for this grant: it
//     expired there, another owner took it, or it was force-released
//     ([pgfence.ErrLeaseTakenOver]);
//   - "session_ended": the database session holding it ended (advisory
//     locks; [pgfence.ErrSessionEnded]);
//   - "max_hold": it was held for its AcquireOpts.MaxHold bound
//     ([pgfence.ErrMaxHold]);
//   - "closed": the Locker was closed while holding it ([pgfence.ErrClosed]);
//   - "other": anything else.
func LossCause(cause error) string {
	switch {
	case errors.Is(cause, pgfence.ErrClosed):
		return "closed"
	case errors.Is(cause, pgfence.ErrLeaseExpired):
		return "expired"
	case errors.Is(cause, pgfence.ErrLeaseTakenOver):
		return "taken_over"
	case errors.Is(cause, pgfence.ErrSessionEnded):
		return "session_ended"
	case errors.Is(cause, pgfence.ErrMaxHold):
		return "max_hold"
	}
	return "other"
}

// collectionName returns the db.collection.name of a guarded table as
// pgfence reports it: a name quoted as an SQL identifier (package fence
// gives `"public"."accounts"`) loses its quotes (public.accounts), as the
// semantic conventions want the name itself; any other string is kept.
func collectionName(table string) string {
	if !strings.HasPrefix(table, `"`) {
		return table
	}
	var b strings.Builder
	for i := 0; i < len(table); i++ {
		switch c := table[i]; {
		case c == '"' && i+1 < len(table) && table[i+1] == '"':
			b.WriteByte('"')
			i++
		case c == '"':
			// an opening or closing quote
		default:
			b.WriteByte(c)
		}
	}
	return b.String()
}
