package leasetable

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"time"

	"github.com/jackc/pgx/v5"
)

// LeaseInfo describes a lease row, as shown to operators by [Locker.List]
// and [Locker.Get]. Times are the database's.
type LeaseInfo struct {
	Name       string    // the lease name
	Owner      string    // the holder's owner id ([Config].Owner)
	Token      int64     // the holder's fencing token
	AcquiredAt time.Time // when the holder acquired it
	ExpiresAt  time.Time // when it expires unless renewed
}

// listSQL reads the current holders (%[1]s is the schema); it takes no
// locks. Operators name their schema, so none on the search_path can win.
const listSQL = `
SELECT name, owner, fence, acquired_at, expires_at FROM %[1]s.pgfence_leases
WHERE expires_at OPERATOR(pg_catalog.>) pg_catalog.now()
ORDER BY name`

// getSQL reads one lease's current holder; it takes no locks.
const getSQL = `
SELECT name, owner, fence, acquired_at, expires_at FROM %[1]s.pgfence_leases
WHERE name OPERATOR(pg_catalog.=) $1 AND expires_at OPERATOR(pg_catalog.>) pg_catalog.now()`

// List returns the leases currently held, of every owner, ordered by name.
func (k *Locker) List(ctx context.Context) ([]LeaseInfo, error) {
	if err := k.checkOpen(); err != nil {
		return nil, err
	}
	rows, err := k.pool.Query(ctx, k.sql.list)
	if err != nil {
		return nil, fmt.Errorf("pgfence: leasetable: list leases: %w", err)
	}
	infos, err := pgx.CollectRows(rows, scanInfo)
	if err != nil {
		return nil, fmt.Errorf("pgfence: leasetable: list leases: %w", err)
	}
	return infos, nil
}

// Get returns the current holder of the lease name, or of a permit's lease
// ([PermitName]); ok is false when nobody holds it.
func (k *Locker) Get(ctx context.Context, name string) (info LeaseInfo, ok bool, err error) {
	if err := k.checkOpen(); err != nil {
		return LeaseInfo{}, false, err
	}
	if err := checkForceName(name); err != nil {
		return LeaseInfo{}, false, err
	}
	rows, err := k.pool.Query(ctx, k.sql.get, name)
	if err != nil {
		return LeaseInfo{}, false, fmt.Errorf("pgfence: leasetable: get lease %q: %w", name, err)
	}
	info, err = pgx.CollectExactlyOneRow(rows, scanInfo)
	if errors.Is(err, pgx.ErrNoRows) {
		return LeaseInfo{}, false, nil
	}
	if err != nil {
		return LeaseInfo{}, false, fmt.Errorf("pgfence: leasetable: get lease %q: %w", name, err)
	}
	return info, true, nil
}

func scanInfo(row pgx.CollectableRow) (LeaseInfo, error) {
	var i LeaseInfo
	err := row.Scan(&i.Name, &i.Owner, &i.Token, &i.AcquiredAt, &i.ExpiresAt)
	return i, err
}

// ForcedRelease is the outcome of [Locker.ForceRelease], and one entry of
// the audit trail [Locker.ForcedReleases] reads.
type ForcedRelease struct {
	Name       string     // the lease name
	OldOwner   string     // the owner the row had before
	OldToken   int64      // the token the row had before
	WasHeld    bool       // whether that lease was still held
	Token      int64      // the fresh token the row carries now
	Reason     string     // the reason given
	ReleasedBy string     // the database session_user that released it
	ClientAddr netip.Addr // its client address; invalid for a Unix socket
	ReleasedAt time.Time  // when, on the database clock
}

// forceReleaseSQL force-releases a lease (%[1]s is the schema) through the
// SECURITY DEFINER pgfence_force_release, for operators only: it gives the
// row a fresh token, expires it, notifies waiters and records the release
// in pgfence_forced_releases.
const forceReleaseSQL = `SELECT old_owner, old_token, was_held, token FROM %[1]s.pgfence_force_release($1, $2)`

// listForcedSQL reads the audit trail of forced releases, newest first, at
// most $1 rows; it takes no locks.
const listForcedSQL = `
SELECT name, old_owner, old_token, was_held, new_token, reason, released_by::pg_catalog.text,
       client_addr, released_at
FROM %[1]s.pgfence_forced_releases
ORDER BY id DESC
LIMIT $1`

// ErrNoLease is returned by [Locker.ForceRelease] when the name has no row.
var ErrNoLease = errors.New("pgfence: leasetable: no lease row with that name")

// ForceRelease ends the lease name (a permit's too: see [PermitName])
// whoever holds it, for operators: its row
// gets a fresh token and expires now, so the holder's renewals and
// lease-checked writes fail and its fenced writes are rejected. The release
// is recorded on the server with reason (at most [MaxNameLength] bytes).
// The role needs pgfence's operator grant.
//
// It returns what the row held before, [ErrNoLease] when the name has no
// row, and database errors wrapped.
func (k *Locker) ForceRelease(ctx context.Context, name, reason string) (ForcedRelease, error) {
	if err := k.checkOpen(); err != nil {
		return ForcedRelease{}, err
	}
	if err := checkForceName(name); err != nil {
		return ForcedRelease{}, err
	}
	if len(reason) > MaxNameLength {
		return ForcedRelease{}, fmt.Errorf("pgfence: leasetable: force release reason is %d bytes long; at most %d are allowed", len(reason), MaxNameLength)
	}
	r := ForcedRelease{Name: name, Reason: reason}
	err := k.pool.QueryRow(ctx, k.sql.forceRelease, name, reason).Scan(&r.OldOwner, &r.OldToken, &r.WasHeld, &r.Token)
	if errors.Is(err, pgx.ErrNoRows) {
		return ForcedRelease{}, fmt.Errorf("pgfence: leasetable: force release %q: %w", name, ErrNoLease)
	}
	if err != nil {
		return ForcedRelease{}, fmt.Errorf("pgfence: leasetable: force release %q: %w", name, err)
	}
	k.cfg.Logger.WarnContext(ctx, "pgfence: leasetable: lease force-released", "lease", name,
		"old_owner", r.OldOwner, "old_token", r.OldToken, "was_held", r.WasHeld, "token", r.Token, "reason", reason)
	return r, nil
}

// ForcedReleases returns the newest limit forced releases recorded on the
// server, newest first. The role needs pgfence's operator grant.
func (k *Locker) ForcedReleases(ctx context.Context, limit int) ([]ForcedRelease, error) {
	if err := k.checkOpen(); err != nil {
		return nil, err
	}
	if limit <= 0 {
		return nil, fmt.Errorf("pgfence: leasetable: ForcedReleases: limit is %d; it must be positive", limit)
	}
	rows, err := k.pool.Query(ctx, k.sql.listForced, limit)
	if err != nil {
		return nil, fmt.Errorf("pgfence: leasetable: list forced releases: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (ForcedRelease, error) {
		var (
			r      ForcedRelease
			reason *string
			addr   *netip.Prefix
		)
		err := row.Scan(&r.Name, &r.OldOwner, &r.OldToken, &r.WasHeld, &r.Token, &reason, &r.ReleasedBy, &addr, &r.ReleasedAt)
		if reason != nil {
			r.Reason = *reason
		}
		if addr != nil {
			r.ClientAddr = addr.Addr()
		}
		return r, err
	})
	if err != nil {
		return nil, fmt.Errorf("pgfence: leasetable: list forced releases: %w", err)
	}
	return out, nil
}
