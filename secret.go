package pgfence

import (
	"database/sql/driver"
	"errors"
	"log/slog"
)

// Secret proves that its holder acquired a lease-table lease: the database
// returns it only to the acquiring call and keeps its SHA-256. Renew,
// release, lease-checked writes and proclaiming a leader require it.
// Printed, logged or marshalled it shows "[secret]"; the zero Secret
// proves nothing.
type Secret struct{ s string }

// NewSecret returns the Secret whose text [Secret.Reveal] returned.
func NewSecret(s string) Secret { return Secret{s} }

// IsZero reports whether s is the zero Secret.
func (s Secret) IsZero() bool { return s.s == "" }

// Reveal returns the secret's text, for code that acts on the lease.
func (s Secret) Reveal() string { return s.s }

// Value implements [driver.Valuer]; the zero Secret is an error.
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

// LogValue returns "[secret]".
func (Secret) LogValue() slog.Value { return slog.StringValue("[secret]") }

// MarshalText returns "[secret]".
func (Secret) MarshalText() ([]byte, error) { return []byte("[secret]"), nil }
