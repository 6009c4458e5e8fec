package install

import (
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgfence/pgfence"
)

// InsufficientPrivilege is PostgreSQL's SQLSTATE for insufficient_privilege.
const InsufficientPrivilege = "42501"

// PermissionError is a PostgreSQL permission error (SQLSTATE 42501) with the grant that would fix it.
type PermissionError struct {
	// Err is the error wrapped; it wraps a *pgconn.PgError with [InsufficientPrivilege].
	Err error
	// Role lacks the privileges; "ROLE" in the message when empty.
	Role string
	// Schema is the install's; the default adds no --schema to the hint.
	Schema string
	// Missing names the privileges, such as `USAGE on schema "pgfence"`.
	Missing []string
	// CheckOnly hints at the grant of a service that only checks tokens,
	// `pgfence grant ROLE --check-only`, which an application role's whole
	// grant includes.
	CheckOnly bool
}

// Error returns Err's message followed by the hint.
func (e *PermissionError) Error() string {
	role := e.Role
	if role == "" {
		role = "ROLE"
	}
	cmd := "pgfence grant " + QuoteArg(role)
	note := ""
	if e.CheckOnly {
		cmd += " --check-only"
		note = " (what a service that only checks tokens needs; an application role's whole `pgfence grant ROLE` includes it)"
	}
	if e.Schema != "" && e.Schema != pgfence.DefaultSchema {
		cmd += " --schema " + QuoteArg(e.Schema)
	}
	return fmt.Sprintf("%v; hint: as pgfence's owner, run `%s`%s (missing: %s)", e.Err, cmd, note, strings.Join(e.Missing, ", "))
}

// Unwrap returns Err.
func (e *PermissionError) Unwrap() error { return e.Err }

// WrapPermission returns err as a [*PermissionError] naming role, schema and the missing
// privileges when it wraps a *pgconn.PgError with [InsufficientPrivilege], else err
// unchanged. Without missing, the hint repeats what PostgreSQL denied.
func WrapPermission(err error, role, schema string, missing ...string) error {
	var pgErr *pgconn.PgError
	if err == nil || !errors.As(err, &pgErr) || pgErr.Code != InsufficientPrivilege {
		return err
	}
	var done *PermissionError
	if errors.As(err, &done) {
		return err
	}
	if len(missing) == 0 {
		what, ok := strings.CutPrefix(pgErr.Message, "permission denied for ")
		if !ok {
			what = "the privilege " + strings.TrimSpace(pgErr.Message)
		}
		missing = []string{"privilege on " + what}
	}
	return &PermissionError{Err: err, Role: role, Schema: schema, Missing: missing}
}

// QuoteArg quotes a shell argument unless it is plainly safe, for commands
// that errors hint at.
func QuoteArg(s string) string {
	if s != "" && strings.IndexFunc(s, func(r rune) bool {
		return !(r == '_' || r == '-' || r == '.' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9')
	}) < 0 {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}
