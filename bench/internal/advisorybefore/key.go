package advisory

import (
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"strconv"
)

// Key identifies an advisory lock: one signed 64-bit integer, the argument
// of PostgreSQL's single-argument pg_advisory_lock(bigint) family. Build one
// with [ID] or [Name]. The zero Key is ID(0).
//
// Keys live in one space per database: ID(k) and a Name that hashes to k are
// the same lock, and so is any other client calling pg_advisory_lock(k) on
// the same database. The two-argument form pg_advisory_lock(int, int) is a
// different space and never conflicts with a Key; waiting Lock calls use
// the part of it whose first argument is [InterestClassID].
type Key struct {
	id    int64
	name  string
	named bool
}

// ID returns the Key for id, used as given.
//
// golang-migrate's PostgreSQL driver locks keys in [0, 2^32) (a CRC-32 of
// the database name times a salt, truncated to 32 bits); choose IDs outside
// that range, or Name keys, if the database is also migrated with it.
func ID(id int64) Key { return Key{id: id} }

// Name returns the Key for name: the first 8 bytes of the SHA-256 digest of
// name's bytes, read as a big-endian signed 64-bit integer; when the upper 32
// bits of that integer are all zero (a chance of 1 in 2^32), bit 62 is set
// so that no Name key falls in [0, 2^32), the range golang-migrate's own
// lock uses. [NameKeySQL] computes the same key in SQL, so services in other
// languages can take the same lock.
//
// Distinct names collide (map to the same key, and so exclude each other)
// with a chance of about n²/2^65 among n names in use: one in 37 million for
// a million names. A collision never lets two holders share a lock; it only
// makes two unrelated names wait for each other.
//
// For the SQL expression to agree, name must be valid UTF-8 without NUL
// bytes (PostgreSQL text holds nothing else). An empty name is not a valid key: the lock
// methods reject it.
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

// NameKeySQL is a PostgreSQL query that computes Name(x).Int64() for the
// text parameter $1, for use from SQL or from clients in other languages.
// For example, to take the same lock in a transaction from psql:
//
//	SELECT pg_advisory_xact_lock(k) FROM (<NameKeySQL with $1 = 'account:42'>) AS n(k);
//
// It needs PostgreSQL 11 or later (sha256). Its functions and operators are
// named in pg_catalog, so no function or operator that another role created
// in a schema on the caller's search_path can take their place.
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
