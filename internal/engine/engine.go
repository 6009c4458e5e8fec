// Package engine tells which server a connection reached and whether
// pgfence's guarantees hold there: the safety gate of the Lockers' New and
// the server checks of the doctor. See docs/doctor.md for the reasons.
package engine

import (
	"context"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/pgfence/pgfence"
)

// Kind names a server engine that speaks PostgreSQL's protocol.
type Kind string

// The engines told apart. PostgreSQL and Neon (PostgreSQL whose computes
// scale to zero, ending every session) give pgfence's guarantees.
const (
	PostgreSQL  Kind = "PostgreSQL"
	Neon        Kind = "Neon"
	YugabyteDB  Kind = "YugabyteDB"
	CockroachDB Kind = "CockroachDB"
)

// Identify names the engine from version() and the names of the settings
// that start with "yb_" or "neon." or are "crdb_version" (documented
// signatures: YugabyteDB's version() reads "PostgreSQL 11.2-YB-2.20.1.0-b0
// on ..." and it has yb_* settings; CockroachDB's reads "CockroachDB CCL
// v23.2.0 (...)" and it has crdb_version; Neon's computes load the neon
// extension, whose settings are neon.*).
func Identify(version string, settings []string) Kind {
	switch {
	case strings.HasPrefix(version, "CockroachDB"):
		return CockroachDB
	case strings.Contains(version, "-YB-"):
		return YugabyteDB
	}
	for _, s := range settings {
		switch {
		case s == "crdb_version":
			return CockroachDB
		case strings.HasPrefix(s, "yb_"):
			return YugabyteDB
		case strings.HasPrefix(s, "neon."):
			return Neon
		}
	}
	return PostgreSQL
}

// Standby is a walsender of the primary that serves a physical standby.
type Standby struct {
	// Name is its application_name; empty when the role may not see it.
	Name string
	// SyncState is pg_stat_replication.sync_state ("sync", "quorum",
	// "potential", "async"); empty when the role may not see it (it needs
	// pg_read_all_stats).
	SyncState string
}

// Facts is what Read found out about a server.
type Facts struct {
	// Version is version().
	Version string
	// Kind is the engine.
	Kind Kind
	// InRecovery is pg_is_in_recovery(): a standby or a reader endpoint.
	InRecovery bool
	// SyncNames is synchronous_standby_names.
	SyncNames string
	// Standbys are the physical standbys streaming from it.
	Standbys []Standby
}

// Source runs Read's statements; pgfence.DB and pgx.Tx satisfy it. Tests
// of engines that cannot run here inject one.
type Source interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// identifySQL reads version() and the names of the settings that tell
// YugabyteDB and CockroachDB apart. No lock, no privilege needed.
const identifySQL = `SELECT pg_catalog.version(), ARRAY(SELECT s.name::pg_catalog.text FROM pg_catalog.pg_settings s ` +
	`WHERE s.name OPERATOR(pg_catalog.~~) 'yb\_%' OR s.name OPERATOR(pg_catalog.~~) 'neon.%' OR s.name OPERATOR(pg_catalog.=) 'crdb_version' ORDER BY 1 LIMIT 3)`

// replicationSQL reads whether the server is in recovery,
// synchronous_standby_names, and its physical standbys (walsenders that
// serve no logical slot) with their sync_state, NULL when the role lacks
// pg_read_all_stats. No lock.
const replicationSQL = `SELECT pg_catalog.pg_is_in_recovery(), pg_catalog.current_setting('synchronous_standby_names'), ` +
	`ARRAY(SELECT COALESCE(r.application_name, '') FROM pg_catalog.pg_stat_replication r WHERE ` + physical + ` ORDER BY r.pid), ` +
	`ARRAY(SELECT COALESCE(r.sync_state, '') FROM pg_catalog.pg_stat_replication r WHERE ` + physical + ` ORDER BY r.pid)`

const physical = `NOT EXISTS (SELECT FROM pg_catalog.pg_replication_slots s ` +
	`WHERE s.active_pid OPERATOR(pg_catalog.=) r.pid AND s.slot_type OPERATOR(pg_catalog.=) 'logical')`

// Read finds the facts in at most two round trips bounded by ctx: the
// engine first, and for PostgreSQL its recovery and replication state.
func Read(ctx context.Context, db Source) (Facts, error) {
	var f Facts
	var settings []string
	if err := db.QueryRow(ctx, identifySQL).Scan(&f.Version, &settings); err != nil {
		return f, fmt.Errorf("identify the server: %w", err)
	}
	f.Kind = Identify(f.Version, settings)
	if f.Kind != PostgreSQL && f.Kind != Neon {
		return f, nil
	}
	var names, states []string
	if err := db.QueryRow(ctx, replicationSQL).Scan(&f.InRecovery, &f.SyncNames, &names, &states); err != nil {
		return f, fmt.Errorf("read the server's replication state: %w", err)
	}
	for i := range names {
		f.Standbys = append(f.Standbys, Standby{Name: names[i], SyncState: states[i]})
	}
	return f, nil
}

// Refusal returns an error matching [pgfence.ErrUnsafeServer] when pgfence
// must not run on the server, else nil.
func (f Facts) Refusal() error {
	if err := f.EngineRefusal(); err != nil {
		return err
	}
	if f.InRecovery {
		return fmt.Errorf("%w: the server is a standby in recovery (a replica or reader endpoint): connect to the primary",
			pgfence.ErrUnsafeServer)
	}
	return nil
}

// EngineRefusal is the part of Refusal that depends on the engine alone,
// not on the server's role (primary or standby).
func (f Facts) EngineRefusal() error {
	switch f.Kind {
	case YugabyteDB:
		return fmt.Errorf("%w: YugabyteDB (%s): it caches sequence values per connection whatever CACHE says "+
			"(ysql_sequence_cache_minval), so tokens come out of order and stale writes would land", pgfence.ErrUnsafeServer, f.Version)
	case CockroachDB:
		return fmt.Errorf("%w: CockroachDB (%s): its advisory lock functions do not exclude and its sequences are not ordered by commit",
			pgfence.ErrUnsafeServer, f.Version)
	}
	return nil
}

// Warning is a weakened guarantee that Warnings found.
type Warning struct {
	// Reason is a short key, as pgfence.ServerWarning's.
	Reason string
	// Detail says what was found and what to do.
	Detail string
}

// Warnings returns the weakened guarantees of a server that Refusal
// accepts: standbys of which none is synchronous, so that any failover
// promotes one without the last tokens and writes (docs/ha.md). A standby
// is asynchronous when pg_stat_replication says so, or when
// synchronous_standby_names is empty (which a role that cannot read
// sync_state still sees). With a synchronous standby, asynchronous ones
// are read replicas that the failover manager must never promote (Patroni's
// synchronous_mode does not).
func (f Facts) Warnings() []Warning {
	var async []string
	synced := false
	for _, s := range f.Standbys {
		switch {
		case s.SyncState == "sync" || s.SyncState == "quorum":
			synced = true
		case s.SyncState == "" && strings.TrimSpace(f.SyncNames) != "":
			synced = true // not visible to the role, and some standby may be
		default:
			async = append(async, fmt.Sprintf("%q", s.Name))
		}
	}
	if synced || len(async) == 0 {
		return nil
	}
	return []Warning{{Reason: "async_standby", Detail: fmt.Sprintf("no synchronous standby, %d asynchronous (%s): a failover to one can reissue tokens "+
		"and lose acknowledged writes; list them in synchronous_standby_names (Patroni: synchronous_mode), or fail over only to synchronous standbys (docs/ha.md)",
		len(async), strings.Join(async, ", "))}}
}

// Gate reads the facts and returns Refusal's error, or the warnings of a
// server that may be used; a statement's error is returned wrapped.
func Gate(ctx context.Context, db Source) ([]Warning, error) {
	f, err := Read(ctx, db)
	if err != nil {
		return nil, err
	}
	if err := f.Refusal(); err != nil {
		return nil, err
	}
	return f.Warnings(), nil
}
