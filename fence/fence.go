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
	"github.com/pgfence/pgfence/internal/install"
)

// DefaultColumn is the guard column the builders use unless told otherwise:
// a bigint NOT NULL column holding the token of the row's last writer.
const DefaultColumn = "fence_token"

// SQLState is the SQLSTATE of a trigger's rejection (a stale, missing or
// never-issued token, a TRUNCATE): a [*StaleTokenError].
const SQLState = "PF001"

// SQLStateMalformedToken is the SQLSTATE of a pgfence.token setting that is
// not a bigint: an error matching [ErrMalformedToken].
const SQLStateMalformedToken = "PF003"

// ErrMalformedToken is matched when a trigger rejected a write because
// pgfence.token was set by hand to something not a bigint.
var ErrMalformedToken = errors.New("pgfence: malformed pgfence.token setting")

// SQLStateNoToken is the SQLSTATE of a strict-mode write that presented no
// token: a [*NoTokenError].
const SQLStateNoToken = "PF004"

// maxIdentLen is PostgreSQL's identifier limit; the server would truncate.
const maxIdentLen = 63

// maxLeaseName is the limit the pgfence_leases name column's CHECK enforces.
const maxLeaseName = 512

// StaleTokenError is a guarded write rejected because a row carries a newer
// token. Nothing was written. It matches pgfence.ErrFenced.
type StaleTokenError struct {
	// Table is quoted as the statement names it; empty from plain SQL.
	Table string
	// Resource is the fence registry's resource, set by [CheckResource].
	Resource string
	// Presented is 0 when no token was presented, or for a TRUNCATE.
	Presented int64
	// Current is the newest token on the matched rows; 0 when unreadable.
	// Presented > Current: a strict trigger saw a token never issued.
	Current int64
	// Err is the trigger's *pgconn.PgError; nil when the builder's predicate
	// rejected the write.
	Err error
}

// Error describes the rejected write.
func (e *StaleTokenError) Error() string {
	var b strings.Builder
	b.WriteString("pgfence: write rejected")
	if e.Resource != "" {
		fmt.Fprintf(&b, ": stale fencing token %d for resource %q, which has seen %d", e.Presented, e.Resource, e.Current)
		return b.String()
	}
	if e.Table != "" {
		b.WriteString(" on " + e.Table)
	}
	// The trigger's (or registry's) own message tells the other rejections.
	var pgErr *pgconn.PgError
	if errors.As(e.Err, &pgErr) {
		if m := detailRE.FindStringSubmatch(pgErr.Detail); pgErr.Message != "" &&
			(m == nil || m[1] == "" || e.Presented > e.Current || pgErr.TableName == registryTable) {
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

// LeaseLostError is a lease-checked write rejected because the lease was not
// held with the presented token. Nothing was written. It matches
// pgfence.ErrLeaseLost and pgfence.ErrFenced.
type LeaseLostError struct {
	Lease     string
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

// NoTokenError is a write to a strict table that presented no token: a bug,
// not a lost lock. It matches pgfence.ErrNoToken, not pgfence.ErrFenced.
type NoTokenError struct {
	// Table is the quoted name of the table written, as pgx.Identifier's
	// Sanitize spells it: a builder's own table, or for an error classified
	// by [Classify], the table the trigger names ("schema"."table"; empty
	// when its schema or table name holds a dot, so the trigger's message
	// cannot be split).
	Table string
	// Current is the row's token, as the trigger reports it.
	Current int64
	// Err is the driver's error.
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

// Predicate returns the guard condition for hand-written SQL on a table
// without a trigger: Predicate("fence_token", 3, false) is
// `"fence_token" <= $3`, with strict `<`; an empty column is [DefaultColumn].
// Set the column from the same parameter. A stale write and a missing row
// are then both zero rows. It panics when param is not in 1..65535.
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

// Classify maps the error of a write to a table with a pgfence trigger:
// PF001 to a [*StaleTokenError], PF004 to a [*NoTokenError], PF003 to
// [ErrMalformedToken], each wrapping the driver's error (pgx's or lib/pq's).
// Any other error, and nil, is returned unchanged.
func Classify(err error) error {
	var st sqlStater
	if err == nil || !errors.As(err, &st) {
		return err
	}
	switch st.SQLState() {
	case SQLStateMalformedToken:
		return fmt.Errorf("%w: %w", ErrMalformedToken, err)
	case SQLStateNoToken:
		e := &NoTokenError{Err: err, Table: triggerTable(st)}
		if m := detailRE.FindStringSubmatch(field(st, 'D')); m != nil {
			e.Current, _ = strconv.ParseInt(m[2], 10, 64)
		}
		return e
	case SQLState:
	default:
		return install.WrapPermission(err, "", "")
	}
	stale := &StaleTokenError{Err: err}
	if m := detailRE.FindStringSubmatch(field(st, 'D')); m != nil {
		stale.Presented, _ = strconv.ParseInt(m[1], 10, 64)
		stale.Current, _ = strconv.ParseInt(m[2], 10, 64)
	}
	return stale
}

// sqlStater is a driver error with a SQLSTATE (pgx's and lib/pq's).
type sqlStater interface{ SQLState() string }

// field returns a driver error's field: pgx's by its struct field, lib/pq's
// by its one-letter code ('M' message, 'D' detail, 's' schema, 't' table).
func field(st sqlStater, code byte) string {
	switch e := st.(type) {
	case *pgconn.PgError:
		switch code {
		case 'M':
			return e.Message
		case 'D':
			return e.Detail
		case 's':
			return e.SchemaName
		case 't':
			return e.TableName
		}
	case interface{ Get(byte) string }:
		return e.Get(code)
	}
	return ""
}

// noTokenRE parses the message of the pgfence_guard triggers' PF004 errors
// (migrations/000001_baseline.up.sql): the operation, then the table's
// schema and name, unquoted, joined by a dot.
var noTokenRE = regexp.MustCompile(`(?s)^pgfence: [A-Z]+ on (.+) presents no fencing token \(strict mode; current [^)]*\)$`)

// triggerTable returns the quoted name of the table a trigger's error is
// about: from the error's schema and table fields when it carries them,
// otherwise from the PF004 message's "schema.table" when exactly one dot
// splits it (names holding dots are ambiguous there); "" when neither says.
func triggerTable(st sqlStater) string {
	if t := field(st, 't'); t != "" {
		if s := field(st, 's'); s != "" {
			return pgx.Identifier{s, t}.Sanitize()
		}
		return pgx.Identifier{t}.Sanitize()
	}
	m := noTokenRE.FindStringSubmatch(field(st, 'M'))
	if m == nil || strings.Count(m[1], ".") != 1 {
		return ""
	}
	schema, table, _ := strings.Cut(m[1], ".")
	if schema == "" || table == "" {
		return ""
	}
	return pgx.Identifier{schema, table}.Sanitize()
}

// detailRE parses the DETAIL of the pgfence_guard triggers' PF001 errors.
var detailRE = regexp.MustCompile(`^presented=(-?\d*) current=(-?\d*)$`)

// Check maps the result of a hand-written UPDATE or DELETE on a table with a
// pgfence trigger, in a transaction that called [Present]: the errors as
// [Classify] does, and no row affected to pgx.ErrNoRows; otherwise tag and
// nil.
func Check(tag pgconn.CommandTag, err error) (pgconn.CommandTag, error) {
	if err != nil {
		return tag, Classify(err)
	}
	if tag.RowsAffected() == 0 {
		return tag, fmt.Errorf("pgfence: %s affected no row: %w", tag.String(), pgx.ErrNoRows)
	}
	return tag, nil
}

// parseTable splits "table" or "schema.table" into an identifier.
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

// checkIdent validates a one- or two-part table identifier.
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

// checkName rejects an empty name, a NUL byte, or more than 63 bytes.
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
