package pgfence

import (
	"database/sql/driver"
	"errors"
	"log/slog"
)

// Secret proves that its holder acquired a lease-table lease: the database
// draws it for each acquisition, returns it only to the acquiring call and
// keeps only its SHA-256, so no role can read it back. Every function that
// acts on a held lease (renew, release, lease-checked writes, proclaiming a
// leader) requires it; the fencing token stays public.
//
// Printing, logging or marshalling a Secret shows "[secret]". It is passed
// to SQL as a text parameter through [driver.Valuer], which pgx and
// database/sql both use. The zero Secret is empty and proves nothing.
type Secret struct{ s string }

// NewSecret returns the Secret whose text is s, as [Secret.Reveal] returned
// it: for a process that received it from the holder.
func NewSecret(s string) Secret { return Secret{s} }

// IsZero reports whether s is the zero Secret.
func (s Secret) IsZero() bool { return s.s == "" }

// Reveal returns the secret's text, to hand it to code that must act on the
// lease (a SQL statement built by hand, another process of the holder's).
func (s Secret) Reveal() string { return s.s }

// Value returns the secret's text for a SQL parameter; the zero Secret is
// an error, so that a statement never runs with an empty proof.
func (s Secret) Value() (driver.Value, error) {
	if s.s == "" {
		return nil, errZeroSecret
	}
	return s.s, nil
}

var errZeroSecret = errors.New("pgfence: the zero Secret proves no lease")

// String returns "[secret]".
func (Secret) String() string { return "[secret]" }

// GoString returns "[secret]".
func (Secret) GoString() string { return "[secret]" }

// LogValue returns "[secret]" for log/slog.
func (Secret) LogValue() slog.Value { return slog.StringValue("[secret]") }

// MarshalText returns "[secret]".
func (Secret) MarshalText() ([]byte, error) { return []byte("[secret]"), nil }
