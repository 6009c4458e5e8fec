package leasetable

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/pgfence/pgfence/internal/install"
)

// SemaphoreInfo describes a semaphore with a permit held, on the database
// clock.
type SemaphoreInfo struct {
	Name    string // the semaphore's name
	Permits int    // its number of permits
	InUse   int    // permits held now

	// Waiting is the number of database sessions registered to be woken
	// when a permit of the semaphore is released: one per Locker (of this
	// install, in this database) with at least one AcquirePermit call
	// waiting for it, however many calls wait there. It counts Lockers,
	// not calls (a Locker's calls are in its [pgfence.Stats].Waiting). A
	// Locker stays registered for about a second after its last call
	// stopped waiting; a Locker without LISTEN ([Config].DisableListen, or
	// while its LISTEN connection is down) waits unregistered, so
	// uncounted. The registration is a shared advisory lock on a 32-bit
	// key derived from the semaphore's name ([InterestClassID]), so
	// waiters for another name whose key collides with it, a chance of 1
	// in 2^32 per pair of names, are counted too.
	Waiting int
}

// semaphoresSQL lists the semaphores with a permit held (%[1]s is the
// schema), with the number of sessions that hold the semaphore's interest
// key shared in the current database: (InterestClassID, the first 4 bytes
// of sha256(notify key || 0x01 || name || chr(31))), as
// pgfence_notify_waiters computes it; pg_locks shows the second half as an
// unsigned oid. It reads, and locks nothing.
const semaphoresSQL = `
WITH w AS (
    SELECT l.objid, pg_catalog.count(DISTINCT l.pid) AS n
    FROM pg_catalog.pg_locks l
    WHERE l.locktype OPERATOR(pg_catalog.=) 'advisory'
      AND l.database OPERATOR(pg_catalog.=) (SELECT d.oid FROM pg_catalog.pg_database d
                                             WHERE d.datname OPERATOR(pg_catalog.=) pg_catalog.current_database())
      AND l.classid OPERATOR(pg_catalog.=) 1885824620::pg_catalog.oid
      AND l.objsubid OPERATOR(pg_catalog.=) 2
      AND l.mode OPERATOR(pg_catalog.=) 'ShareLock'
      AND l.granted
    GROUP BY l.objid)
SELECT s.name, s.permits, u.in_use::pg_catalog.int4, COALESCE(w.n, 0)::pg_catalog.int4
FROM %[1]s.pgfence_semaphores s
CROSS JOIN LATERAL (
    SELECT pg_catalog.count(*) AS in_use FROM %[1]s.pgfence_leases p
    WHERE p.name OPERATOR(pg_catalog.=) ANY (ARRAY(
            SELECT s.name OPERATOR(pg_catalog.||) pg_catalog.chr(31) OPERATOR(pg_catalog.||) g.slot::pg_catalog.text
            FROM pg_catalog.generate_series(0, s.permits OPERATOR(pg_catalog.-) 1) g(slot)))
      AND p.expires_at OPERATOR(pg_catalog.>) pg_catalog.now()) u
LEFT JOIN LATERAL (
    SELECT pg_catalog.sha256(k.key OPERATOR(pg_catalog.||) pg_catalog.decode('01', 'hex')
               OPERATOR(pg_catalog.||) pg_catalog.convert_to(s.name OPERATOR(pg_catalog.||) pg_catalog.chr(31), 'UTF8')) AS h
    FROM %[1]s.pgfence_notify_key k) t ON true
LEFT JOIN w ON w.objid OPERATOR(pg_catalog.=) (
    (pg_catalog.get_byte(t.h, 0)::pg_catalog.int8 OPERATOR(pg_catalog.<<) 24) OPERATOR(pg_catalog.|)
    (pg_catalog.get_byte(t.h, 1)::pg_catalog.int8 OPERATOR(pg_catalog.<<) 16) OPERATOR(pg_catalog.|)
    (pg_catalog.get_byte(t.h, 2)::pg_catalog.int8 OPERATOR(pg_catalog.<<) 8) OPERATOR(pg_catalog.|)
    pg_catalog.get_byte(t.h, 3)::pg_catalog.int8)::pg_catalog.oid
WHERE u.in_use OPERATOR(pg_catalog.>) 0
ORDER BY s.name`

// Semaphores returns the semaphores with at least one permit held, by
// name, each with its number of permits, those held, and the number of
// Lockers with a caller waiting for one ([SemaphoreInfo].Waiting, read
// from pg_locks). A semaphore with waiters but no permit held (briefly,
// while a freed permit is taken again) is not listed. It reads, in one
// statement, and locks nothing. It returns database errors wrapped.
func (k *Locker) Semaphores(ctx context.Context) ([]SemaphoreInfo, error) {
	rows, err := k.pool.Query(ctx, k.sql.semaphores)
	if err != nil {
		return nil, fmt.Errorf("pgfence: leasetable: list semaphores: %w", install.WrapPermission(err, "", k.cfg.Schema))
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (SemaphoreInfo, error) {
		var s SemaphoreInfo
		return s, r.Scan(&s.Name, &s.Permits, &s.InUse, &s.Waiting)
	})
	if err != nil {
		return nil, fmt.Errorf("pgfence: leasetable: list semaphores: %w", install.WrapPermission(err, "", k.cfg.Schema))
	}
	return out, nil
}
