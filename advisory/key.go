package advisory

import (
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"strconv"
)

// Key identifies an advisory lock: the argument of PostgreSQL's
// pg_advisory_lock(bigint). Build one with [ID] or [Name]; the zero Key is
// ID(0). Keys live in one space per database, shared with every other
// client of pg_advisory_lock(bigint).
type Key struct {
	id    int64
	name  string
	named bool
}

// ID returns the Key for id, used as given. golang-migrate locks keys in
// [0, 2^32): choose IDs outside that range if it migrates the database.
func ID(id int64) Key { return Key{id: id} }

// Name returns the Key for name: the first 8 bytes of name's SHA-256
// digest as a big-endian int64, with bit 62 set when the upper 32 bits are
// zero, so no Name key falls in golang-migrate's range. [NameKeySQL]
// computes the same key in SQL; for it to agree, name must be valid UTF-8
// without NUL. Distinct names collide with a chance of about n²/2^65 among
// n names, which only makes them exclude each other. The empty name is
// rejected by the lock methods.
func Name(name string) Key { return Key{id: nameKey(name), name: name, named: true} }

// nameTopBit is set on a Name key whose upper 32 bits come out zero.
const nameTopBit = int64(1) << 62

// nameKey is the hash behind Name; NameKeySQL is its SQL twin.
func nameKey(name string) int64 {
	sum := sha256.Sum256([]byte(name))
	return remapNameKey(int64(binary.BigEndian.Uint64(sum[:8])))
}

// remapNameKey moves h out of [0, 2^32).
func remapNameKey(h int64) int64 {
	if h>>32 == 0 {
		return h | nameTopBit
	}
	return h
}

// NameKeySQL is a query that computes Name($1).Int64() for the text
// parameter $1, for use from SQL or other languages (PostgreSQL 11 or
// later). It names every built-in it calls in pg_catalog.
const NameKeySQL = `SELECT CASE WHEN (h OPERATOR(pg_catalog.>>) 32) OPERATOR(pg_catalog.=) 0 THEN h OPERATOR(pg_catalog.|) 4611686018427387904 ELSE h END ` +
	`FROM (SELECT ('x' OPERATOR(pg_catalog.||) pg_catalog.encode(pg_catalog.substr(pg_catalog.sha256(pg_catalog.convert_to($1::pg_catalog.text, 'UTF8')), 1, 8), 'hex'))::pg_catalog.bit(64)::pg_catalog.int8 AS h) AS s`

// Int64 returns the key as passed to pg_advisory_lock(bigint).
func (k Key) Int64() int64 { return k.id }

// String returns the key for messages and logs: the number for an ID key,
// the quoted name and its number for a Name key.
func (k Key) String() string {
	if k.named {
		return fmt.Sprintf("%q (%d)", k.name, k.id)
	}
	return strconv.FormatInt(k.id, 10)
}

// displayName is the key as a Lease names it: the name of a Name key, the
// decimal number of an ID key.
func (k Key) displayName() string {
	if k.named {
		return k.name
	}
	return strconv.FormatInt(k.id, 10)
}

// markName identifies the key's lock among a Locker's held locks: ID(n)
// and a Name hashing to n are the same lock.
func (k Key) markName() string { return strconv.FormatInt(k.id, 10) }

// validate reports a key that cannot be locked.
func (k Key) validate() error {
	if k.named && k.name == "" {
		return fmt.Errorf("pgfence: advisory: empty lock name")
	}
	return nil
}
