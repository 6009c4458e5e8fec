package fence

import (
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgfence/pgfence"
	"github.com/pgfence/pgfence/internal/permerr"
)

// DefaultColumn is the guard column the builders use unless told otherwise
// with Column: a bigint NOT NULL column holding the fencing token of the
// holder that last wrote the row.
const DefaultColumn = "fence_token"

// SQLState is the SQLSTATE that the pgfence_guard triggers raise when a
// write would move a row's fencing token backwards, presents no token or an
// older one (pgfence_guard_strict), presents one that was never issued
// (pgfence_guard_strict), or truncates the table (pgfence_guard_truncate).
// [Classify] and [Check] turn it into a [*StaleTokenError].
const SQLState = "PF001"

// SQLStateMalformedToken is the SQLSTATE that the pgfence_guard triggers
// raise when the transaction's pgfence.token setting is neither empty nor a
// bigint. [Classify] and [Check] turn it into an error matching
// [ErrMalformedToken].
const SQLStateMalformedToken = "PF003"

// ErrMalformedToken is matched (errors.Is) by the error [Classify] and
// [Check] return, and the builders' Exec, when a pgfence_guard trigger
// rejected a write because the transaction's pgfence.token setting is not a
// bigint (SQLSTATE PF003): the setting was made by hand, not with
// set_config('pgfence.token', token::text, true). Nothing was written; the
// *pgconn.PgError stays reachable with errors.As.
var ErrMalformedToken = errors.New("pgfence: malformed pgfence.token setting")

// SQLStateNoToken is the SQLSTATE that pgfence_guard_strict raises, from
// schema version 13, when an UPDATE or DELETE presents no fencing token:
// neither pgfence.token (see [Present]) nor a raised guard column.
// [Classify] and [Check] turn it into a [*NoTokenError].
const SQLStateNoToken = "PF004"

// maxIdentLen is PostgreSQL's identifier limit (NAMEDATALEN-1 bytes). Longer
// names are silently truncated by the server, so they are rejected here.
const maxIdentLen = 63

// maxLeaseName is the limit the pgfence_leases name column's CHECK enforces.
const maxLeaseName = 512

// StaleTokenError is the error of a guarded write rejected because a row it
// would write carries a newer fencing token than the one presented: a later
// holder of the lock has written the row, so the presenting holder's lock was
// lost. Nothing was written. errors.Is(err, pgfence.ErrFenced) matches it.
type StaleTokenError struct {
	// Table is the table written to, as the statement names it: quoted
	// and schema-qualified as given ("accounts" gives "\"accounts\"",
	// "app.accounts" gives "\"app\".\"accounts\""); empty when the error
	// was classified from a plain-SQL statement.
	Table string
	// Presented is the fencing token the write carried; 0 when a trigger
	// rejected a write that presented none (a NULL column, or, in strict
	// mode, no pgfence.token), or a TRUNCATE.
	Presented int64
	// Current is the newest token on the rows the write matched. It is 0
	// when it could not be read: a TRUNCATE, a trigger error whose DETAIL
	// could not be parsed, or an upsert whose conflicting row was inserted
	// concurrently and replaced again each time it was read (see
	// [UpsertStmt.Exec]). Presented > Current means a strict-mode trigger
	// rejected a token that was never issued.
	Current int64
	// Err is the *pgconn.PgError (SQLSTATE PF001) when the rejection came
	// from a pgfence_guard trigger, and nil when the builder's own
	// predicate rejected the write.
	Err error
}

// Error describes the rejected write.
func (e *StaleTokenError) Error() string {
	var b strings.Builder
	b.WriteString("pgfence: write rejected")
	if e.Table != "" {
		b.WriteString(" on " + e.Table)
	}
	// A rejection that is not a stale token (no token presented, a token
	// never issued, a TRUNCATE) is told by the trigger's own message.
	var pgErr *pgconn.PgError
	if errors.As(e.Err, &pgErr) {
		if m := detailRE.FindStringSubmatch(pgErr.Detail); pgErr.Message != "" && (m == nil || m[1] == "" || e.Presented > e.Current) {
			b.WriteString(": " + strings.TrimPrefix(pgErr.Message, "pgfence: "))
			return b.String()
		}
	}
	fmt.Fprintf(&b, ": stale fencing token %d", e.Presented)
	if e.Current != 0 {
		fmt.Fprintf(&b, ", row carries %d", e.Current)
	} else {
		b.WriteString(", row carries a newer token")
	}
	return b.String()
}

// Is reports whether target is pgfence.ErrFenced.
func (e *StaleTokenError) Is(target error) bool { return target == pgfence.ErrFenced }

// Unwrap returns the trigger's *pgconn.PgError, if any.
func (e *StaleTokenError) Unwrap() error { return e.Err }

// LeaseLostError is the error of a lease-checked write (see UnderLease)
// rejected because the lease was not held with the presented token when the
// statement ran: it had expired, was released, or another owner had taken it
// over (with a newer token). Nothing was written. Both
// errors.Is(err, pgfence.ErrLeaseLost) and errors.Is(err, pgfence.ErrFenced)
// match it.
type LeaseLostError struct {
	// Lease is the lease name the write was checked against.
	Lease string
	// Presented is the fencing token the write carried.
	Presented int64
}

// Error describes the rejected write.
func (e *LeaseLostError) Error() string {
	return fmt.Sprintf("pgfence: write rejected: lease %q is not held with fencing token %d", e.Lease, e.Presented)
}

// Is reports whether target is pgfence.ErrLeaseLost or pgfence.ErrFenced.
func (e *LeaseLostError) Is(target error) bool {
	return target == pgfence.ErrLeaseLost || target == pgfence.ErrFenced
}

// NoTokenError is the error of a write to a strict table that presented no
// fencing token (SQLSTATE PF004): the code writing forgot [Present], which
// is a bug, not a lost lock. Nothing was written. errors.Is(err,
// pgfence.ErrNoToken) matches it; pgfence.ErrFenced does not.
type NoTokenError struct {
	// Table is the table written to, as the statement names it; empty when
	// the error was classified from a plain-SQL statement.
	Table string
	// Current is the row's token (0 when it could not be read).
	Current int64
	// Err is the trigger's error (a *pgconn.PgError, or the driver's).
	Err error
}

// Error describes the rejected write.
func (e *NoTokenError) Error() string {
	var b strings.Builder
	b.WriteString("pgfence: write rejected")
	if e.Table != "" {
		b.WriteString(" on " + e.Table)
	}
	b.WriteString(": it presented no fencing token; call fence.Present (SQL: pgfence_present) in the transaction first")
	return b.String()
}

// Is reports whether target is pgfence.ErrNoToken.
func (e *NoTokenError) Is(target error) bool { return target == pgfence.ErrNoToken }

// Unwrap returns the trigger's error.
func (e *NoTokenError) Unwrap() error { return e.Err }

// Predicate returns the guard predicate for hand-written or sqlc SQL:
// Predicate("fence_token", 3, false) is `"fence_token" <= $3` and with
// strict true `"fence_token" < $3`. An empty column means [DefaultColumn].
// The column is quoted with pgx.Identifier. The same parameter should set
// the column, so the row records the token that wrote it:
//
//	UPDATE accounts SET balance = $1, fence_token = $3
//	WHERE id = $2 AND "fence_token" <= $3
//
// A statement guarded this way reports a stale write and a missing row the
// same way, as zero rows affected. To tell them apart, use the builders
// (one round trip on success, a second only when nothing was written), or
// attach the pgfence_guard trigger, leave the predicate out and map the
// result with [Check] (one round trip). Predicate panics when param
// is not in 1..65535, like regexp.MustCompile with a bad constant.
func Predicate(column string, param int, strict bool) string {
	if param < 1 || param > maxParams {
		panic(fmt.Sprintf("fence.Predicate: parameter number %d is not in 1..%d", param, maxParams))
	}
	if column == "" {
		column = DefaultColumn
	}
	op := "<="
	if strict {
		op = "<"
	}
	return fmt.Sprintf("%s %s $%d", pgx.Identifier{column}.Sanitize(), op, param)
}

// Classify maps an error from any statement that writes a table protected by
// a pgfence_guard trigger. A database error with SQLSTATE PF001 becomes a
// [*StaleTokenError] wrapping it (so errors.Is(err, pgfence.ErrFenced)
// holds and the driver's error stays reachable), with Presented and Current
// parsed from the error's DETAIL (0 where the DETAIL has none); PF004
// becomes a [*NoTokenError]; PF003 an error matching [ErrMalformedToken].
// Any other error, and nil, is returned unchanged. The database error is
// pgx's *pgconn.PgError or any error with a SQLState() string method (lib/pq's
// *pq.Error; its DETAIL is read through its Get method).
func Classify(err error) error {
	var st sqlStater
	if err == nil || !errors.As(err, &st) {
		return err
	}
	switch st.SQLState() {
	case SQLStateMalformedToken:
		return fmt.Errorf("%w: %w", ErrMalformedToken, err)
	case SQLStateNoToken:
		e := &NoTokenError{Err: err}
		if m := detailRE.FindStringSubmatch(detail(st)); m != nil {
			e.Current, _ = strconv.ParseInt(m[2], 10, 64)
		}
		return e
	case SQLState:
	default:
		return permerr.Wrap(err, "", "")
	}
	stale := &StaleTokenError{Err: err}
	if m := detailRE.FindStringSubmatch(detail(st)); m != nil {
		stale.Presented, _ = strconv.ParseInt(m[1], 10, 64)
		stale.Current, _ = strconv.ParseInt(m[2], 10, 64)
	}
	return stale
}

// sqlStater is a driver's error carrying a SQLSTATE: *pgconn.PgError and
// lib/pq's *pq.Error have this method.
type sqlStater interface{ SQLState() string }

// detail returns a database error's DETAIL: pgx's field, or lib/pq's
// Get('D').
func detail(st sqlStater) string {
	switch e := st.(type) {
	case *pgconn.PgError:
		return e.Detail
	case interface{ Get(byte) string }:
		return e.Get('D')
	}
	return ""
}

// detailRE parses the DETAIL of the pgfence_guard triggers' PF001 errors.
var detailRE = regexp.MustCompile(`^presented=(-?\d*) current=(-?\d*)$`)

// Check maps the result of a hand-written or sqlc UPDATE or DELETE on a
// table with a pgfence_guard trigger attached, run in a transaction that
// presented the token ([Present]), where an UPDATE also sets the guard
// column to the token, and no guard predicate of its own. The trigger then raises PF001 for a row with
// a newer token, so one round trip tells the cases apart:
//
//   - err with SQLSTATE PF001: a [*StaleTokenError], matching
//     pgfence.ErrFenced; nothing was written (the statement failed).
//   - err with SQLSTATE PF004: a [*NoTokenError], matching
//     pgfence.ErrNoToken: the write presented no token (strict mode).
//   - err with SQLSTATE PF003: an error matching [ErrMalformedToken].
//   - any other err: returned unchanged.
//   - no row affected: an error matching pgx.ErrNoRows.
//
// Otherwise Check returns tag and nil.
func Check(tag pgconn.CommandTag, err error) (pgconn.CommandTag, error) {
	if err != nil {
		return tag, Classify(err)
	}
	if tag.RowsAffected() == 0 {
		return tag, fmt.Errorf("pgfence: %s affected no row: %w", tag.String(), pgx.ErrNoRows)
	}
	return tag, nil
}

// parseTable splits a table name given as "table" or "schema.table" into an
// identifier. Names whose parts contain dots or double quotes must be given
// as a pgx.Identifier to the *Ident constructors instead.
func parseTable(name string) (pgx.Identifier, error) {
	if name == "" {
		return nil, errors.New("fence: empty table name")
	}
	if strings.ContainsRune(name, '"') {
		return nil, fmt.Errorf("fence: table name %q contains a double quote; "+
			"names are quoted for you: pass the unquoted parts to the *Ident constructor", name)
	}
	parts := strings.Split(name, ".")
	if len(parts) > 2 {
		return nil, fmt.Errorf("fence: table name %q has more than two dot-separated parts; "+
			"use \"schema.table\", or pass a pgx.Identifier to the *Ident constructor", name)
	}
	id := pgx.Identifier(parts)
	if err := checkIdent(id); err != nil {
		return nil, err
	}
	return id, nil
}

// checkIdent validates a table identifier: one or two parts (table, or
// schema and table), each a valid name.
func checkIdent(id pgx.Identifier) error {
	if len(id) == 0 {
		return errors.New("fence: empty table name")
	}
	if len(id) > 2 {
		return fmt.Errorf("fence: table identifier %q has %d parts; want table or schema and table", []string(id), len(id))
	}
	for _, p := range id {
		if err := checkName("table", p); err != nil {
			return err
		}
	}
	return nil
}

// checkName validates one identifier: not empty, no NUL byte (pgx would drop
// it silently), at most 63 bytes (PostgreSQL would truncate it silently).
func checkName(what, name string) error {
	switch {
	case name == "":
		return fmt.Errorf("fence: empty %s name", what)
	case strings.IndexByte(name, 0) >= 0:
		return fmt.Errorf("fence: %s name %q contains a NUL byte", what, name)
	case len(name) > maxIdentLen:
		return fmt.Errorf("fence: %s name %q is longer than %d bytes", what, name, maxIdentLen)
	}
	return nil
}
