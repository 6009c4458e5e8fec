package notifier

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"strconv"
	"strings"

	"github.com/pgfence/pgfence"
	"github.com/pgfence/pgfence/internal/install"
)

// Key is an install's notification key (pgfence_notify_key). The payloads
// of pgfence's notifications (pgfence_lease_released, pgfence_leader) are
// tag:token:mac under it, so that a role without pgfence's grant neither
// learns lease names from them nor forges one.
type Key []byte

// LoadKey reads the key of the install in the schema quoted (already quoted).
func LoadKey(ctx context.Context, db pgfence.DB, quoted string) (Key, error) {
	var k []byte
	if err := db.QueryRow(ctx, "SELECT key FROM "+quoted+".pgfence_notify_key").Scan(&k); err != nil {
		return nil, fmt.Errorf("read %s.pgfence_notify_key: %w", quoted, install.WrapPermission(err, "", ""))
	}
	return k, nil
}

// Tag returns the tag that stands for name in payloads: the first 16 bytes
// of sha256(key || 0x01 || name), in hex.
func (k Key) Tag(name string) string {
	h := sha256.New()
	h.Write(k)
	h.Write([]byte{1})
	h.Write([]byte(name))
	return hex.EncodeToString(h.Sum(nil)[:16])
}

// InterestID returns the second half of name's interest key, which a
// waiter locks shared so that a lease-table release notifies it
// (pgfence_notify_waiters): the first 4 bytes of sha256(key || 0x01 ||
// name), the tag's, as a big-endian int32.
func (k Key) InterestID(name string) int32 {
	h := sha256.New()
	h.Write(k)
	h.Write([]byte{1})
	h.Write([]byte(name))
	return int32(binary.BigEndian.Uint32(h.Sum(nil)[:4]))
}

// mac is the first 16 bytes of Envelope(k, 2, msg).
func (k Key) mac(msg string) []byte { return Envelope(k, 2, msg)[:16] }

// Envelope returns sha256(key || sha256(key || domain || msg)): the MAC of
// the notification payloads (domain 2) and of a permit grant's (domain 3,
// with the claim's grant key), as the database computes them.
func Envelope(key []byte, domain byte, msg string) []byte {
	in := sha256.New()
	in.Write(key)
	in.Write([]byte{domain})
	in.Write([]byte(msg))
	out := sha256.New()
	out.Write(key)
	out.Write(in.Sum(nil))
	return out.Sum(nil)
}

// Payload returns the payload announcing name's token, as the database's
// pgfence_notify_payload writes it.
func (k Key) Payload(name string, token int64) string {
	msg := k.Tag(name) + ":" + strconv.FormatInt(token, 10)
	return msg + ":" + hex.EncodeToString(k.mac(msg))
}

// Verify checks payload's MAC and returns its tag and token; ok is false
// for a payload that was not written with k.
func (k Key) Verify(payload string) (tag string, token int64, ok bool) {
	i := strings.LastIndexByte(payload, ':')
	if i < 0 || len(k) == 0 {
		return "", 0, false
	}
	msg, sum := payload[:i], payload[i+1:]
	got, err := hex.DecodeString(sum)
	if err != nil || subtle.ConstantTimeCompare(got, k.mac(msg)) != 1 {
		return "", 0, false
	}
	j := strings.IndexByte(msg, ':')
	if j < 0 {
		return "", 0, false
	}
	token, err = strconv.ParseInt(msg[j+1:], 10, 64)
	if err != nil {
		return "", 0, false
	}
	return msg[:j], token, true
}
